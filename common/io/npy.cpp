#include "common/io/npy.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include "common/io/file_format_reading.hpp"

namespace bigbatch {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader and writer copy little-endian bytes as they are");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kDataAlignment = 64;  // NumPy starts the data at a multiple of 64

using io_detail::fail;

// The first position at or after `pos` that is not a space, tab, line feed or carriage
// return.
std::size_t skip_whitespace(std::string_view text, std::size_t pos) {
  while (pos < text.size() &&
         (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) {
    ++pos;
  }
  return pos;
}

// Reads an optional '-' and decimal digits at text[pos] into `value`, moving `pos` past
// them. Returns nullptr, or what is wrong ("expected digits", "integer too large") with
// `pos` at the character where reading stopped. text[pos] must exist.
const char* scan_integer(std::string_view text, std::size_t& pos, std::int64_t& value) {
  const bool negative = text[pos] == '-';
  if (negative) ++pos;
  const std::size_t first_digit = pos;
  std::int64_t magnitude = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    const int digit = text[pos] - '0';
    if (magnitude > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
      return "integer too large";
    }
    magnitude = magnitude * 10 + digit;
    ++pos;
  }
  if (pos == first_digit) return "expected digits";
  value = negative ? -magnitude : magnitude;
  return nullptr;
}

// ---- the header: a Python dict literal ------------------------------------------------

// The Python literals a .npy header can contain.
struct PyEntry;  // a dict's key and its value (defined below: PyValue is incomplete here)

struct PyValue {
  enum class Kind { string, integer, boolean, none, sequence, dict };
  Kind kind = Kind::none;
  std::string text;                                      // string
  std::int64_t integer = 0;                              // integer
  bool boolean = false;                                  // boolean
  std::vector<PyValue> items;                            // sequence: tuple or list
  std::vector<PyEntry> entries;                          // dict, in file order
};

struct PyEntry {
  std::string key;
  PyValue value;
};

// A recursive-descent parser for the literal subset NumPy writes: dicts, tuples,
// lists, quoted strings, integers (Python 2's "3L" too), True, False and None.
class PyLiteralParser {
 public:
  PyLiteralParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  PyValue parse_whole() {
    PyValue value = parse_value();
    pos_ = skip_whitespace(text_, pos_);
    if (pos_ != text_.size()) error("unexpected text after the header dict");
    return value;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail(path_, "malformed .npy header (" + what + " at character " + std::to_string(pos_) +
                    "): " + std::string(text_));
  }

  char peek() {
    pos_ = skip_whitespace(text_, pos_);
    if (pos_ >= text_.size()) error("unexpected end");
    return text_[pos_];
  }

  PyValue parse_value() {
    const char c = peek();
    if (c == '{') return parse_dict();
    if (c == '(') return parse_sequence(')');
    if (c == '[') return parse_sequence(']');
    if (c == '\'' || c == '"') return parse_string();
    if (c == '-' || (c >= '0' && c <= '9')) return parse_integer();
    return parse_keyword();
  }

  PyValue parse_dict() {
    PyValue dict;
    dict.kind = PyValue::Kind::dict;
    ++pos_;  // '{'
    while (peek() != '}') {
      PyValue key = parse_value();
      if (key.kind != PyValue::Kind::string) error("dict keys must be strings");
      for (const auto& entry : dict.entries) {
        if (entry.key == key.text) error("duplicate key '" + key.text + "'");
      }
      if (peek() != ':') error("expected ':'");
      ++pos_;
      PyValue value = parse_value();
      dict.entries.push_back({key.text, std::move(value)});
      if (!consume_separator('}')) break;
    }
    ++pos_;  // '}'
    return dict;
  }

  PyValue parse_sequence(char close) {
    PyValue sequence;
    sequence.kind = PyValue::Kind::sequence;
    ++pos_;  // '(' or '['
    while (peek() != close) {
      sequence.items.push_back(parse_value());
      if (!consume_separator(close)) break;
    }
    ++pos_;  // close
    return sequence;
  }

