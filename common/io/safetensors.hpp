// safetensors.hpp: parameters and training snapshots in Hugging Face's safetensors
// format, so that other tools (PyTorch, NumPy, the safetensors library) can read them.
//
// The writer lays the tensors out as the reference implementation does (every tensor at a
// multiple of its element size) and writes atomically: `path + ".tmp"`, fsynced, renamed
// over `path`, then the folder fsynced, so an interrupted save leaves the previous file
// intact and a finished one survives a crash. Unless told not to, it records each tensor's
// CRC-32 in the metadata as "crc32.NAME", and the reader checks every tensor that has one;
// those keys are the file's own (refused in a caller's metadata, not shown in the metadata
// read back). The reader checks what the reference implementation checks, saying which
// rule a file broke, and loads F32, F16, F64 and I32 tensors (other dtypes refused by name).
//
// Why and how: docs/internals.md#commoniosafetensorshpp
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
