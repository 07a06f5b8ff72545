// snapshot.hpp: saved training state, so that a run interrupted at any moment continues
// to the same bits as if it had never stopped.
//
// A snapshot is one file, DIR/step-NNNNNNNN.safetensors (NNNNNNNN: the steps done), with
// the model's state_dict ("model.<name>"), the optimizer's state ("optimizer.<name>") and,
// in the metadata, the trainer's and the loss scaler's counters and every setting the
// trajectory depends on ("config.<flag>"). Writing is atomic: a file named
// step-*.safetensors is always complete. The newest `keep` are kept. Tensors and metadata
// carry CRC-32s: a snapshot damaged on disk or edited is refused, naming the file and what
// is wrong, instead of resumed. One run at a time writes to a folder (an flock on
// DIR/.lock, which records the holder's pid; a second run is refused with that pid).
//
// Why and how: docs/internals.md#chapterstrainsnapshothpp
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chapters/train/run_settings.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/network.hpp"
#include "nn/training.hpp"

namespace bigbatch::train {

/// A snapshot that this run cannot continue from: names the setting and both values.
class SnapshotMismatchError : public std::runtime_error {
 public:
  SnapshotMismatchError(std::string setting, const std::string& message)
      : std::runtime_error(message), setting_(std::move(setting)) {}
  /// The setting that differs, or that one side lacks ("lr", "ranks").
  const std::string& setting() const { return setting_; }

 private:
  std::string setting_;
};

/// A snapshot folder that another process holds (SnapshotFolderLock): names the folder
/// and the holder's pid.
class SnapshotFolderInUse : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SnapshotFile {
  std::string path;
  std::int64_t step = 0;  ///< steps done when it was written
};

/// The snapshots in `dir`, oldest first (an empty list when there is none).
std::vector<SnapshotFile> list_snapshots(const std::string& dir);

/// True when `path` is a whole bigbatch snapshot: its header reads, it says it is one,
/// and every tensor's bytes match their checksum. Changes nothing.
bool snapshot_is_intact(const std::string& path);

/// An advisory lock on a snapshot folder (DIR/.lock, created if missing, holding the pid
/// of the process that has it), held while the object lives.
class SnapshotFolderLock {
 public:
  /// Takes the lock on the existing folder `dir`, or throws SnapshotFolderInUse when
  /// another process has it (std::runtime_error when the lock file cannot be opened).
  explicit SnapshotFolderLock(const std::string& dir);
  ~SnapshotFolderLock();
  SnapshotFolderLock(SnapshotFolderLock&& other) noexcept;
  SnapshotFolderLock& operator=(SnapshotFolderLock&&) = delete;
  SnapshotFolderLock(const SnapshotFolderLock&) = delete;
  SnapshotFolderLock& operator=(const SnapshotFolderLock&) = delete;

 private:
  int fd_ = -1;
};

class Snapshots {
 public:
  /// Snapshots in `dir` (created if missing), keeping the newest `keep` (>= 1); holds the
  /// folder's lock (SnapshotFolderInUse when another run has it).
  Snapshots(std::string dir, std::int64_t keep);

  /// Writes the snapshot of the trainer's steps done (atomically, see above), removes
  /// older ones beyond `keep` and leftover temporary files; returns its path. The file it
  /// writes is never among those removed: a later step's file in the folder (not this
  /// run's) is left alone, not counted as newer.
  std::string write(const nn::Network& model, const nn::Optimizer& optimizer,
                    const Trainer& trainer, const RunConfig& config) const;

  /// The snapshots in the folder, oldest first (an empty list when there is none).
  std::vector<SnapshotFile> list() const { return list_snapshots(dir_); }
  std::optional<SnapshotFile> latest() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::int64_t keep_;
  SnapshotFolderLock lock_;
};

/// Continues a run from a snapshot file: checks that every setting of `config` has the
/// snapshot's value (SnapshotMismatchError naming the first that differs, or is missing on
/// either side), then loads the model's and optimizer's tensors and the trainer's
/// counters. Throws std::runtime_error naming the file for a damaged (a checksum that
/// differs or is missing, counters that disagree) or foreign file; nothing is changed
/// unless everything checks.
/// The settings named in `may_change` may hold another value (both sides must have
/// them): returned, with the snapshot's values, those that do.
RunConfig restore_snapshot(const std::string& path, nn::Network& model,
                           nn::Optimizer& optimizer, Trainer& trainer, const RunConfig& config,
                           const std::set<std::string>& may_change = {});

}  // namespace bigbatch::train
