// generate_command.cpp: `bigbatch generate`.
#include "chapters/cli/generate_command.hpp"

#include <CLI/CLI.hpp>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chapters/cli/options.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/stop_signals.hpp"
#include "common/io/safetensors.hpp"
#include "common/memory.hpp"
#include "nn/gpt.hpp"

namespace bigbatch::cli {
namespace {

/// The GPT's shape from the metadata nn::Gpt::save writes; UsageError when it is not there.
nn::GptConfig shape_of(const std::string& path) {
  std::map<std::string, std::string> metadata;
  try {
    metadata = load_safetensors_metadata(path);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--init: ") + e.what());
  }
  const auto format = metadata.find("format");
  if (format == metadata.end() || format->second != "bigbatch GPT") {
    throw UsageError("--init: " + path + " holds no GPT written by `bigbatch train --model gpt "
                     "--save` (its metadata has no \"format\": \"bigbatch GPT\")");
  }
  const auto number = [&](const std::string& key) {
    const auto found = metadata.find(key);
    std::int64_t value = 0;
    const std::string text = found == metadata.end() ? "" : found->second;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (found == metadata.end() || error != std::errc() || end != text.data() + text.size()) {
      throw UsageError("--init: " + path + "'s metadata has no whole number \"" + key + "\"");
    }
    return value;
  };
  nn::GptConfig shape;
  shape.vocabulary = number("vocabulary");
  shape.context = number("context");
  shape.layers = number("layers");
  shape.width = number("width");
  shape.heads = number("heads");
  return shape;
}

}  // namespace

void add_generate_flags(CLI::App& generate, GenerateOptions& o) {
  generate.add_option("--init", o.init, "the GPT to sample, from bigbatch train --model gpt --save")
      ->required();
  generate.add_option("--prompt", o.prompt, "the text to continue (its bytes are the tokens)")
      ->required();
  generate.add_option("--tokens", o.sampling.tokens,
                      "bytes to write after the prompt, each printed as it is drawn (SIGINT "
                      "stops after the byte being drawn)")
      ->capture_default_str()
      ->check(whole_number_from(0));
  generate.add_option("--temperature", o.sampling.temperature,
                      "0: always the most likely byte (greedy); else draw from the softmax of "
                      "the logits divided by it (below 1 sharper, above 1 flatter)")
      ->capture_default_str()
      ->check(real_number_in(0.0, 100.0, "from 0 to 100"));
  add_seed_option(generate, o.sampling.seed, "the draws' seed (the same seed, the same text)");
  generate.add_option_function<std::string>(
      "--device", [&o](const std::string& text) { o.device = parse_device(text); },
      "cpu, cuda or cuda:N")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              parse_device(text);
              return {};
            } catch (const std::invalid_argument& e) {
              return e.what();
            }
          },
          "DEVICE"))
      ->default_str("cpu");
}

int run_generate(const GenerateOptions& options) {
  TrainOptions device_only;
  device_only.source.device = options.device;
  const Device device = available_device(device_only);
  const nn::GptConfig shape = shape_of(options.init);
  if (shape.vocabulary > 256) {  // trained on a tokens: file of another tokenizer's ids
    throw UsageError("--init: " + options.init + " has a vocabulary of " +
                     std::to_string(shape.vocabulary) + " token ids: generate reads and writes "
                     "byte tokens (a vocabulary of at most 256)");
  }
  // The file's tensors before the model: the parameters its metadata describes must be the
  // ones it holds, so that an edited size ("context": 10^12) cannot make the model ask for
  // more memory than the file itself justifies.
  std::optional<nn::Gpt> built;
  try {
    const std::map<std::string, Tensor> tensors = load_safetensors(options.init);
    std::int64_t held = 0;
    for (const auto& [name, tensor] : tensors) held += tensor.numel();
    const std::int64_t described = nn::gpt_parameter_count(shape);
    if (described != held) {
      throw UsageError("--init: " + options.init + "'s metadata describes a GPT of " +
                       std::to_string(described) + " parameters, and its tensors hold " +
                       std::to_string(held));
    }
    built.emplace(shape, device);
    built->load_state_dict(tensors, options.init);
  } catch (const UsageError&) {
    throw;
  } catch (const OutOfMemoryError&) {
    throw;  // exit 3: the model is larger than the device
  } catch (const std::exception& e) {
    throw UsageError(std::string("--init: ") + e.what());
  }
  if (options.prompt.empty()) throw UsageError("--prompt: give at least one character");
  std::vector<std::int32_t> prompt;
  for (const char c : options.prompt) {
    const int byte = static_cast<unsigned char>(c);
    if (byte >= shape.vocabulary) {
      throw UsageError("--prompt: its byte " + std::to_string(byte) + " is past the model's "
                       "vocabulary of " + std::to_string(shape.vocabulary) + " bytes");
    }
    prompt.push_back(byte);
  }
  if (static_cast<std::int64_t>(prompt.size()) > shape.context) {
    std::cerr << "bigbatch generate: note: the prompt has " << prompt.size()
              << " bytes and the model's context is " << shape.context
              << ": it reads the last " << shape.context << "\n";
  }
  // Each byte printed as it is drawn; SIGINT or SIGTERM stops after the byte being drawn,
  // what was written kept on the screen.
  std::cout << options.prompt << std::flush;
  const StopSignals signals;
  const std::int64_t drawn =
      nn::generate(*built, prompt, options.sampling, [](std::int32_t token) {
        std::cout.put(static_cast<char>(token)).flush();
        return StopSignals::received() == 0;
      });
  std::cout << "\n";
  if (StopSignals::received() != 0) {
    std::cerr << "bigbatch generate: stopped by "
              << (StopSignals::received() == SIGINT ? "SIGINT" : "SIGTERM") << " after " << drawn
              << " of " << options.sampling.tokens << " bytes\n";
    return 128 + StopSignals::received();
  }
  return 0;
}

}  // namespace bigbatch::cli
