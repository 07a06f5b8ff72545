#include "common/io/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string_view>

#include <zlib.h>

#include "common/io/file_format_reading.hpp"
#include "common/json.hpp"

namespace bigbatch {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied as it is");

// The reference implementation refuses headers above 100 MB (a file could otherwise
// make the reader parse gigabytes of JSON).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::size_t kHeaderAlignment = 8;
constexpr const char* kMetadataKey = "__metadata__";
constexpr int kMaxDepth = 64;  // a real header nests 3 levels; deeper is an attack
constexpr std::string_view kChecksumPrefix = "crc32.";  // + tensor name: 8 hex digits

using io_detail::fail;

// ---- dtypes ---------------------------------------------------------------------------

// Element sizes of every safetensors dtype, so that a file can be validated in full
// even when it holds dtypes that bigbatch does not load.
std::size_t safetensors_dtype_size(std::string_view name) {
  static constexpr std::pair<std::string_view, std::size_t> sizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const auto& [dtype, size] : sizes) {
    if (dtype == name) return size;
  }
  return 0;
}

std::string safetensors_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::bf16: return "BF16";
  }
  return "?";
}

// ---- the header -----------------------------------------------------------------------

struct TensorEntry {
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", ...
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // relative to the start of the byte buffer
};

struct Header {
  std::vector<TensorEntry> tensors;  // ordered by data_offsets
  std::map<std::string, std::string> metadata;  // without the checksums
  std::map<std::string, std::uint32_t> checksums;  // by tensor name, where recorded
  std::uint64_t buffer_start = 0;  // 8 + N: where the byte buffer begins in the file
};

// ---- checksums --------------------------------------------------------------------------

/// zlib's CRC-32 (the polynomial of gzip and PNG) of `count` bytes.
std::uint32_t crc32_of(const void* bytes, std::size_t count) {
  return static_cast<std::uint32_t>(
      ::crc32_z(0L, static_cast<const Bytef*>(bytes), static_cast<z_size_t>(count)));
}

/// A checksum as the metadata holds it: 8 lowercase hex digits.
std::string checksum_text(std::uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", crc);
  return text;
}

bool is_checksum_key(std::string_view key) { return key.rfind(kChecksumPrefix, 0) == 0; }

std::vector<std::int64_t> integer_array(const Json& value, const std::string& what,
                                        const std::string& path) {
  if (!value.is_array()) fail(path, what + " must be an array of integers");
  std::vector<std::int64_t> integers;
  for (const Json& item : value) {
    // Non-negative integers parse as unsigned; negative ones, fractions and exponents
    // do not.
    if (!item.is_number_unsigned()) fail(path, what + " must hold non-negative integers");
    const auto integer = item.get<std::uint64_t>();
    if (integer > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(path, what + " holds an integer too large");
    }
    integers.push_back(static_cast<std::int64_t>(integer));
  }
  return integers;
}

/// Reads "__metadata__" into the header: the checksums ("crc32.NAME") apart from the rest.
void read_metadata(const Json& value, const std::string& path, Header& header) {
  if (!value.is_object()) fail(path, "\"__metadata__\" must be an object");
  for (const auto& [key, entry] : value.items()) {
    if (!entry.is_string()) {
      fail(path, "\"__metadata__\" value of \"" + key + "\" must be a string");
    }
    const std::string text = entry.get<std::string>();
    if (!is_checksum_key(key)) {
      header.metadata[key] = text;
      continue;
    }
    std::uint32_t crc = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), crc, 16);
    if (text.size() != 8 || error != std::errc() || end != text.data() + text.size()) {
      fail(path, "\"__metadata__\" value of \"" + key + "\" must be 8 hex digits (a CRC-32)");
    }
    header.checksums[key.substr(kChecksumPrefix.size())] = crc;
  }
}