  // After an element: consumes a ',' (true: more may follow) or stops before `close`.
  bool consume_separator(char close) {
    const char c = peek();
    if (c == ',') {
      ++pos_;
      return true;
    }
    if (c != close) error(std::string("expected ',' or '") + close + "'");
    return false;
  }

  PyValue parse_string() {
    PyValue string;
    string.kind = PyValue::Kind::string;
    const char quote = text_[pos_++];
    while (true) {
      if (pos_ >= text_.size()) error("unterminated string");
      char c = text_[pos_++];
      if (c == quote) break;
      if (c == '\\') {
        if (pos_ >= text_.size()) error("unterminated string");
        c = text_[pos_++];
        if (c == 'n') c = '\n';
        if (c == 't') c = '\t';
      }
      string.text.push_back(c);
    }
    return string;
  }

  PyValue parse_integer() {
    PyValue integer;
    integer.kind = PyValue::Kind::integer;
    if (const char* problem = scan_integer(text_, pos_, integer.integer)) error(problem);
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;  // Python 2
    return integer;
  }

  PyValue parse_keyword() {
    PyValue value;
    for (const auto& [word, kind, truth] :
         {std::tuple{std::string_view("True"), PyValue::Kind::boolean, true},
          std::tuple{std::string_view("False"), PyValue::Kind::boolean, false},
          std::tuple{std::string_view("None"), PyValue::Kind::none, false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        value.kind = kind;
        value.boolean = truth;
        return value;
      }
    }
    error("unexpected character '" + std::string(1, text_[pos_]) + "'");
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

// ---- dtypes ---------------------------------------------------------------------------

struct NpyDtype {
  char kind;
  std::size_t itemsize;
};

// Splits a simple dtype string into kind and size. Anything that is not little-endian
// raw numbers is refused here, with the reason.
NpyDtype parse_dtype(const std::string& descr, const std::string& path) {
  const auto bad = [&](const std::string& why) {
    fail(path, "unsupported dtype '" + descr + "': " + why);
  };
  if (descr.size() < 2) bad("expected a byte order, a kind and a size, like '<f4'");
  const char byte_order = descr[0];
  const char kind = descr[1];
  if (std::string_view("<>|=").find(byte_order) == std::string_view::npos) {
    bad("expected a byte order '<', '>', '|' or '=' first");
  }
  if (std::string_view("biufc").find(kind) == std::string_view::npos) {
    bad(kind == 'O' ? "object arrays hold pickled Python objects, not numbers"
                    : "only bool, integer, unsigned, float and complex arrays are read");
  }
  if (descr.size() < 3) bad("expected a byte order, a kind and a size, like '<f4'");
  std::size_t itemsize = 0;
  for (std::size_t i = 2; i < descr.size(); ++i) {
    if (descr[i] < '0' || descr[i] > '9' || itemsize > 1024) bad("malformed element size");
    itemsize = itemsize * 10 + static_cast<std::size_t>(descr[i] - '0');
  }
  if (itemsize == 0) bad("zero element size");
  if (byte_order == '>' && itemsize > 1) {
    fail(path, "the array is big-endian ('" + descr +
                   "'); only little-endian .npy files are read: convert it with "
                   "a.astype(a.dtype.newbyteorder('<')) before saving");
  }
  return {kind, itemsize};
}

// NumPy's own spelling of a dtype: '|' for single bytes, '<' otherwise.
std::string normalized_dtype(const NpyDtype& dtype) {
  return std::string(1, dtype.itemsize == 1 ? '|' : '<') + dtype.kind +
         std::to_string(dtype.itemsize);
}

// numel * itemsize, refusing shapes whose byte count does not fit in 63 bits.
std::int64_t checked_byte_count(const std::vector<std::int64_t>& shape, std::size_t itemsize,
                                const std::string& path) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t bytes = static_cast<std::int64_t>(itemsize);
  for (const std::int64_t d : shape) {
    if (d < 0) fail(path, "negative dimension in shape " + shape_string(shape));
    if (d != 0 && bytes > kMax / d) fail(path, "shape " + shape_string(shape) + " is too large");
    bytes *= d;
  }
  return bytes;
}

const PyValue& dict_entry(const PyValue& dict, const std::string& key, const std::string& path) {
  for (const auto& entry : dict.entries) {
    if (entry.key == key) return entry.value;
  }
  fail(path, "the .npy header has no '" + key + "' entry");
}

// Interprets the header dict: fills dtype, shape and fortran_order of `array`.
void read_header_dict(const PyValue& header, const std::string& path, NpyArray& array) {
  if (header.kind != PyValue::Kind::dict) fail(path, "the .npy header is not a dict");
  for (const auto& entry : header.entries) {
    if (entry.key != "descr" && entry.key != "fortran_order" && entry.key != "shape") {
      fail(path, "unexpected key '" + entry.key + "' in the .npy header");
    }
  }
  const PyValue& descr = dict_entry(header, "descr", path);
  if (descr.kind != PyValue::Kind::string) {
    fail(path, "structured dtypes (a 'descr' that is a list of fields) are not supported");
  }
  array.dtype = normalized_dtype(parse_dtype(descr.text, path));

  const PyValue& fortran = dict_entry(header, "fortran_order", path);
  if (fortran.kind != PyValue::Kind::boolean) fail(path, "'fortran_order' must be True or False");
  array.fortran_order = fortran.boolean;
  if (array.fortran_order) {
    fail(path,
         "the array is stored in Fortran (column-major) order; only C order is read: "
         "save np.ascontiguousarray(a) instead");
  }

  const PyValue& shape = dict_entry(header, "shape", path);
  if (shape.kind != PyValue::Kind::sequence) fail(path, "'shape' must be a tuple");
  array.shape.clear();
  for (const PyValue& d : shape.items) {
    if (d.kind != PyValue::Kind::integer || d.integer < 0) {
      fail(path, "'shape' must hold non-negative integers");
    }
    array.shape.push_back(d.integer);
  }
}

std::uint32_t little_endian_u32(const unsigned char* bytes, std::size_t count) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < count; ++i) value |= static_cast<std::uint32_t>(bytes[i]) << (8 * i);
  return value;
}

// Reads exactly `count` bytes or fails with "truncated", naming what was being read.
void read_exactly(std::ifstream& in, void* out, std::size_t count, const std::string& path,
                  const std::string& what) {
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(count));
  if (static_cast<std::size_t>(in.gcount()) != count) {
    fail(path, "truncated .npy file: " + what + " needs " + std::to_string(count) +
                   " bytes, only " + std::to_string(in.gcount()) + " are there");
  }
}

