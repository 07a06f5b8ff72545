// snapshot.hpp: saved training state, so that a run interrupted at any moment continues
// to the same bits as if it had never stopped.
//
// A snapshot is one file, DIR/step-NNNNNNNN.safetensors (NNNNNNNN: the steps done), that
// holds everything the run's future depends on:
//   tensors   "model.<name>"      the model's state_dict (f32: the masters under fp16,
//                                 BatchNorm's running statistics)
//             "optimizer.<name>"  the optimizer's state (momentum, Adam's moments)
//   metadata  the safetensors header's "__metadata__" (a small JSON object of strings):
//             "format", the trainer's counters ("state.steps_done", ...), the dynamic
//             loss scaler's scale and counters, and the run's configuration
//             ("config.<flag>": the value of every setting the trajectory depends on)
// The data order, the dropout masks and the learning rate are pure functions of the
// counters and the configuration, so nothing else is needed.
//
// Writing is atomic: save_safetensors writes a temporary file, fsyncs it, renames it to
// its name and fsyncs the folder, so a file named step-*.safetensors is always complete:
// a process killed at any moment, mid-write included, leaves the previous snapshots
// whole (and at most a *.tmp file, removed by the next write). The newest `keep` are kept.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "chapters/train/trainer.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::train {

/// The settings a run's trajectory depends on, by flag name ("batch" -> "64"). A snapshot
/// continues only under the same ones.
using RunConfig = std::map<std::string, std::string>;

/// A snapshot that this run cannot continue from: names the setting and both values.
class SnapshotMismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SnapshotFile {
  std::string path;
  std::int64_t step = 0;  ///< steps done when it was written
};

class Snapshots {
 public:
  /// Snapshots in `dir` (created if missing), keeping the newest `keep` (>= 1).
  Snapshots(std::string dir, std::int64_t keep);

  /// Writes the snapshot of the trainer's steps done (atomically, see above), removes
  /// older ones beyond `keep` and leftover temporary files; returns its path.
  std::string write(const nn::Model& model, const nn::Optimizer& optimizer,
                    const Trainer& trainer, const RunConfig& config) const;

  /// The snapshots in the folder, oldest first (an empty list when there is none).
  std::vector<SnapshotFile> list() const;
  std::optional<SnapshotFile> latest() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::int64_t keep_;
};

/// Continues a run from a snapshot file: checks that every setting of `config` has the
/// snapshot's value (SnapshotMismatchError naming the first that differs, or is missing on
/// either side), then loads the model's and optimizer's tensors and the trainer's
/// counters. Throws std::runtime_error naming the file for a damaged or foreign file;
/// nothing is changed unless everything checks.
void restore_snapshot(const std::string& path, nn::Model& model, nn::Optimizer& optimizer,
                      Trainer& trainer, const RunConfig& config);

}  // namespace bigbatch::train
