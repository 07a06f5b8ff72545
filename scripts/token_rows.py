#!/usr/bin/python3
"""The sequences common/data/text_corpus.hpp makes of a text file, as the rows of a
`--data tokens:` file: documents between "%" lines (fortune(6)'s format; the blank-line
fallback is not needed here), every tenth document held out, each cut into pieces of up to
T + 1 bytes that share their boundary byte, each piece a row of T + 1 tokens padded with -1.
A file of the training rows trains the bits `--data text:FILE` trains
(tests/cli/check_gpt_train.sh); scripts/gpt_fortunes_vs_pytorch.py gives the same rows
to PyTorch. Standard library only.

Usage: scripts/token_rows.py TEXT_FILE T OUT.npy [training|held-out]   (default training)
"""
import struct
import sys

PADDING = -1


def documents_of(path):
    """text_corpus.hpp's split_documents for fortune(6)'s format: "%" lines separate
    documents, and documents of fewer than two bytes are dropped."""
    with open(path, "rb") as text_file:
        text = text_file.read().decode("latin-1")
    documents = [""]
    for line in text.splitlines(keepends=True):
        if line in ("%", "%\n"):
            documents.append("")
        else:
            documents[-1] += line
    return [d for d in documents if len(d) >= 2]


def split(documents):
    """(training, held out): every tenth document held out, as `--data text:` holds it out."""
    return ([d for i, d in enumerate(documents) if i % 10 != 9],
            [d for i, d in enumerate(documents) if i % 10 == 9])


def rows_of(documents, T):
    """Each document's pieces of up to T + 1 bytes sharing their boundary byte, as rows of
    T + 1 tokens padded with PADDING."""
    rows = []
    for d in documents:
        for start in range(0, len(d) - 1, T):
            piece = [ord(c) for c in d[start:start + T + 1]]
            rows.append(piece + [PADDING] * (T + 1 - len(piece)))
    return rows


def write_npy(path, rows):
    """Rows of equal length as a version 1.0 .npy file of int32."""
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (
        len(rows), len(rows[0]))
    header += " " * (-(len(header) + 11) % 64) + "\n"  # the data starts at a multiple of 64
    with open(path, "wb") as out:
        out.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        out.write(b"".join(struct.pack("<i", v) for row in rows for v in row))


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] not in ("training", "held-out")):
        sys.exit(__doc__.strip().splitlines()[-1])
    training, held_out = split(documents_of(argv[0]))
    rows = rows_of(held_out if argv[3:] == ["held-out"] else training, int(argv[1]))
    write_npy(argv[2], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
