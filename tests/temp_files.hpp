// temp_files.hpp: files for tests that write and read them: a path (or a fresh folder)
// under GoogleTest's temporary folder that is removed when the test is done, and
// whole-file reads and writes of raw bytes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

namespace bigbatch::testing {

/// A path under the test temporary folder, unique to this process and test, removed
/// (with a leftover ".tmp" sibling, as an atomic save leaves) when the object dies.
class TemporaryPath {
 public:
  explicit TemporaryPath(const std::string& suffix) {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = ::testing::TempDir() + "bigbatch_test_" + std::to_string(::getpid()) + "_" +
            test->name() + "_" + suffix;
  }
  ~TemporaryPath() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
    std::filesystem::remove_all(path_ + ".tmp", ignored);
  }
  TemporaryPath(const TemporaryPath&) = delete;
  TemporaryPath& operator=(const TemporaryPath&) = delete;
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

/// A fresh, empty folder under the test temporary folder, removed with its contents when
/// the object dies.
class TemporaryDirectory {
 public:
  TemporaryDirectory() : path_("folder") {
    std::filesystem::remove_all(path_.str());
    std::filesystem::create_directories(path_.str());
  }
  /// The path of the file `name` in this folder.
  std::string file(const std::string& name) const { return path_.str() + "/" + name; }
  const std::string& str() const { return path_.str(); }

 private:
  TemporaryPath path_;
};

/// Replaces the file at `path` with `bytes`.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

/// All bytes of the file at `path` ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace bigbatch::testing