std::string shape_tuple(const std::vector<std::int64_t>& shape) {
  std::string tuple = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    tuple += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return tuple + (shape.size() == 1 ? ",)" : ")");
}

std::string npy_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::i32: return "<i4";
    case DType::f16: return "<f2";
    case DType::bf16: break;  // NumPy has no bfloat16 (tensor_to_npy refuses it)
  }
  return "?";
}

}  // namespace

// ---- NpyArray -------------------------------------------------------------------------

std::int64_t NpyArray::numel() const { return shape_numel(shape); }

char NpyArray::kind() const { return parse_dtype(dtype, "npy array").kind; }

std::size_t NpyArray::itemsize() const { return parse_dtype(dtype, "npy array").itemsize; }

std::vector<NpyInteger> integer_elements(const NpyArray& array) {
  const char kind = array.kind();
  const std::size_t size = array.itemsize();
  if ((kind != 'i' && kind != 'u') || size > 8) {
    throw std::invalid_argument("integer_elements: '" + array.dtype + "' is not an integer dtype");
  }
  const int shift = 64 - 8 * static_cast<int>(size);
  std::vector<NpyInteger> elements(static_cast<std::size_t>(array.numel()));
  for (std::size_t i = 0; i < elements.size(); ++i) {
    std::uint64_t bits = 0;  // little-endian: the element's bytes are the low bytes
    std::memcpy(&bits, array.data.data() + i * size, size);
    if (kind == 'u') {
      elements[i] = {false, bits};
      continue;
    }
    const auto value = static_cast<std::int64_t>(bits << shift) >> shift;  // sign-extend
    elements[i] = value >= 0 ? NpyInteger{false, static_cast<std::uint64_t>(value)}
                             : NpyInteger{true, 0u - static_cast<std::uint64_t>(value)};
  }
  return elements;
}

