// train_command.hpp: `bigbatch train`: trains the model of nn/model.hpp (or, with --model gpt,
// chapter 08's nn/gpt.hpp) on a data set with the trainer of chapters/train/trainer.hpp,
// with snapshots, --resume, --plan auto, the progress line, the log and the memory report.
#pragma once

#include "chapters/cli/options.hpp"

namespace bigbatch::cli {

/// Runs the training the options describe; returns the exit code (0, or 128 + the signal
/// that stopped it). Throws UsageError, NoPlanFits and the trainer's errors.
int run_train(TrainOptions options);

/// The flags --model gpt refuses (UsageError naming the flag): the MLP's shape and data,
/// and what the GPT's run does not have yet; and data that is not token sequences.
void check_gpt_flags(const TrainOptions& options);

/// The flags and data the MLP refuses (UsageError): the GPT's shape, and token sequences.
void check_mlp_flags(const TrainOptions& options);

}  // namespace bigbatch::cli
