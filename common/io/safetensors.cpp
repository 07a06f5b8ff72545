#include "common/io/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string_view>

#include "common/io/file_format_reading.hpp"

namespace bigbatch {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied as it is");

// The reference implementation refuses headers above 100 MB (a file could otherwise
// make the reader parse gigabytes of JSON).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::size_t kHeaderAlignment = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

using io_detail::fail;

// ---- UTF-8 ----------------------------------------------------------------------------

// True when `text` is well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t length;
    std::uint32_t code;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2, code = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, code = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, code = lead & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    constexpr std::uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

void append_utf8(std::string& out, std::uint32_t code) {
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

// ---- a minimal JSON reader ------------------------------------------------------------

// The JSON a safetensors header uses: objects, arrays, strings and integers.
struct JsonMember;  // a key and its value (defined below: JsonValue is incomplete here)

struct JsonValue {
  enum class Kind { object, array, string, integer };
  Kind kind = Kind::object;
  std::string text;                                        // string
  std::int64_t integer = 0;                                // integer
  std::vector<JsonValue> items;                            // array
  std::vector<JsonMember> members;                         // object, in file order
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  JsonValue parse_whole() {
    JsonValue value = parse_value(0);
    pos_ = io_detail::skip_whitespace(text_, pos_);
    if (pos_ != text_.size()) error("unexpected text after the header object");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;  // deeper nesting is never a real header

  [[noreturn]] void error(const std::string& what) const {
    fail(path_, "malformed safetensors header JSON: " + what + " at byte " + std::to_string(pos_));
  }

  char peek() {
    pos_ = io_detail::skip_whitespace(text_, pos_);
    if (pos_ >= text_.size()) error("unexpected end");
    return text_[pos_];
  }

  void expect(char c) {
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) error("nesting too deep");
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      JsonValue string;
      string.kind = JsonValue::Kind::string;
      string.text = parse_string();
      return string;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_integer();
    error("expected an object, an array, a string or an integer");
  }

  JsonValue parse_object(int depth) {
    JsonValue object;
    object.kind = JsonValue::Kind::object;
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return object;
    }
    while (true) {
      if (peek() != '"') error("expected a string key");
      std::string key = parse_string();
      for (const auto& member : object.members) {
        if (member.key == key) error("duplicate key \"" + key + "\"");
      }
      expect(':');
      JsonValue value = parse_value(depth + 1);
      object.members.push_back({std::move(key), std::move(value)});
      if (peek() == '}') break;
      expect(',');
    }
    ++pos_;
    return object;
  }

  JsonValue parse_array(int depth) {
    JsonValue array;
    array.kind = JsonValue::Kind::array;
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return array;
    }
    while (true) {
      array.items.push_back(parse_value(depth + 1));
      if (peek() == ']') break;
      expect(',');
    }
    ++pos_;
    return array;
  }

  std::uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) error("truncated \\u escape");
    std::uint32_t code = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = text_[pos_++];
      const int digit = (h >= '0' && h <= '9')   ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
      if (digit < 0) error("bad hex digit in \\u escape");
      code = code * 16 + static_cast<std::uint32_t>(digit);
    }
    return code;
  }

  // A \uXXXX escape, joining a UTF-16 surrogate pair into one code point.
  std::uint32_t parse_unicode_escape() {
    const std::uint32_t first = parse_hex4();
    if (first >= 0xDC00 && first <= 0xDFFF) error("lone low surrogate");
    if (first < 0xD800 || first > 0xDBFF) return first;
    if (text_.substr(pos_, 2) != "\\u") error("high surrogate without its low half");
    pos_ += 2;
    const std::uint32_t second = parse_hex4();
    if (second < 0xDC00 || second > 0xDFFF) error("high surrogate without its low half");
    return 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string text;
    while (true) {
      if (pos_ >= text_.size()) error("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return text;
      if (static_cast<unsigned char>(c) < 0x20) error("raw control character in a string");
      if (c != '\\') {
        text.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) error("unterminated string");
      switch (const char escaped = text_[pos_++]) {
        case '"':
        case '\\':
        case '/': text.push_back(escaped); break;
        case 'b': text.push_back('\b'); break;
        case 'f': text.push_back('\f'); break;
        case 'n': text.push_back('\n'); break;
        case 'r': text.push_back('\r'); break;
        case 't': text.push_back('\t'); break;
        case 'u': append_utf8(text, parse_unicode_escape()); break;
        default: error(std::string("unknown escape \\") + escaped);
      }
    }
  }

  JsonValue parse_integer() {
    JsonValue integer;
    integer.kind = JsonValue::Kind::integer;
    const std::size_t first_digit = text_[pos_] == '-' ? pos_ + 1 : pos_;
    if (const char* problem = io_detail::scan_integer(text_, pos_, integer.integer)) error(problem);
    if (text_[first_digit] == '0' && pos_ - first_digit > 1) error("leading zero");
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      error("numbers in a safetensors header must be integers");
    }
    return integer;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

// ---- a minimal JSON writer ------------------------------------------------------------

void append_json_string(std::string& out, std::string_view text) {
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out.push_back(hex[(c >> 4) & 0xF]);
          out.push_back(hex[c & 0xF]);
        } else {
          out.push_back(c);  // UTF-8 passes through unescaped, as serde_json writes it
        }
    }
  }
  out.push_back('"');
}

