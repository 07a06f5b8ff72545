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
//
// Checksums: the writer records (unless told not to, for byte-exact files) each
// tensor's CRC-32 (zlib's) in the metadata, as
// "crc32.NAME": "8 hex digits" (the format allows any string metadata, so other readers
// see an ordinary entry), and the reader checks every tensor that has one: a flipped bit
// in a tensor's bytes is refused, naming the file and the tensor, instead of loaded. A
// file without them (written by another tool) loads as before. The "crc32." keys are the
// file's own: a caller's metadata may not use them, and the metadata read back does not
// show them.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/memory.hpp"
#include "common/tensor.hpp"

namespace bigbatch {

/// Whether save_safetensors records the tensors' checksums.
enum class TensorChecksums {
  crc32,  ///< "crc32.NAME" in the metadata for every tensor (the default)
  none,   ///< nothing added: the reference implementation's bytes exactly
};

/// Writes `tensors` (any device; CUDA tensors are copied to the host), their checksums
/// and the string-to-string `metadata` to `path`, atomically. Names must be unique,
/// non-empty and not "__metadata__"; no metadata key may start with "crc32.". Throws
/// std::runtime_error when the file cannot be written.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      TensorChecksums checksums = TensorChecksums::crc32);

/// Whether load_safetensors takes a tensor whose checksum the file does not record.
enum class UncheckedTensors {
  allowed,  ///< loaded as it is: a file another tool wrote (the default)
  refused,  ///< std::runtime_error naming it: a file only bigbatch writes (a snapshot)
};

/// Reads every tensor of a safetensors file into CPU tensors tagged `category`
/// (move them with Tensor::to), checking each recorded checksum. Throws
/// std::runtime_error naming the file and the rule it breaks (or the damaged tensor).
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, MemoryCategory category = MemoryCategory::parameters,
    UncheckedTensors unchecked = UncheckedTensors::allowed);

/// zlib's CRC-32 of `count` bytes as the files record a tensor's: 8 lowercase hex digits
/// (for a caller that checksums what it keeps in the metadata).
std::string crc32_text(const void* bytes, std::size_t count);

/// The "__metadata__" map of a safetensors file, less the checksums (empty when it has
/// nothing else). Reads and validates the header only: the tensors' bytes are not checked.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace bigbatch
