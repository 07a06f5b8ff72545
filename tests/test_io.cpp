// Tensor files: NumPy .npy and safetensors, written and read back, checked byte for
// byte against what NumPy and the safetensors reference implementation write, and
// every malformed file refused with a message that names the file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "common/io/npy.hpp"
#include "common/io/safetensors.hpp"
#include "common/json.hpp"
#include "tests/harness.hpp"
#include "tests/temp_files.hpp"

namespace bigbatch {
namespace {

// ---- helpers --------------------------------------------------------------------------

using testing::error_of;
using testing::mentions;
using testing::read_file;
using testing::TemporaryPath;
using testing::write_file;

std::string bytes_of(const Tensor& tensor) {
  const Tensor host = tensor.to(Device::cpu());
  const auto* data = static_cast<const char*>(host.raw_data());
  return data == nullptr ? std::string() : std::string(data, host.nbytes());
}

std::string little_endian_floats(std::initializer_list<float> values) {
  std::string bytes;
  for (const float value : values) bytes.append(reinterpret_cast<const char*>(&value), 4);
  return bytes;
}

// A tensor with varied bits: random values plus, for floating dtypes, signed zero,
// infinity, a subnormal and a NaN in the first elements.
Tensor varied_tensor(const Shape& shape, DType dtype, std::uint64_t seed) {
  const bool integer = dtype == DType::i32;
  std::vector<double> values =
      testing::random_values(shape_numel(shape), seed, integer ? -1e6 : -4.0, integer ? 1e6 : 4.0);
  if (!integer) {
    const double specials[] = {-0.0, std::numeric_limits<double>::infinity(), 0x1p-20,
                               std::nan("")};
    for (std::size_t i = 0; i < values.size() && i < std::size(specials); ++i) {
      values[i] = specials[i];
    }
  }
  return testing::make_tensor(values, shape, dtype, Device::cpu());
}

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::i32, DType::f16,
                                       DType::bf16};
/// NumPy has no bfloat16: the .npy tests take the others.
const std::vector<DType> kNpyDTypes = {DType::f32, DType::f64, DType::i32, DType::f16};
const std::vector<Shape> kShapes = {{}, {1}, {7}, {2, 3, 4}, {1025, 3}, {0}, {3, 0, 2}};

// ---- .npy -----------------------------------------------------------------------------

// Exactly what NumPy 2.4 writes for np.save(f, np.arange(6, dtype='<f4').reshape(2, 3) * 0.5):
// version 1.0, header length 118, the dict padded with spaces and ended by '\n' so
// that the data starts at byte 128.
std::string numpy_written_f32_2x3() {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  return std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict +
         std::string(118 - 1 - dict.size(), ' ') + "\n" +
         little_endian_floats({0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f});
}

TEST(Npy, RoundTripsEveryDtypeAndShapeBitForBit) {
  TemporaryPath path("array.npy");
  for (const DType dtype : kNpyDTypes) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_string(shape));
      const Tensor original = varied_tensor(shape, dtype, 11);
      write_npy(path.str(), original);
      // The data starts at a multiple of 64 bytes, as NumPy aligns it.
      EXPECT_EQ((std::filesystem::file_size(path.str()) - original.nbytes()) % 64, 0u);

      const NpyArray array = read_npy(path.str());
      const char* expected_dtype = dtype == DType::f32   ? "<f4"
                                   : dtype == DType::f64 ? "<f8"
                                   : dtype == DType::i32 ? "<i4"
                                                         : "<f2";
      EXPECT_EQ(array.dtype, expected_dtype);
      EXPECT_EQ(array.shape, shape);
      EXPECT_FALSE(array.fortran_order);
      EXPECT_EQ(std::string(array.data.begin(), array.data.end()), bytes_of(original));

      const Tensor loaded = npy_to_tensor(array, MemoryCategory::parameters, path.str());
      EXPECT_EQ(loaded.category(), MemoryCategory::parameters);
      EXPECT_TRUE(testing::bitwise_equal(loaded, original));
    }
  }
}