// ---- reading --------------------------------------------------------------------------

/// The longest header read_npy accepts: 1 MiB (a real header holds a dtype and a shape in
/// well under 1 KiB; NumPy's own reader stops at 10000 bytes by default).
constexpr std::uint32_t kMaxHeaderLength = std::uint32_t{1} << 20;

NpyArray read_npy(const std::string& path) {
  std::ifstream in = io_detail::open_for_reading(path, ".npy file");

  unsigned char preamble[8];  // magic (6), major version, minor version
  read_exactly(in, preamble, sizeof preamble, path, "the magic and version");
  if (std::string_view(reinterpret_cast<const char*>(preamble), kMagic.size()) != kMagic) {
    fail(path, "not a .npy file (it does not start with \"\\x93NUMPY\")");
  }
  const int major = preamble[6], minor = preamble[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + " (1.0, 2.0 and 3.0 are read)");
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  unsigned char length_field[4];
  read_exactly(in, length_field, length_bytes, path, "the header length");
  // The header's length is checked against the file and a limit before a byte of it is
  // allocated: a corrupt length must not make the reader allocate gigabytes.
  const std::uint32_t header_length = little_endian_u32(length_field, length_bytes);
  if (header_length > kMaxHeaderLength) {
    fail(path, "the header claims " + std::to_string(header_length) + " bytes, more than the " +
                   std::to_string(kMaxHeaderLength) + " this reader accepts");
  }
  std::error_code file_error;
  const auto file_length = std::filesystem::file_size(path, file_error);
  const auto header_start = static_cast<std::uintmax_t>(in.tellg());
  if (!file_error && file_length - header_start < header_length) {
    fail(path, "truncated .npy file: the header claims " + std::to_string(header_length) +
                   " bytes, only " + std::to_string(file_length - header_start) + " follow");
  }
  std::string header(header_length, '\0');
  read_exactly(in, header.data(), header.size(), path, "the header");

  NpyArray array;
  read_header_dict(PyLiteralParser(header, path).parse_whole(), path, array);

  const std::int64_t data_bytes = checked_byte_count(array.shape, array.itemsize(), path);
  std::error_code size_error;
  const auto file_bytes = std::filesystem::file_size(path, size_error);
  const auto data_start = static_cast<std::uintmax_t>(in.tellg());
  if (!size_error && file_bytes - data_start < static_cast<std::uintmax_t>(data_bytes)) {
    fail(path, "truncated .npy file: shape " + shape_string(array.shape) + " of " + array.dtype +
                   " needs " + std::to_string(data_bytes) + " bytes of data, only " +
                   std::to_string(file_bytes - data_start) + " follow the header");
  }
  array.data.resize(static_cast<std::size_t>(data_bytes));
  read_exactly(in, array.data.data(), array.data.size(), path, "the data");
  return array;
}

// ---- writing --------------------------------------------------------------------------