TensorEntry read_tensor_entry(const std::string& name, const Json& value,
                              const std::string& path) {
  const std::string where = "tensor \"" + name + "\"";
  if (!value.is_object()) fail(path, where + " must be an object");
  TensorEntry entry{name, "", {}, 0, 0};
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : value.items()) {
    if (key == "dtype") {
      if (!field.is_string()) fail(path, where + ": dtype must be a string");
      entry.dtype = field.get<std::string>();
      has_dtype = true;
    } else if (key == "shape") {
      entry.shape = integer_array(field, where + ": shape", path);
      has_shape = true;
    } else if (key == "data_offsets") {
      const auto offsets = integer_array(field, where + ": data_offsets", path);
      if (offsets.size() != 2) fail(path, where + ": data_offsets must be [begin, end]");
      entry.begin = static_cast<std::uint64_t>(offsets[0]);
      entry.end = static_cast<std::uint64_t>(offsets[1]);
      has_offsets = true;
    } else {
      fail(path, where + " has an unexpected key \"" + key + "\"");
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) {
    fail(path, where + " needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (safetensors_dtype_size(entry.dtype) == 0) {
    fail(path, where + " has an unknown dtype \"" + entry.dtype + "\"");
  }
  return entry;
}

// shape x element size in bytes, or 0 with `overflow` set when it does not fit 64 bits.
std::uint64_t entry_bytes(const TensorEntry& entry, bool& overflow) {
  std::uint64_t bytes = safetensors_dtype_size(entry.dtype);
  overflow = false;
  for (const std::int64_t d : entry.shape) {
    const auto dim = static_cast<std::uint64_t>(d);
    if (dim != 0 && bytes > std::numeric_limits<std::uint64_t>::max() / dim) overflow = true;
    bytes = overflow ? 0 : bytes * dim;
  }
  return bytes;
}

// The byte ranges must tile the buffer exactly: in range, no overlap, no gap, sizes
// that match the shapes, and the last range ending at the buffer's end.
void validate_layout(std::vector<TensorEntry>& tensors, std::uint64_t buffer_bytes,
                     const std::string& path) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& entry : tensors) {
    const std::string where = "tensor \"" + entry.name + "\" (data_offsets [" +
                              std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "])";
    if (entry.end < entry.begin) fail(path, where + " ends before it begins");
    if (entry.end > buffer_bytes) {
      fail(path, where + " is out of range: the byte buffer holds only " +
                     std::to_string(buffer_bytes) + " bytes");
    }
    if (entry.begin < covered) {
      fail(path, where + " overlaps tensor \"" + previous->name + "\", which ends at " +
                     std::to_string(covered));
    }
    if (entry.begin > covered) {
      fail(path, where + " leaves a gap: buffer bytes [" + std::to_string(covered) + ", " +
                     std::to_string(entry.begin) + ") belong to no tensor");
    }
    bool overflow = false;
    const std::uint64_t bytes = entry_bytes(entry, overflow);
    if (overflow) fail(path, where + ": shape " + shape_string(entry.shape) + " is too large");
    if (entry.end - entry.begin != bytes) {
      fail(path, where + ": shape " + shape_string(entry.shape) + " of " + entry.dtype + " needs " +
                     std::to_string(bytes) + " bytes, the range holds " +
                     std::to_string(entry.end - entry.begin));
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != buffer_bytes) {
    fail(path, "the tensors cover only " + std::to_string(covered) + " of the " +
                   std::to_string(buffer_bytes) +
                   " bytes in the byte buffer (the last tensor must end at the end of the file)");
  }
}

Header read_header(std::ifstream& in, const std::string& path) {
  std::error_code size_error;
  const std::uint64_t file_bytes = std::filesystem::file_size(path, size_error);
  if (size_error) fail(path, "cannot read the file size: " + size_error.message());
  if (file_bytes < 8) {
    fail(path, "truncated safetensors file: " + std::to_string(file_bytes) +
                   " bytes, fewer than the 8 of the header length");
  }
  std::uint64_t header_bytes = 0;  // little-endian in the file and on this host
  in.read(reinterpret_cast<char*>(&header_bytes), sizeof header_bytes);
  if (header_bytes > kMaxHeaderBytes) {
    fail(path, "the header claims " + std::to_string(header_bytes) +
                   " bytes, more than the 100 MB limit (not a safetensors file?)");
  }
  if (8 + header_bytes > file_bytes) {
    fail(path, "truncated safetensors file: the header claims " + std::to_string(header_bytes) +
                   " bytes, only " + std::to_string(file_bytes - 8) + " follow");
  }
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) fail(path, std::string("reading the header failed: ") + std::strerror(errno));
  if (text.empty() || text[0] != '{') fail(path, "the header does not start with '{'");

  // The library checks the syntax and that strings are UTF-8; the limits are ours.
  const Json root = [&] {
    try {
      return parse_json_limited(text, kMaxDepth, "malformed safetensors header JSON");
    } catch (const std::runtime_error& error) {
      fail(path, error.what());
    }
  }();
  Header header;
  header.buffer_start = 8 + header_bytes;
  for (const auto& [name, value] : root.items()) {
    if (name == kMetadataKey) {
      read_metadata(value, path, header);
    } else {
      header.tensors.push_back(read_tensor_entry(name, value, path));
    }
  }
  validate_layout(header.tensors, file_bytes - header.buffer_start, path);
  for (const auto& checksum : header.checksums) {
    const std::string& name = checksum.first;  // a name, not a binding: lambdas capture it
    const bool named = std::any_of(header.tensors.begin(), header.tensors.end(),
                                   [&](const TensorEntry& entry) { return entry.name == name; });
    if (!named) fail(path, "\"__metadata__\" holds a checksum of \"" + name + "\", no tensor");
  }
  return header;
}

