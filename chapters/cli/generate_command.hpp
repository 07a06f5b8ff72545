// generate_command.hpp: `bigbatch generate`: the text a GPT trained by `bigbatch train
// --model gpt --save FILE` writes after a prompt (nn/generate.hpp), greedy or sampled.
#pragma once

#include <string>

#include "common/device.hpp"
#include "nn/generate.hpp"

namespace CLI {
class App;  // CLI11's, included by generate_command.cpp (options.hpp says why)
}  // namespace CLI

namespace bigbatch::cli {

/// The flags of `bigbatch generate`.
struct GenerateOptions {
  std::string init;                ///< --init: the GPT's parameters (its shape in the metadata)
  std::string prompt;              ///< --prompt: the text to continue, as bytes
  nn::SamplingOptions sampling;    ///< --tokens, --temperature, --seed
  Device device;                   ///< --device
};

/// Adds --init, --prompt, --tokens, --temperature, --seed and --device to `generate`.
void add_generate_flags(CLI::App& generate, GenerateOptions& options);

/// Prints the prompt and the bytes the model writes after it; returns the exit code. Throws
/// UsageError (exit code 2) for a file that is not such a GPT, or a prompt it cannot read.
int run_generate(const GenerateOptions& options);

}  // namespace bigbatch::cli