void write_npy(const std::string& path, const NpyArray& array) {
  const NpyDtype dtype = parse_dtype(array.dtype, path);
  BIGBATCH_CHECK(!array.fortran_order, "write_npy: ", path, ": Fortran order is not written");
  const std::int64_t data_bytes = checked_byte_count(array.shape, dtype.itemsize, path);
  BIGBATCH_CHECK(static_cast<std::int64_t>(array.data.size()) == data_bytes, "write_npy: ", path,
                 ": shape ", shape_string(array.shape), " of ", array.dtype, " needs ", data_bytes,
                 " bytes, the array holds ", array.data.size());

  std::string header = "{'descr': '" + normalized_dtype(dtype) +
                       "', 'fortran_order': False, 'shape': " + shape_tuple(array.shape) + ", }";
  // Pad with spaces, end with '\n', so that the data starts at a multiple of 64 bytes.
  const std::size_t unpadded = kMagic.size() + 2 + 2 + header.size() + 1;
  header.append((kDataAlignment - unpadded % kDataAlignment) % kDataAlignment, ' ');
  header.push_back('\n');
  BIGBATCH_CHECK(header.size() <= 0xFFFF, "write_npy: ", path, ": header too long for version 1.0");

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, std::string("cannot create .npy file: ") + std::strerror(errno));
  const unsigned char length_field[2] = {static_cast<unsigned char>(header.size() & 0xFF),
                                         static_cast<unsigned char>(header.size() >> 8)};
  out.write(kMagic.data(), static_cast<std::streamsize>(kMagic.size()));
  out.put('\x01').put('\x00');
  out.write(reinterpret_cast<const char*>(length_field), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(array.data.data()),
            static_cast<std::streamsize>(array.data.size()));
  out.close();
  if (!out) fail(path, std::string("writing the .npy file failed: ") + std::strerror(errno));
}

void write_npy(const std::string& path, const Tensor& tensor) {
  write_npy(path, tensor_to_npy(tensor));
}

// ---- tensors --------------------------------------------------------------------------

NpyArray tensor_to_npy(const Tensor& tensor) {
  BIGBATCH_CHECK(tensor.defined(), "tensor_to_npy: the tensor is undefined");
  BIGBATCH_CHECK(tensor.dtype() != DType::bf16, "tensor_to_npy: NumPy has no bfloat16 "
                 "dtype; cast the tensor to f32 first (exact), or save it as safetensors");
  const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  NpyArray array;
  array.dtype = npy_dtype_of(tensor.dtype());
  array.shape = tensor.shape();
  const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
  array.data.assign(bytes, bytes + host.nbytes());
  return array;
}

Tensor npy_to_tensor(const NpyArray& array, MemoryCategory category, const std::string& source) {
  BIGBATCH_CHECK(!array.fortran_order, source, ": Fortran-order arrays are not supported");
  const NpyDtype parsed = parse_dtype(array.dtype, source);
  const std::string dtype = normalized_dtype(parsed);
  DType tensor_dtype;
  if (dtype == "<f4") {
    tensor_dtype = DType::f32;
  } else if (dtype == "<f8") {
    tensor_dtype = DType::f64;
  } else if (dtype == "<i4") {
    tensor_dtype = DType::i32;
  } else if (dtype == "<f2") {
    tensor_dtype = DType::f16;
  } else {
    fail(source, "dtype " + dtype +
                     " has no tensor type (f32 '<f4', f64 '<f8', i32 '<i4' and "
                     "f16 '<f2' do)");
  }
  Tensor tensor(array.shape, tensor_dtype, Device::cpu(), category);
  BIGBATCH_CHECK(array.data.size() == tensor.nbytes(), source, ": shape ",
                 shape_string(array.shape), " of ", dtype, " needs ", tensor.nbytes(),
                 " bytes, the array holds ", array.data.size());
  if (tensor.nbytes() > 0) std::memcpy(tensor.raw_data(), array.data.data(), tensor.nbytes());
  return tensor;
}

}  // namespace bigbatch
