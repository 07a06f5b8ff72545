// snapshot.cpp: writing, finding and restoring snapshots (snapshot.hpp).
#include "chapters/train/snapshot.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "common/io/safetensors.hpp"

namespace bigbatch::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "bigbatch snapshot 1";
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";
/// The metadata key of the header's own checksum: the CRC-32 of every other entry (the
/// settings, the counters, the scaler's state), as "key=value" lines in key order.
constexpr const char* kHeaderChecksum = "snapshot.crc32";

std::string header_checksum(const std::map<std::string, std::string>& metadata) {
  std::string text;
  for (const auto& [key, value] : metadata) {
    if (key == kHeaderChecksum) continue;
    text += key + "=" + value + "\n";
  }
  return crc32_text(text.data(), text.size());
}

/// Throws std::runtime_error naming `path` unless its header carries the checksum of its
/// settings and counters, and they still have it.
void check_header(const std::map<std::string, std::string>& metadata, const std::string& path) {
  const auto recorded = metadata.find(kHeaderChecksum);
  if (recorded == metadata.end()) {
    throw std::runtime_error(path + ": its settings and counters carry no checksum (no \"" +
                             std::string(kHeaderChecksum) + "\"): written by an older bigbatch, or "
                             "edited");
  }
  const std::string crc = header_checksum(metadata);
  if (crc != recorded->second) {
    throw std::runtime_error(path + ": its settings and counters are damaged: they have "
                             "CRC-32 " + crc + ", the file recorded " + recorded->second);
  }
}

/// The shortest text that reads back as the same value (std::to_chars).
template <class T>
std::string exact_text(T value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

/// "step-00000040.safetensors" -> 40; nullopt for any other name.
std::optional<std::int64_t> step_of(const std::string& name) {
  const std::string prefix = "step-", suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size() - suffix.size();
  std::int64_t step = 0;
  const auto [end, error] = std::from_chars(first, last, step);
  if (error != std::errc() || end != last || step < 0) return std::nullopt;
  return step;
}

std::string file_name(std::int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%08lld.safetensors", static_cast<long long>(step));
  return name;
}

template <class T>
T read_number(const std::map<std::string, std::string>& metadata, const std::string& key,
              const std::string& path) {
  const auto found = metadata.find(key);
  if (found == metadata.end()) {
    throw std::runtime_error(path + ": not a complete bigbatch snapshot (no \"" + key + "\")");
  }
  T value{};
  const std::string& text = found->second;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw std::runtime_error(path + ": \"" + key + "\" is '" + text + "', not a number");
  }
  return value;
}

/// `dir`, created if missing: the folder a Snapshots object locks.
const std::string& created_folder(const std::string& dir, std::int64_t keep) {
  BIGBATCH_CHECK(keep >= 1, "Snapshots: keep must be >= 1, got ", keep);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error || !fs::is_directory(dir)) {
    throw std::runtime_error("cannot create the snapshot folder " + dir + ": " +
                             (error ? error.message() : "not a folder"));
  }
  return dir;
}

}  // namespace

SnapshotFolderLock::SnapshotFolderLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot open the snapshot folder's lock " + path + ": " +
                             std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[32] = {};
    const ssize_t got = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK) {
      throw std::runtime_error("cannot lock the snapshot folder " + dir + ": " +
                               std::strerror(error));
    }
    std::string pid = got > 0 ? std::string(holder, static_cast<std::size_t>(got)) : "";
    pid.erase(std::remove(pid.begin(), pid.end(), '\n'), pid.end());
    throw SnapshotFolderInUse("the snapshot folder " + dir + " is in use by another run (pid " +
                              (pid.empty() ? std::string("unknown") : pid) +
                              "); wait for it to end, or give this run another folder");
  }
  // Ours now: record who holds it, for the message above.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the pid; a refused run then says "pid unknown".
  }
}

SnapshotFolderLock::~SnapshotFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