TEST(Npy, RefusesBfloat16NamingTheWayOut) {
  TemporaryPath path("bf16.npy");
  const Tensor t = varied_tensor({3}, DType::bf16, 4);
  EXPECT_TRUE(mentions(error_of([&] { write_npy(path.str(), t); }), {"bfloat16", "f32"}));
  EXPECT_FALSE(std::filesystem::exists(path.str()));
}

TEST(Npy, ReadsWhatNumPyWrites) {
  TemporaryPath path("numpy.npy");
  write_file(path.str(), numpy_written_f32_2x3());
  const NpyArray array = read_npy(path.str());
  EXPECT_EQ(array.dtype, "<f4");
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{2, 3}));
  const Tensor tensor = npy_to_tensor(array);
  EXPECT_EQ(tensor.to_vector<float>(), (std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f}));
}

TEST(Npy, WritesWhatNumPyWrites) {
  TemporaryPath path("ours.npy");
  write_npy(path.str(),
            Tensor::from_vector(std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f}, {2, 3}));
  EXPECT_EQ(read_file(path.str()), numpy_written_f32_2x3());
}

TEST(Npy, ReadsVersions2And3AndOtherSpellingsOfTheHeader) {
  TemporaryPath path("variants.npy");
  const std::string data = "\x01\x02\xfa";
  // Version 2.0: a 4-byte header length. Keys in another order, double quotes, no
  // trailing comma, Python 2's long integers.
  const std::string v2_header = "{\"shape\": (3L,), 'fortran_order': False, 'descr': '|u1'}\n";
  write_file(path.str(), std::string("\x93NUMPY\x02\x00", 8) +
                             std::string(1, static_cast<char>(v2_header.size())) +
                             std::string("\x00\x00\x00", 3) + v2_header + data);
  NpyArray array = read_npy(path.str());
  EXPECT_EQ(array.dtype, "|u1");
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(std::string(array.data.begin(), array.data.end()), data);

  // Version 3.0 (UTF-8 header), a 0-d array, '=' (native, little-endian here) order,
  // and trailing bytes after the array, which numpy.load ignores too.
  const std::string v3_header = "{'descr': '=i2', 'fortran_order': False, 'shape': (), }   \n";
  write_file(path.str(), std::string("\x93NUMPY\x03\x00", 8) +
                             std::string(1, static_cast<char>(v3_header.size())) +
                             std::string("\x00\x00\x00", 3) + v3_header + "\xff\x7f" + "extra");
  array = read_npy(path.str());
  EXPECT_EQ(array.dtype, "<i2");
  EXPECT_TRUE(array.shape.empty());
  EXPECT_EQ(array.numel(), 1);
  EXPECT_EQ(std::string(array.data.begin(), array.data.end()), "\xff\x7f");
}