DType tensor_dtype_of(const TensorEntry& entry, const std::string& path) {
  if (entry.dtype == "F32") return DType::f32;
  if (entry.dtype == "F16") return DType::f16;
  if (entry.dtype == "F64") return DType::f64;
  if (entry.dtype == "I32") return DType::i32;
  if (entry.dtype == "BF16") return DType::bf16;
  fail(path, "tensor \"" + entry.name + "\" has dtype " + entry.dtype +
                 ", which has no tensor type here (F32, F16, BF16, F64 and I32 do)");
}

// ---- atomic writing -------------------------------------------------------------------

// Writes all of `bytes` to `fd`, retrying short writes.
bool write_all(int fd, const void* bytes, std::size_t count) {
  const auto* cursor = static_cast<const char*>(bytes);
  while (count > 0) {
    const ssize_t written = ::write(fd, cursor, count);
    if (written < 0 && errno == EINTR) continue;
    if (written == 0) errno = EIO;  // no progress and no reason given
    if (written <= 0) return false;
    cursor += written;
    count -= static_cast<std::size_t>(written);
  }
  return true;
}

// Everything save_safetensors writes, in order, for one tensor.
struct PlannedTensor {
  const std::string* name;
  const Tensor* tensor;
  std::uint64_t begin, end;
};

/// The header: `metadata`, each tensor's checksum (`crcs`, in plan order; none when
/// empty) and its entry.
std::string build_header(const std::vector<PlannedTensor>& plan,
                         const std::map<std::string, std::string>& metadata,
                         const std::vector<std::uint32_t>& crcs) {
  Json header = Json::object();
  std::map<std::string, std::string> with_checksums = metadata;
  for (std::size_t i = 0; i < crcs.size(); ++i) {
    with_checksums[std::string(kChecksumPrefix) + *plan[i].name] = checksum_text(crcs[i]);
  }
  if (!with_checksums.empty()) header[kMetadataKey] = with_checksums;
  for (const PlannedTensor& item : plan) {
    header[*item.name] = {{"dtype", safetensors_dtype_of(item.tensor->dtype())},
                          {"shape", item.tensor->shape()},
                          {"data_offsets", {item.begin, item.end}}};
  }
  std::string json;
  try {
    json = header.dump();  // compact, UTF-8 unescaped, as the reference writer does
  } catch (const Json::type_error&) {
    throw std::invalid_argument(
        "save_safetensors: a tensor name or metadata entry is not valid UTF-8");
  }
  json.append((kHeaderAlignment - json.size() % kHeaderAlignment) % kHeaderAlignment, ' ');
  return json;
}

std::vector<PlannedTensor> plan_layout(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<PlannedTensor> plan;
  for (const auto& [name, tensor] : tensors) {
    BIGBATCH_CHECK(tensor.defined(), "save_safetensors: tensor \"", name, "\" is undefined");
    BIGBATCH_CHECK(!name.empty() && name != kMetadataKey, "save_safetensors: \"", name,
                   "\" cannot name a tensor");
    plan.push_back({&name, &tensor, 0, 0});
  }
  // Larger elements first, then by name: each tensor starts aligned to its element size.
  std::sort(plan.begin(), plan.end(), [](const PlannedTensor& a, const PlannedTensor& b) {
    const auto size_a = dtype_size(a.tensor->dtype()), size_b = dtype_size(b.tensor->dtype());
    return size_a != size_b ? size_a > size_b : *a.name < *b.name;
  });
  std::uint64_t offset = 0;
  for (PlannedTensor& item : plan) {
    item.begin = offset;
    offset += item.tensor->nbytes();
    item.end = offset;
  }
  return plan;
}