void append_json_integers(std::string& out, const std::vector<std::int64_t>& values) {
  out.push_back('[');
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out.push_back(',');
    out += std::to_string(values[i]);
  }
  out.push_back(']');
}

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
  std::map<std::string, std::string> metadata;
  std::uint64_t buffer_start = 0;  // 8 + N: where the byte buffer begins in the file
};

std::vector<std::int64_t> integer_array(const JsonValue& value, const std::string& what,
                                        const std::string& path) {
  if (value.kind != JsonValue::Kind::array) fail(path, what + " must be an array of integers");
  std::vector<std::int64_t> integers;
  for (const JsonValue& item : value.items) {
    if (item.kind != JsonValue::Kind::integer || item.integer < 0) {
      fail(path, what + " must hold non-negative integers");
    }
    integers.push_back(item.integer);
  }
  return integers;
}

std::map<std::string, std::string> read_metadata(const JsonValue& value, const std::string& path) {
  if (value.kind != JsonValue::Kind::object) fail(path, "\"__metadata__\" must be an object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.members) {
    if (entry.kind != JsonValue::Kind::string) {
      fail(path, "\"__metadata__\" value of \"" + key + "\" must be a string");
    }
    metadata[key] = entry.text;
  }
  return metadata;
}

TensorEntry read_tensor_entry(const std::string& name, const JsonValue& value,
                              const std::string& path) {
  const std::string where = "tensor \"" + name + "\"";
  if (value.kind != JsonValue::Kind::object) fail(path, where + " must be an object");
  TensorEntry entry{name, "", {}, 0, 0};
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : value.members) {
    if (key == "dtype") {
      if (field.kind != JsonValue::Kind::string) fail(path, where + ": dtype must be a string");
      entry.dtype = field.text;
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
  if (!is_valid_utf8(text)) fail(path, "the header is not valid UTF-8");
  if (text.empty() || text[0] != '{') fail(path, "the header does not start with '{'");

  const JsonValue root = JsonParser(text, path).parse_whole();
  Header header;
  header.buffer_start = 8 + header_bytes;
  for (const auto& [name, value] : root.members) {
    if (name == kMetadataKey) {
      header.metadata = read_metadata(value, path);
    } else {
      header.tensors.push_back(read_tensor_entry(name, value, path));
    }
  }
  validate_layout(header.tensors, file_bytes - header.buffer_start, path);
  return header;
}

DType tensor_dtype_of(const TensorEntry& entry, const std::string& path) {
  if (entry.dtype == "F32") return DType::f32;
  if (entry.dtype == "F16") return DType::f16;
  if (entry.dtype == "F64") return DType::f64;
  if (entry.dtype == "I32") return DType::i32;
  fail(path, "tensor \"" + entry.name + "\" has dtype " + entry.dtype +
                 ", which has no tensor type here (F32, F16, F64 and I32 do)");
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

std::string build_header(const std::vector<PlannedTensor>& plan,
                         const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    append_json_string(json, kMetadataKey);
    json += ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) json.push_back(',');
      first = false;
      append_json_string(json, key);
      json.push_back(':');
      append_json_string(json, value);
    }
    json += "}";
  }
  for (const PlannedTensor& item : plan) {
    if (json.size() > 1) json.push_back(',');
    append_json_string(json, *item.name);
    json += ":{\"dtype\":\"" + safetensors_dtype_of(item.tensor->dtype()) + "\",\"shape\":";
    append_json_integers(json, item.tensor->shape());
    json += ",\"data_offsets\":";
    append_json_integers(
        json, {static_cast<std::int64_t>(item.begin), static_cast<std::int64_t>(item.end)});
    json += "}";
  }
  json += "}";
  json.append((kHeaderAlignment - json.size() % kHeaderAlignment) % kHeaderAlignment, ' ');
  return json;
}

std::vector<PlannedTensor> plan_layout(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<PlannedTensor> plan;
  for (const auto& [name, tensor] : tensors) {
    BIGBATCH_CHECK(tensor.defined(), "save_safetensors: tensor \"", name, "\" is undefined");
    BIGBATCH_CHECK(!name.empty() && name != kMetadataKey, "save_safetensors: \"", name,
                   "\" cannot name a tensor");
    BIGBATCH_CHECK(is_valid_utf8(name), "save_safetensors: tensor name is not valid UTF-8");
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
                      const std::map<std::string, std::string>& metadata) {
  check_unique_names(tensors);
  for (const auto& [key, value] : metadata) {
    BIGBATCH_CHECK(is_valid_utf8(key) && is_valid_utf8(value),
                   "save_safetensors: metadata is not valid UTF-8");
  }
  const std::vector<PlannedTensor> plan = plan_layout(tensors);
  const std::string header = build_header(plan, metadata);
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
      if (!write_all(fd, host.raw_data(), host.nbytes())) error = errno;
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

std::map<std::string, Tensor> load_safetensors(const std::string& path, MemoryCategory category) {
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
    tensors.emplace(entry.name, std::move(tensor));
  }
  return tensors;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  std::ifstream in = io_detail::open_for_reading(path, "safetensors file");
  return read_header(in, path).metadata;
}

}  // namespace bigbatch