TEST(Npy, RefusesMalformedFilesNamingFileAndProblem) {
  TemporaryPath path("bad.npy");
  const auto v1_file = [](const std::string& dict, const std::string& data) {
    std::string header = dict + "\n";
    return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header +
           data;
  };
  const auto error_reading = [&](const std::string& bytes) {
    write_file(path.str(), bytes);
    return error_of([&] { read_npy(path.str()); });
  };
  const std::string eight_bytes(8, '\0');

  EXPECT_TRUE(
      mentions(error_reading(v1_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
                                     eight_bytes)),
               {path.str(), "Fortran"}));
  EXPECT_TRUE(
      mentions(error_reading(v1_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
                                     eight_bytes)),
               {path.str(), "big-endian"}));
  EXPECT_TRUE(
      mentions(error_reading(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                                     eight_bytes)),
               {path.str(), "truncated", "12 bytes"}));
  EXPECT_TRUE(mentions(error_reading(numpy_written_f32_2x3().substr(0, 40)),
                       {path.str(), "truncated", "header"}));
  EXPECT_TRUE(mentions(error_reading("\x93NUM"), {path.str(), "truncated"}));
  EXPECT_TRUE(mentions(error_reading("PK\x03\x04 not an npy file"), {path.str(), "not a .npy"}));
  EXPECT_TRUE(mentions(error_reading(std::string("\x93NUMPY\x04\x00\x00\x00", 10)),
                       {path.str(), "version 4.0"}));
  EXPECT_TRUE(mentions(error_reading(v1_file("{'descr': [('x', '<f4')], 'fortran_order': False, "
                                             "'shape': (2,), }",
                                             eight_bytes)),
                       {path.str(), "structured"}));
  EXPECT_TRUE(
      mentions(error_reading(v1_file("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                                     eight_bytes)),
               {path.str(), "object"}));
  EXPECT_TRUE(mentions(error_reading(v1_file("{'descr': '<f4', 'shape': (2,), }", eight_bytes)),
                       {path.str(), "fortran_order"}));
  EXPECT_TRUE(mentions(error_reading(v1_file(
                           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,) ", eight_bytes)),
                       {path.str(), "malformed"}));
  EXPECT_TRUE(
      mentions(error_reading(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }",
                                     eight_bytes)),
               {path.str(), "non-negative"}));
  EXPECT_TRUE(mentions(error_of([] { read_npy("/nonexistent/folder/x.npy"); }),
                       {"/nonexistent/folder/x.npy", "cannot open"}));
  // A header length past the file or the limit is refused before anything is allocated
  // (the fuzzer found a 0.6 GB claim in a file of 117 bytes: fuzz/regressions/fuzz_npy).
  EXPECT_TRUE(mentions(error_reading(std::string("\x93NUMPY\x03\x00\x76\x00\x7b\x27", 10) +
                                     "{'descr'"),
                       {path.str(), "the header claims 662372470 bytes", "more than"}));
  EXPECT_TRUE(mentions(error_reading(std::string("\x93NUMPY\x02\x00\x00\x02\x00\x00", 12) +
                                     "{'descr'"),
                       {path.str(), "truncated", "the header claims 512 bytes, only 8 follow"}));
}

TEST(Npy, KeepsOtherDtypesAsBytesButMakesTensorsOnlyOfTensorDtypes) {
  TemporaryPath path("int64.npy");
  NpyArray labels{"<i8", {2}, false, {}};
  const std::int64_t values[] = {5, -7};
  labels.data.assign(reinterpret_cast<const unsigned char*>(values),
                     reinterpret_cast<const unsigned char*>(values) + sizeof values);
  write_npy(path.str(), labels);
  const NpyArray array = read_npy(path.str());
  EXPECT_EQ(array.dtype, "<i8");
  EXPECT_EQ(array.kind(), 'i');
  EXPECT_EQ(array.itemsize(), 8u);
  EXPECT_EQ(array.data, labels.data);
  EXPECT_TRUE(mentions(error_of([&] { npy_to_tensor(array, MemoryCategory::data, path.str()); }),
                       {path.str(), "<i8"}));

  NpyArray wrong_size{"<f4", {3}, false, std::vector<unsigned char>(8)};
  EXPECT_TRUE(mentions(error_of([&] { write_npy(path.str(), wrong_size); }), {"12 bytes"}));
}

// ---- safetensors ----------------------------------------------------------------------

// A safetensors file: the little-endian header length, `header` padded with spaces
// to a multiple of 8, then `buffer`.
std::string safetensors_file(std::string header, const std::string& buffer) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return bytes + header + buffer;
}

const std::string kSixFloats = little_endian_floats({0, 1, 2, 3, 4, 5});