void check_unique_names(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::string_view> names;
  for (const auto& entry : tensors) names.emplace_back(entry.first);
  std::sort(names.begin(), names.end());
  const auto duplicate = std::adjacent_find(names.begin(), names.end());
  BIGBATCH_CHECK(duplicate == names.end(), "save_safetensors: two tensors are named \"",
                 duplicate == names.end() ? std::string_view() : *duplicate, "\"");
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      TensorChecksums checksums) {
  check_unique_names(tensors);
  for (const auto& entry : metadata) {
    BIGBATCH_CHECK(!is_checksum_key(entry.first), "save_safetensors: metadata key \"",
                   entry.first, "\" is reserved (", kChecksumPrefix, "NAME holds a tensor's CRC-32)");
  }
  const std::vector<PlannedTensor> plan = plan_layout(tensors);
  // The checksums are known once the bytes are written (a CUDA tensor is copied to the
  // host once, for both): the header goes first with zeros in their place, 8 hex digits
  // each, and is written again over itself, the same length, with the real ones.
  const bool record = checksums == TensorChecksums::crc32;
  std::vector<std::uint32_t> crcs(record ? plan.size() : 0, 0);
  std::string header = build_header(plan, metadata, crcs);
  const std::uint64_t header_bytes = header.size();  // little-endian, as the host

  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(temporary, std::string("cannot create: ") + std::strerror(errno));
  int error = 0;
  try {
    if (!write_all(fd, &header_bytes, sizeof header_bytes) ||
        !write_all(fd, header.data(), header.size())) {
      error = errno;
    }
    for (const PlannedTensor& item : plan) {
      if (error != 0) break;
      // One host copy at a time: saving CUDA parameters needs host memory for the
      // largest tensor only.
      const Tensor host =
          item.tensor->device().is_cpu() ? *item.tensor : item.tensor->to(Device::cpu());
      if (record) {
        crcs[static_cast<std::size_t>(&item - plan.data())] =
            crc32_of(host.raw_data(), host.nbytes());
      }
      if (!write_all(fd, host.raw_data(), host.nbytes())) error = errno;
    }
    if (error == 0 && record) {
      header = build_header(plan, metadata, crcs);
      if (header.size() != header_bytes) fail(temporary, "the checksummed header changed length");
      if (::lseek(fd, sizeof header_bytes, SEEK_SET) < 0 ||
          !write_all(fd, header.data(), header.size())) {
        error = errno;
      }
    }
  } catch (...) {
    ::close(fd);
    std::remove(temporary.c_str());
    throw;
  }
  // fsync before rename: the new name must never point at data still in flight.
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && std::rename(temporary.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    std::remove(temporary.c_str());
    fail(path, std::string("saving safetensors failed: ") + std::strerror(error));
  }
  // fsync the folder too, so the rename itself survives a crash of the machine.
  const std::size_t slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int folder_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder_fd >= 0) {
    const int synced = ::fsync(folder_fd);
    const int sync_errno = errno;
    ::close(folder_fd);
    if (synced != 0) fail(path, std::string("syncing its folder failed: ") + std::strerror(sync_errno));
  }
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, MemoryCategory category,
                                               UncheckedTensors unchecked) {
  std::ifstream in = io_detail::open_for_reading(path, "safetensors file");
  const Header header = read_header(in, path);
  std::map<std::string, Tensor> tensors;
  for (const TensorEntry& entry : header.tensors) {
    Tensor tensor(entry.shape, tensor_dtype_of(entry, path), Device::cpu(), category);
    if (tensor.nbytes() > 0) {  // empty tensors own no bytes in the buffer
      in.seekg(static_cast<std::streamoff>(header.buffer_start + entry.begin));
      in.read(static_cast<char*>(tensor.raw_data()), static_cast<std::streamsize>(tensor.nbytes()));
      if (!in) fail(path, "reading tensor \"" + entry.name + "\" failed: " + std::strerror(errno));
    }
    const auto recorded = header.checksums.find(entry.name);
    if (recorded != header.checksums.end()) {
      const std::uint32_t crc = crc32_of(tensor.raw_data(), tensor.nbytes());
      if (crc != recorded->second) {
        fail(path, "tensor \"" + entry.name + "\" is damaged: its bytes have CRC-32 " +
                       checksum_text(crc) + ", the file recorded " +
                       checksum_text(recorded->second));
      }
    } else if (unchecked == UncheckedTensors::refused) {
      fail(path, "tensor \"" + entry.name + "\" has no checksum (no \"" +
                     std::string(kChecksumPrefix) + entry.name + "\" in the metadata): the file "
                     "was edited");
    }
    tensors.emplace(entry.name, std::move(tensor));
  }
  return tensors;
}

std::string crc32_text(const void* bytes, std::size_t count) {
  return checksum_text(crc32_of(bytes, count));
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  std::ifstream in = io_detail::open_for_reading(path, "safetensors file");
  return read_header(in, path).metadata;
}

}  // namespace bigbatch