SnapshotFolderLock::SnapshotFolderLock(SnapshotFolderLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

Snapshots::Snapshots(std::string dir, std::int64_t keep)
    : dir_(std::move(dir)), keep_(keep), lock_(created_folder(dir_, keep_)) {}

std::vector<SnapshotFile> list_snapshots(const std::string& dir) {
  std::vector<SnapshotFile> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    if (const auto step = step_of(entry.path().filename().string())) {
      files.push_back({entry.path().string(), *step});
    }
  }
  std::sort(files.begin(), files.end(),
            [](const SnapshotFile& a, const SnapshotFile& b) { return a.step < b.step; });
  return files;
}

bool snapshot_is_intact(const std::string& path) {
  try {
    const auto metadata = load_safetensors_metadata(path);
    const auto format = metadata.find("format");
    if (format == metadata.end() || format->second != kFormat) return false;
    check_header(metadata, path);
    // Every checksum. Host memory outside the device's count and cap, as a data set's.
    load_safetensors(path, MemoryCategory::host_data, UncheckedTensors::refused);
    return true;
  } catch (const std::runtime_error&) {
    return false;
  }
}

std::optional<SnapshotFile> Snapshots::latest() const {
  const std::vector<SnapshotFile> files = list();
  if (files.empty()) return std::nullopt;
  return files.back();
}

std::string Snapshots::write(const nn::Network& model, const nn::Optimizer& optimizer,
                             const Trainer& trainer, const RunConfig& config) const {
  // A write killed midway leaves its temporary file: nothing names it, remove it now.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        step_of(name.substr(0, name.size() - 4))) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);
    }
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, tensor] : model.state_dict()) {
    tensors.emplace_back(kModelPrefix + name, tensor);
  }
  for (const auto& [name, tensor] : optimizer.state()) {
    tensors.emplace_back(kOptimizerPrefix + name, tensor);
  }
  const TrainerState state = trainer.state();
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"state.steps_done", std::to_string(state.steps_done)},
      {"state.samples_done", std::to_string(state.samples_done)},
      {"state.optimizer_steps", std::to_string(state.optimizer_steps)},
      {"state.skipped_steps", std::to_string(state.skipped_steps)},
  };
  if (state.scaler) {
    metadata["scaler.scale"] = exact_text(state.scaler->scale);
    metadata["scaler.clean_run"] = std::to_string(state.scaler->clean_run);
    metadata["scaler.overflow_run"] = std::to_string(state.scaler->overflow_run);
    metadata["scaler.skipped"] = std::to_string(state.scaler->skipped);
  }
  for (const auto& [key, value] : config) metadata["config." + key] = value;
  metadata[kHeaderChecksum] = header_checksum(metadata);
  const std::string path = (fs::path(dir_) / file_name(state.steps_done)).string();
  save_safetensors(path, tensors, metadata);
  // The newest `keep` stay: this one and the keep - 1 steps before it. A later step's file
  // is not this run's (the program refuses such a folder before training): it is neither
  // counted as newer than this one nor removed.
  std::vector<SnapshotFile> older = list();
  std::erase_if(older, [&](const SnapshotFile& file) { return file.step >= state.steps_done; });
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_ - 1) < older.size(); ++i) {
    std::error_code ignored;
    fs::remove(older[i].path, ignored);
  }
  return path;
}