TEST(Safetensors, WritesTheReferenceImplementationsBytes) {
  // The byte strings the reference implementation's own tests expect
  // (huggingface/safetensors, safetensors/src/tensor.rs: test_serialization,
  // test_serialization_forced_alignement, test_empty), written without checksums.
  TemporaryPath path("reference.safetensors");
  const auto written = [&](const std::vector<std::pair<std::string, Tensor>>& tensors,
                           const std::map<std::string, std::string>& metadata = {}) {
    save_safetensors(path.str(), tensors, metadata, TensorChecksums::none);
    return read_file(path.str());
  };
  const std::vector<float> values = {0, 1, 2, 3, 4, 5};

  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);  // a multiple of 8: no padding
  EXPECT_EQ(written({{"attn.0", Tensor::from_vector(values, {1, 2, 3})}}),
            std::string("\x40\0\0\0\0\0\0\0", 8) + header + kSixFloats);

  const std::string padded = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(padded.size(), 65u);  // padded with 7 spaces to 72
  EXPECT_EQ(written({{"attn0", Tensor::from_vector(values, {1, 1, 2, 3})}}),
            std::string("\x48\0\0\0\0\0\0\0", 8) + padded + std::string(7, ' ') + kSixFloats);

  EXPECT_EQ(written({}), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_EQ(written({}, {{"framework", "pt"}}), std::string("\x28\0\0\0\0\0\0\0", 8) +
                                                    R"({"__metadata__":{"framework":"pt"}})" +
                                                    std::string(5, ' '));
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  TemporaryPath path("hand.safetensors");
  // Tensors listed out of offset order, whitespace, escapes, an empty tensor, metadata.
  const std::string header =
      "{\n  \"b\\u00e9ta\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [24, 32]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"note\": \"a \\\"quoted\\\" \\ud83d\\ude00\"},\n"
      "  \"alpha\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},\n"
      "  \"empty\": {\"dtype\": \"F16\", \"shape\": [0, 4], \"data_offsets\": [32, 32]}\n}";
  const std::int32_t ints[] = {-3, 70000};
  write_file(
      path.str(),
      safetensors_file(header, kSixFloats + std::string(reinterpret_cast<const char*>(ints), 8)));
  const auto tensors = load_safetensors(path.str());
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_EQ(tensors.at("alpha").shape(), (Shape{2, 3}));
  EXPECT_EQ(tensors.at("alpha").to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(tensors.at("alpha").category(), MemoryCategory::parameters);
  EXPECT_EQ(tensors.at("b\xc3\xa9ta").to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{-3, 70000}));
  EXPECT_EQ(tensors.at("empty").dtype(), DType::f16);
  EXPECT_EQ(tensors.at("empty").shape(), (Shape{0, 4}));
  const auto metadata = load_safetensors_metadata(path.str());
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{
                          {"format", "pt"}, {"note", "a \"quoted\" \xf0\x9f\x98\x80"}}));
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  TemporaryPath path("round.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  int seed = 0;
  for (const DType dtype : kAllDTypes) {
    for (const Shape& shape : kShapes) {
      tensors.emplace_back(std::string(dtype_name(dtype)) + shape_string(shape),
                           varied_tensor(shape, dtype, ++seed));
    }
  }
  tensors.emplace_back("needs \"escaping\"\\\n\t\x01 and \xc3\xbcnicode",
                       varied_tensor({3}, DType::f32, 99));
  const std::map<std::string, std::string> metadata = {
      {"step", "1200"}, {"loss scale", "65536"}, {"quote\"", "line\nbreak\x1f"}};
  save_safetensors(path.str(), tensors, metadata);
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));

  // The header length is a multiple of 8 and every tensor starts at a multiple of
  // its element size (the writer orders larger elements first).
  const std::string file = read_file(path.str());
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, file.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);

  const auto loaded = load_safetensors(path.str(), MemoryCategory::checkpoints);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(loaded.count(name), 1u);
    EXPECT_EQ(loaded.at(name).category(), MemoryCategory::checkpoints);
    EXPECT_TRUE(testing::bitwise_equal(loaded.at(name), tensor));
  }
  EXPECT_EQ(load_safetensors_metadata(path.str()), metadata);
}

