// output_files.cpp: the rule of output_files.hpp.
#include "chapters/cli/output_files.hpp"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "chapters/cli/setup.hpp"

namespace bigbatch::cli {
namespace {

namespace fs = std::filesystem;

/// What a path of this status is, in words, when it is there and not a regular file; ""
/// for a regular file or nothing.
std::string not_a_regular_file(fs::file_type type) {
  switch (type) {
    case fs::file_type::regular:
    case fs::file_type::not_found: return "";
    case fs::file_type::directory: return "a folder";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a pipe";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

/// The file a write to `path` lands on: `path`, or the file a link names, followed link
/// by link (one that names nothing yet: where it points).
fs::path write_target(const NamedFile& named) {
  fs::path target = named.path;
  std::error_code error;
  for (int links = 0; fs::is_symlink(fs::symlink_status(target, error)); ++links) {
    if (links == 40) throw UsageError(named.flag + ": " + named.path + " is a loop of links");
    const fs::path next = fs::read_symlink(target, error);
    if (error) throw UsageError(named.flag + ": cannot read the link " + target.string());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target;
}

/// Whether two targets are one file: the same file where both exist (a hard link too),
/// else the same absolute path.
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) return fs::equivalent(a, b, error);
  return fs::weakly_canonical(fs::absolute(a, error), error) ==
         fs::weakly_canonical(fs::absolute(b, error), error);
}

/// Refuses `target` (what `named` writes) unless its folder exists and takes a new file.
void check_folder_takes_a_file(const NamedFile& named, const fs::path& target) {
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code error;
  if (!fs::is_directory(folder, error)) {
    throw UsageError(named.flag + ": cannot write " + named.path + ": the folder " +
                     folder.string() + " does not exist");
  }
  const std::string probe = target.string() + ".tmp";
  std::ofstream out(probe);
  if (!out) {
    throw UsageError(named.flag + ": cannot write " + named.path + ": the folder " +
                     folder.string() + " takes no new file");
  }
  out.close();
  fs::remove(probe, error);
}

}  // namespace

std::vector<std::string> check_output_files(const std::vector<NamedFile>& outputs,
                                            const std::vector<NamedFile>& inputs) {
  std::vector<fs::path> read;
  for (const NamedFile& input : inputs) read.push_back(write_target(input));
  std::vector<fs::path> written;
  std::vector<std::string> targets;
  for (const NamedFile& output : outputs) {
    const fs::path target = write_target(output);
    std::error_code error;
    const std::string kind = not_a_regular_file(fs::status(target, error).type());
    if (!kind.empty()) {
      throw UsageError(output.flag + ": " + output.path + " is " + kind + ", and " +
                       output.flag + " writes a regular file: name one");
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (same_file(target, read[i])) {
        throw UsageError(output.flag + ": " + output.path + " is the file " + inputs[i].flag +
                         " reads; writing it would destroy it: name another file");
      }
    }
    for (std::size_t i = 0; i < written.size(); ++i) {
      if (same_file(target, written[i])) {
        throw UsageError(outputs[i].flag + " and " + output.flag + " both name " +
                         output.path + ", and one would overwrite the other: give each its "
                         "own file");
      }
    }
    check_folder_takes_a_file(output, target);
    written.push_back(target);
    targets.push_back(target.string());
  }
  return targets;
}

std::vector<std::string> files_of(const DataSource& source) {
  switch (source.kind) {
    case DataKind::npy: return {source.features_file, source.labels_file};
    case DataKind::text:
    case DataKind::tokens: return {source.file};
    default: return {};
  }
}

}  // namespace bigbatch::cli
