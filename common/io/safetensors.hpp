// safetensors.hpp: parameters and training snapshots in Hugging Face's safetensors
// format, so that other tools (PyTorch, NumPy, the safetensors library) can read them.
//
// Layout (https://github.com/huggingface/safetensors, "Format"):
//
//   8 bytes   N, the header length, unsigned 64-bit little-endian
//   N bytes   a UTF-8 JSON object:
//               {"__metadata__": {"key": "value", ...},                  (optional)
//                "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//             padded at the end with spaces so that N is a multiple of 8
//   the rest  the byte buffer: each tensor's little-endian, row-major elements at
//             [begin, end) counted from the start of the buffer
//
// The writer lays the tensors out as the reference implementation does: by decreasing
// element size, then by name, so that every tensor starts at a multiple of its element
// size (8-byte header padding + sizes ordered large to small) and a memory-mapped
// reader can view it in place. It writes to `path + ".tmp"`, fsyncs it and renames it
// over `path` only when complete, then fsyncs the folder: an interrupted save leaves the
// previous file intact, and a finished one survives a crash.
//
// The reader checks what the reference implementation checks, and says which rule a
// file broke: the header fits in the file and is at most 100 MB, is a JSON object
// (parsed by nlohmann-json, nested at most 64 deep) without duplicate keys, every dtype is known and every data_offsets range holds
// exactly shape x element size bytes, the ranges lie inside the buffer, do not overlap,
// leave no gaps, and cover the buffer to its last byte. Tensors of dtypes F32, F16, F64
// and I32 are loaded (other dtypes, e.g. BF16, are refused by name).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/memory.hpp"
#include "common/tensor.hpp"

namespace bigbatch {

/// Writes `tensors` (any device; CUDA tensors are copied to the host) and the
/// string-to-string `metadata` to `path`, atomically. Names must be unique, non-empty
/// and not "__metadata__". Throws std::runtime_error when the file cannot be written.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file into CPU tensors tagged `category`
/// (move them with Tensor::to). Throws std::runtime_error naming the file and the
/// rule it breaks.
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, MemoryCategory category = MemoryCategory::parameters);

/// The "__metadata__" map of a safetensors file (empty when it has none). Reads and
/// validates the header only.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace bigbatch