TEST(Safetensors, LaysTensorsOutByElementSizeThenName) {
  TemporaryPath path("layout.safetensors");
  save_safetensors(path.str(), {{"z_half", varied_tensor({3}, DType::f16, 1)},
                                {"a_half", varied_tensor({1}, DType::f16, 2)},
                                {"m_double", varied_tensor({2}, DType::f64, 3)},
                                {"b_float", varied_tensor({1}, DType::f32, 4)}},
                   {}, TensorChecksums::none);  // the entries alone, as the reference lays them
  const std::string file = read_file(path.str());
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), sizeof header_bytes);
  ASSERT_EQ(file.size(), 8 + header_bytes + (16 + 4 + 2 + 6));
  const std::string header = file.substr(8, header_bytes);
  const auto at = [&](const std::string& text) { return header.find(text); };
  EXPECT_LT(at("m_double"), at("b_float"));
  EXPECT_LT(at("b_float"), at("a_half"));
  EXPECT_LT(at("a_half"), at("z_half"));
  EXPECT_NE(at(R"("m_double":{"dtype":"F64","shape":[2],"data_offsets":[0,16]})"),
            std::string::npos);
  EXPECT_NE(at(R"("b_float":{"dtype":"F32","shape":[1],"data_offsets":[16,20]})"),
            std::string::npos);
  EXPECT_NE(at(R"("a_half":{"dtype":"F16","shape":[1],"data_offsets":[20,22]})"),
            std::string::npos);
  EXPECT_NE(at(R"("z_half":{"dtype":"F16","shape":[3],"data_offsets":[22,28]})"),
            std::string::npos);
}

TEST(Safetensors, RefusesBrokenFilesNamingTheRule) {
  TemporaryPath path("broken.safetensors");
  const auto error_loading = [&](const std::string& bytes) {
    write_file(path.str(), bytes);
    return error_of([&] { load_safetensors(path.str()); });
  };
  const auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                        int begin, int end) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  const std::string twelve(12, '\0');

  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[2]", 0, 8) + "," +
                                                          entry("b", "F32", "[2]", 4, 12) + "}",
                                                      twelve)),
                       {path.str(), "\"b\"", "overlaps", "\"a\""}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[4]", 0, 16) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "\"a\"", "out of range"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[1]", 0, 4) + "," +
                                                          entry("b", "F32", "[1]", 8, 12) + "}",
                                                      twelve)),
                       {path.str(), "gap", "[4, 8)"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[1]", 0, 4) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "cover only 4 of the 8"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[3]", 0, 8) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "needs 12 bytes"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[2]", 8, 4) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "ends before it begins"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "Q7", "[2]", 0, 8) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "unknown dtype \"Q7\""}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[2.5]", 0, 8) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "integers"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[1]", 0, 4) + "," +
                                                          entry("a", "F32", "[1]", 4, 8) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "duplicate key \"a\""}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{\"a\":{\"dtype\":\"F32\"}}", "")),
                       {path.str(), "\"a\"", "needs"}));
  EXPECT_TRUE(
      mentions(error_loading(safetensors_file("{\"a\" 1}", "")), {path.str(), "malformed"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("[1, 2]", "")), {path.str(), "'{'"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{\"__metadata__\":{\"k\":1}}", "")),
                       {path.str(), "must be a string"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{\"\xff\":1}", "")), {path.str(), "UTF-8"}));
  // The limits the library leaves to its user: nesting depth and integers beyond int64.
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{\"__metadata__\":" + deep + "}", "")),
                       {path.str(), "deeper than 64"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file(
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9223372036854775808]}})",
                           std::string(8, '\0'))),
                       {path.str(), "\"a\": data_offsets holds an integer too large"}));
  EXPECT_TRUE(mentions(error_loading(safetensors_file("{" + entry("a", "F32", "[-2]", 0, 8) + "}",
                                                      std::string(8, '\0'))),
                       {path.str(), "non-negative"}));

  // Truncations: inside the length, inside the header, inside the buffer.
  save_safetensors(path.str(), {{"w", varied_tensor({4, 5}, DType::f32, 7)}});
  const std::string valid = read_file(path.str());
  EXPECT_TRUE(mentions(error_loading(valid.substr(0, 5)), {path.str(), "truncated"}));
  EXPECT_TRUE(mentions(error_loading(valid.substr(0, 20)), {path.str(), "truncated"}));
  EXPECT_TRUE(mentions(error_loading(valid.substr(0, valid.size() - 1)),
                       {path.str(), "\"w\"", "out of range"}));
  EXPECT_TRUE(mentions(error_loading(valid + "x"), {path.str(), "cover only"}));
  std::string huge_header = valid;
  huge_header[5] = '\x01';  // header length 2^40
  EXPECT_TRUE(mentions(error_loading(huge_header), {path.str(), "100 MB"}));
  EXPECT_TRUE(mentions(error_of([] { load_safetensors("/nonexistent/w.safetensors"); }),
                       {"/nonexistent/w.safetensors", "cannot open"}));
}