RunConfig restore_snapshot(const std::string& path, nn::Network& model,
                           nn::Optimizer& optimizer, Trainer& trainer, const RunConfig& config,
                           const std::set<std::string>& may_change) {
  const std::map<std::string, std::string> metadata = load_safetensors_metadata(path);
  const auto format = metadata.find("format");
  if (format == metadata.end() || format->second != kFormat) {
    throw std::runtime_error(path + ": not a bigbatch snapshot (its metadata has no \"format\": \"" +
                             std::string(kFormat) + "\")");
  }
  check_header(metadata, path);  // an edited header is damage, not another setting
  // The configuration first: a mismatch is the user's to fix, and names the setting. The
  // model's kind before the rest: another model's snapshot differs in most of them.
  RunConfig changed;
  std::vector<std::pair<std::string, std::string>> ordered(config.begin(), config.end());
  std::stable_partition(ordered.begin(), ordered.end(),
                        [](const auto& setting) { return setting.first == "model"; });
  for (const auto& [key, value] : ordered) {
    const auto saved = metadata.find("config." + key);
    if (saved == metadata.end()) {
      throw SnapshotMismatchError(key, path + " was written without a value for --" + key +
                                           "; this run has --" + key + " " + value);
    }
    if (saved->second != value && may_change.count(key) != 0) {
      changed[key] = saved->second;
    } else if (saved->second != value) {
      throw SnapshotMismatchError(key, path + " was written with --" + key + " " +
                                           saved->second + ", this run has --" + key + " " +
                                           value + ": resume with the same setting");
    }
  }
  for (const auto& [key, value] : metadata) {
    if (key.rfind("config.", 0) != 0) continue;
    const std::string setting = key.substr(7);
    if (config.count(setting) == 0) {
      throw SnapshotMismatchError(setting, path + " was written with --" + setting + " " + value +
                                               ", a setting this run does not have");
    }
  }
  TrainerState state;
  state.steps_done = read_number<std::int64_t>(metadata, "state.steps_done", path);
  state.samples_done = read_number<std::int64_t>(metadata, "state.samples_done", path);
  state.optimizer_steps = read_number<std::int64_t>(metadata, "state.optimizer_steps", path);
  state.skipped_steps = read_number<std::int64_t>(metadata, "state.skipped_steps", path);
  if (metadata.count("scaler.scale") != 0) {
    state.scaler = loss_scaling::DynamicLossScaler::State{
        read_number<float>(metadata, "scaler.scale", path),
        read_number<std::int64_t>(metadata, "scaler.clean_run", path),
        read_number<std::int64_t>(metadata, "scaler.overflow_run", path),
        read_number<std::int64_t>(metadata, "scaler.skipped", path)};
  }
  // The tensors: every one checked before any is written.
  const std::map<std::string, Tensor> tensors =
      load_safetensors(path, MemoryCategory::parameters, UncheckedTensors::refused);
  std::map<std::string, Tensor> model_tensors;
  std::map<std::string, Tensor> optimizer_tensors;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind(kModelPrefix, 0) == 0) {
      model_tensors.emplace(name.substr(std::string(kModelPrefix).size()), tensor);
    } else if (name.rfind(kOptimizerPrefix, 0) == 0) {
      optimizer_tensors.emplace(name.substr(std::string(kOptimizerPrefix).size()), tensor);
    } else {
      throw std::runtime_error(path + ": tensor " + name + " belongs to no part of a run");
    }
  }
  const auto optimizer_state = optimizer.state();
  if (optimizer_state.size() != optimizer_tensors.size()) {
    throw std::runtime_error(path + ": " + std::to_string(optimizer_tensors.size()) +
                             " optimizer tensors, this optimizer has " +
                             std::to_string(optimizer_state.size()));
  }
  for (const auto& [name, tensor] : optimizer_state) {
    const auto found = optimizer_tensors.find(name);
    if (found == optimizer_tensors.end() || !found->second.same_shape(tensor) ||
        found->second.dtype() != tensor.dtype()) {
      throw std::runtime_error(path + ": optimizer state " + name + " is missing or is not " +
                               tensor.describe());
    }
  }
  // The trainer's counters are checked (and set) first, the model's tensors next; a
  // failure there puts the counters back, so nothing has changed.
  const TrainerState before = trainer.state();
  try {
    trainer.restore(state);
  } catch (const std::invalid_argument& e) {  // counters that disagree: a damaged file
    throw std::runtime_error(path + ": its counters do not agree (" + e.what() + ")");
  }
  try {
    model.load_state_dict(model_tensors, path);
  } catch (...) {
    trainer.restore(before);
    throw;
  }
  for (const auto& [name, tensor] : optimizer_state) {
    Tensor target = tensor;
    target.copy_from(optimizer_tensors.at(name));
  }
  return changed;
}

}  // namespace bigbatch::train
