"""Reads and writes safetensors files of float32 tensors with numpy alone, for the scripts
that hand `bigbatch train --init` its parameters and read its `--save` back
(compare_with_pytorch.py, compare_with_keras.py). The format: the length of a JSON header
as a little-endian u64, the header (each tensor's dtype, shape and byte range in the
data), then the data.
"""
import json
import pathlib
import struct

import numpy as np


def write(path, arrays):
    """{name: array} as F32 tensors, in the dict's order."""
    header, chunks, offset = {}, [], 0
    for name, array in arrays.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(np.shape(array)),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format allows padding with spaces
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


def read(path):
    """{name: float32 array} of a file of F32 tensors (ValueError for any other dtype)."""
    blob = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    body = blob[8 + length:]
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {entry['dtype']}, expected F32")
        begin, end = entry["data_offsets"]
        arrays[name] = np.frombuffer(body[begin:end], dtype="<f4").reshape(entry["shape"]).copy()
    return arrays