TEST(Safetensors, RefusesToWriteNamesThatAreNotUtf8) {
  TemporaryPath path("latin1.safetensors");
  EXPECT_THROW(save_safetensors(path.str(), {{"b\xe9ta", varied_tensor({1}, DType::f32, 1)}}),
               std::invalid_argument);
  EXPECT_THROW(save_safetensors(path.str(), {}, {{"note", "caf\xe9"}}), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(path.str()));
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
}

// ---- the JSON rules every reader and writer shares (common/json.hpp) ----

TEST(Json, WritesAFloatWithItsShortestDigits) {
  EXPECT_EQ(json_float(0.1f).dump(), "0.1");  // the double 0.1f is 0.100000001490116...
  EXPECT_EQ(json_float(1e-3f).dump(), "0.001");
  EXPECT_EQ(json_float(1073741824.0f).dump(), "1073741824.0");  // 2^30, exactly
  EXPECT_EQ(json_float(-3.4028235e38f).dump(), "-3.4028235e+38");
  EXPECT_EQ(json_float(1.17549435e-38f).dump(), "1.1754944e-38");
  EXPECT_EQ(json_float(std::numeric_limits<float>::quiet_NaN()).dump(), "null");
  EXPECT_EQ(json_float(-std::numeric_limits<float>::infinity()).dump(), "null");
  // Read back, every one of these digit strings is the float it came from.
  for (const float value : {0.1f, 1e-3f, 0.3159999847f, 65504.0f, 5.96046448e-8f}) {
    EXPECT_EQ(static_cast<float>(Json::parse(json_float(value).dump()).get<double>()), value);
  }
}

TEST(Json, ParsingLimitsDepthAndRefusesRepeatedKeys) {
  const auto problem = [](const std::string& text, int depth) {
    return error_of([&] { parse_json_limited(text, depth, "test.json"); });
  };
  EXPECT_EQ(parse_json_limited(R"({"a":{"a":1},"b":[{"a":2}]})", 3, "x").dump(),
            R"({"a":{"a":1},"b":[{"a":2}]})");  // one key in different objects is fine
  EXPECT_TRUE(mentions(problem(R"({"a":1,"b":{"c":2,"c":3}})", 8), {"test.json", "duplicate key \"c\""}));
  EXPECT_TRUE(mentions(problem("[[[1]]]", 2), {"test.json", "deeper than 2"}));
  EXPECT_EQ(parse_json_limited("[[1]]", 2, "x").dump(), "[[1]]");
  EXPECT_TRUE(mentions(problem(R"({"a" 1})", 8), {"test.json", "parse error"}));
  // A number beyond a double is a malformed text too (the fuzzer's find: the library
  // threw its own out_of_range, which no loader's caller expects).
  for (const std::string text : {R"({"a":1e400})", R"({"a":291e79017})", "[-1e999]"}) {
    try {
      parse_json_limited(text, 8, "test.json");
      ADD_FAILURE() << text << " was read";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(mentions(e.what(), {"test.json", "number overflow"})) << e.what();
    }
  }
}

TEST(Safetensors, ValidatesButRefusesToLoadDtypesWithoutATensorType) {
  TemporaryPath path("i16.safetensors");
  write_file(
      path.str(),
      safetensors_file(
          R"({"__metadata__":{"format":"pt"},"w":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})",
          std::string(4, '\0')));
  EXPECT_EQ(load_safetensors_metadata(path.str()),
            (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_TRUE(
      mentions(error_of([&] { load_safetensors(path.str()); }), {path.str(), "\"w\"", "I16"}));
}

// PyTorch's bfloat16 tensors are saved as "BF16": the bits of each value, little-endian.
TEST(Safetensors, ReadsBf16AsPyTorchWritesIt) {
  TemporaryPath path("bf16.safetensors");
  // 1.0 = 0x3F80, -2.5 = 0xC020 (bf16 bits), stored low byte first.
  write_file(path.str(),
             safetensors_file(
                 R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
                 std::string("\x80\x3f\x20\xc0", 4)));
  const Tensor w = load_safetensors(path.str()).at("w");
  EXPECT_EQ(w.dtype(), DType::bf16);
  EXPECT_EQ(testing::to_doubles(w), (std::vector<double>{1.0, -2.5}));
}

// ---- checksums ----------------------------------------------------------------------------

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's) one bit at a time:
/// the definition, computed here without zlib.
std::uint32_t crc32_by_definition(const std::string& bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (const char byte : bytes) {
    crc ^= static_cast<unsigned char>(byte);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::string hex8(std::uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", value);
  return text;
}

TEST(Safetensors, RecordsEachTensorsCrc32InTheMetadata) {
  // The CRC of "123456789" is the standard check value of CRC-32.
  ASSERT_EQ(crc32_by_definition("123456789"), 0xCBF43926u);
  TemporaryPath path("checksums.safetensors");
  const Tensor weight = varied_tensor({5, 3}, DType::f32, 21);
  const Tensor half = varied_tensor({7}, DType::f16, 22);
  const Tensor empty = Tensor::zeros({0, 4}, DType::f32);
  save_safetensors(path.str(), {{"weight", weight}, {"half", half}, {"empty", empty}},
                   {{"step", "3"}});
  const std::string file = read_file(path.str());
  for (const auto& [name, tensor] : {std::pair<std::string, Tensor>{"weight", weight},
                                     {"half", half}, {"empty", empty}}) {
    const std::string entry =
        "\"crc32." + name + "\":\"" + hex8(crc32_by_definition(bytes_of(tensor))) + "\"";
    EXPECT_NE(file.find(entry), std::string::npos) << entry << " in " << file.substr(8, 300);
  }
  // The checksums are the file's own: the metadata read back is the caller's.
  EXPECT_EQ(load_safetensors_metadata(path.str()),
            (std::map<std::string, std::string>{{"step", "3"}}));
  EXPECT_TRUE(mentions(error_of([&] {
                         save_safetensors(path.str(), {{"w", weight}}, {{"crc32.w", "0"}});
                       }),
                       {"metadata key \"crc32.w\" is reserved"}));
}

TEST(Safetensors, RefusesATensorWhoseBytesChanged) {
  TemporaryPath path("flipped.safetensors");
  const Tensor weight = varied_tensor({5, 3}, DType::f32, 23);
  const Tensor half = varied_tensor({7}, DType::f16, 24);
  save_safetensors(path.str(), {{"weight", weight}, {"half", half}});
  const std::string good = read_file(path.str());
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data(), sizeof header_bytes);
  // The layout puts the f32 tensor first: weight at [0, 60), half at [60, 74).
  for (const auto& [offset, name] :
       {std::pair<std::size_t, std::string>{0, "weight"}, {37, "weight"}, {59, "weight"},
        {60, "half"}, {73, "half"}}) {
    for (const int bit : {0, 7}) {
      std::string bad = good;
      bad[8 + header_bytes + offset] = static_cast<char>(bad[8 + header_bytes + offset] ^ (1 << bit));
      write_file(path.str(), bad);
      EXPECT_TRUE(mentions(error_of([&] { load_safetensors(path.str()); }),
                           {path.str(), "tensor \"" + name + "\" is damaged"}))
          << "byte " << offset << " bit " << bit;
      // The header alone is still whole: the metadata reads.
      EXPECT_NO_THROW(load_safetensors_metadata(path.str()));
    }
  }
  write_file(path.str(), good);
  EXPECT_TRUE(testing::bitwise_equal(load_safetensors(path.str()).at("half"), half));
}

TEST(Safetensors, RefusesChecksumsThatAreMalformedOrNameNoTensor) {
  TemporaryPath path("bad_checksum.safetensors");
  const auto error_loading = [&](const std::string& metadata) {
    write_file(path.str(),
               safetensors_file(R"({"__metadata__":{)" + metadata +
                                    R"(},"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})",
                                kSixFloats));
    return error_of([&] { load_safetensors(path.str()); });
  };
  const std::string right = hex8(crc32_by_definition(kSixFloats));
  EXPECT_EQ(error_loading(R"("crc32.a":")" + right + "\""), "");
  EXPECT_TRUE(mentions(error_loading(R"("crc32.a":"123")"), {"\"crc32.a\" must be 8 hex digits"}));
  EXPECT_TRUE(mentions(error_loading(R"("crc32.a":"1234567g")"), {"must be 8 hex digits"}));
  EXPECT_TRUE(mentions(error_loading(R"("crc32.a":")" + right + R"(","crc32.b":"00000000")"),
                       {"a checksum of \"b\", no tensor"}));
  EXPECT_TRUE(mentions(error_loading(R"("crc32.a":"00000000")"), {"tensor \"a\" is damaged"}));
}

TEST(Safetensors, AFailedSaveLeavesThePreviousFileIntact) {
  TemporaryPath path("atomic.safetensors");
  const Tensor weights = varied_tensor({3, 2}, DType::f32, 5);
  save_safetensors(path.str(), {{"w", weights}}, {{"step", "1"}});
  const std::string before = read_file(path.str());

  // Refused before anything is written: duplicate names, a reserved or empty name.
  EXPECT_TRUE(mentions(error_of([&] {
                         save_safetensors(path.str(), {{"w", weights}, {"w", weights}});
                       }),
                       {"two tensors are named \"w\""}));
  EXPECT_THROW(save_safetensors(path.str(), {{"__metadata__", weights}}), std::invalid_argument);
  EXPECT_THROW(save_safetensors(path.str(), {{"", weights}}), std::invalid_argument);
  EXPECT_THROW(save_safetensors(path.str(), {{"undefined", Tensor()}}), std::invalid_argument);
  // The write itself fails (the temporary file's name is taken by a folder).
  std::filesystem::create_directory(path.str() + ".tmp");
  EXPECT_TRUE(mentions(error_of([&] {
                         save_safetensors(path.str(), {{"w", Tensor::zeros({9}, DType::f32)}});
                       }),
                       {path.str() + ".tmp", "cannot create"}));
  std::filesystem::remove(path.str() + ".tmp");

  EXPECT_EQ(read_file(path.str()), before);
  EXPECT_TRUE(testing::bitwise_equal(load_safetensors(path.str()).at("w"), weights));
}

TEST(Safetensors, SavesCudaTensorsThroughTheHost) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  TemporaryPath path("cuda.safetensors");
  const Tensor host = varied_tensor({17, 5}, DType::f16, 8);
  save_safetensors(path.str(), {{"w", host.to(Device::cuda())}});
  EXPECT_TRUE(testing::bitwise_equal(load_safetensors(path.str()).at("w"), host));

  TemporaryPath npy_path("cuda.npy");
  write_npy(npy_path.str(), host.to(Device::cuda()));
  EXPECT_TRUE(testing::bitwise_equal(npy_to_tensor(read_npy(npy_path.str())), host));
}

}  // namespace
}  // namespace bigbatch
