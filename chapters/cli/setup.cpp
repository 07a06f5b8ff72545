// setup.cpp: the run's pieces from the typed options.
#include "chapters/cli/setup.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "chapters/cli/output_files.hpp"
#include "common/cuda_runtime.hpp"
#include "common/format.hpp"
#include "common/integer_math.hpp"
#include "common/memory.hpp"
#include "common/data/text_corpus.hpp"
#include "common/io/safetensors.hpp"
#include "nn/gpt.hpp"
#include "nn/memory_model.hpp"

namespace bigbatch::cli {
namespace {

Dataset load_npy(const DataSource& source) {
  try {
    return load_npy_dataset(source.features_file, source.labels_file);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

std::int64_t Splits::classes() const {
  return std::max(train.num_classes, test ? test->num_classes : 0);
}

Splits load_data(const TrainOptions& options) {
  Splits splits;
  switch (options.source.data.kind) {
    case DataKind::fashion_mnist: {
      const std::string directory = default_fashion_mnist_directory();
      if (!fashion_mnist_available(directory)) {
        throw UsageError("Fashion-MNIST is not installed in " + directory +
                         ": install it with `sudo apt-get install dataset-fashion-mnist`, or "
                         "set BIGBATCH_FASHION_MNIST_DIR to a folder holding the four idx "
                         "files (train-images-idx3-ubyte.gz, ...)");
      }
      try {
        splits.train = load_fashion_mnist(FashionMnistSplit::train, directory);
        splits.test = load_fashion_mnist(FashionMnistSplit::test, directory);
      } catch (const std::runtime_error& e) {  // a damaged file: the user's to replace
        throw UsageError(e.what());
      }
      break;
    }
    case DataKind::synthetic: {
      SyntheticOptions synthetic;
      synthetic.samples = options.source.samples;
      synthetic.features = options.source.features;
      const Dataset all = make_synthetic(synthetic);
      // A deterministic hold-out: the last 10% of the samples.
      const std::int64_t held_out = all.size() / 10;
      splits.train = slice(all, 0, all.size() - held_out);
      if (held_out > 0) splits.test = slice(all, all.size() - held_out, all.size());
      break;
    }
    case DataKind::npy: splits.train = load_npy(options.source.data); break;
    case DataKind::text: {
      const std::string& file = options.source.data.file;
      std::vector<std::string> documents;
      try {
        documents = read_documents(file);
      } catch (const std::runtime_error& e) {
        throw UsageError(std::string("--data: ") + e.what());
      }
      // A deterministic hold-out: every tenth document, so both splits span the file.
      std::vector<std::string> training, held_out;
      for (std::size_t i = 0; i < documents.size(); ++i) {
        (i % 10 == 9 ? held_out : training).push_back(std::move(documents[i]));
      }
      const std::int64_t length = options.gpt.context;
      splits.train = make_token_dataset(make_sequences(training, length), "text:" + file);
      if (!held_out.empty()) {
        splits.test = make_token_dataset(make_sequences(held_out, length),
                                         "text:" + file + " (every tenth document)");
      }
      break;
    }
    case DataKind::tokens: {
      const std::string& file = options.source.data.file;
      TokenFile tokens;
      try {
        tokens = read_token_sequences(file);
      } catch (const std::runtime_error& e) {
        throw UsageError(std::string("--data: ") + e.what());
      }
      if (const std::int64_t T = tokens.sequences.length; T > options.gpt.context) {
        throw UsageError("--data tokens:" + file + " holds rows of " + std::to_string(T + 1) +
                         " tokens, sequences of " + std::to_string(T) + " positions, and "
                         "--seq-len is " + std::to_string(options.gpt.context) +
                         ": give --seq-len " + std::to_string(T) + " or more");
      }
      splits.train = make_token_dataset(tokens.sequences, "tokens:" + file, tokens.largest + 1);
      break;
    }
  }
  // The embedding has a row per token id: every id of the data must have one.
  if (options.source.data.holds_tokens() && splits.classes() > options.gpt.vocabulary) {
    throw UsageError("--data " + options.source.data.text() + " holds token ids up to " +
                     std::to_string(splits.classes() - 1) + " and --vocabulary is " +
                     std::to_string(options.gpt.vocabulary) + ": give --vocabulary " +
                     std::to_string(splits.classes()) + " or more");
  }
  if (const std::int64_t held_out = options.source.validation; held_out > 0) {
    if (options.test_data) {
      throw UsageError("--validation evaluates a split held out of the training data in "
                       "place of the test split: give it or --test-data, not both");
    }
    const std::int64_t n = splits.train.size();
    if (held_out >= n) {
      throw UsageError("--validation " + std::to_string(held_out) + " leaves nothing to "
                       "train on: the training data has " + std::to_string(n) + " samples");
    }
    splits.test = slice(splits.train, n - held_out, n);
    splits.train = slice(splits.train, 0, n - held_out);
    splits.validation = true;
  }
  if (options.test_data) {
    splits.test = load_npy(*options.test_data);
    if (splits.test->feature_dim() != splits.train.feature_dim()) {
      throw UsageError("--test-data has " + std::to_string(splits.test->feature_dim()) +
                       " features per sample, the training data " +
                       std::to_string(splits.train.feature_dim()));
    }
  }
  if (options.output.eval_every > 0 && !splits.test) {
    throw UsageError("--eval-every: --data " + options.source.data.text() + " holds out no "
                     "samples to evaluate: give --test-data or --validation N");
  }
  return splits;
}

Device available_device(const TrainOptions& options) {
  const Device device = options.source.device;
  std::string why_not;
  if (!device.is_cuda()) return device;
  if (!cuda_rt::available(&why_not)) {
    throw UsageError("--device " + device.name() + ": CUDA is not available: " + why_not);
  }
  // Current for the whole run: the allocator and every kernel work on the current device.
  try {
    cuda_rt::use_device(device.index);
  } catch (const std::runtime_error& e) {
    throw UsageError("--device " + device.name() + ": " + e.what());
  }
  return device;
}

double base_learning_rate(const TrainOptions& options) {
  return options.optimizer.lr.value_or(options.optimizer.kind == OptimizerKind::sgd ? 0.05 : 1e-3);
}

nn::Optimizer::Options optimizer_options(const TrainOptions& options) {
  const OptimizerFlags& flags = options.optimizer;
  const double lr = nn::scaled_learning_rate(base_learning_rate(options), flags.lr_scale,
                                             options.train.batch, flags.lr_reference_batch);
  if (flags.kind == OptimizerKind::sgd) {
    SgdOptions sgd;
    sgd.lr = lr;
    sgd.momentum = flags.momentum.value_or(0.9);
    sgd.weight_decay = flags.weight_decay.value_or(0.0);
    return sgd;
  }
  if (flags.momentum) throw UsageError("--momentum applies to --optimizer sgd only");
  AdamWOptions adamw;
  adamw.lr = lr;
  adamw.weight_decay = flags.weight_decay.value_or(1e-2);
  return adamw;
}

nn::ModelConfig model_config(const TrainOptions& options, const Splits& splits) {
  nn::ModelConfig config = options.model;
  config.inputs = splits.train.feature_dim();
  config.classes = splits.classes();
  config.seed = options.train.seed;
  const std::string& init = options.output.init;
  if (init.empty()) return config;

  std::map<std::string, std::string> metadata;
  try {
    metadata = load_safetensors_metadata(init);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--init: ") + e.what());
  }
  if (metadata["format"] != "bigbatch residual MLP") return config;
  const std::string file = "--init " + init + ": ";
  auto whole_number = [&](const std::string& key) {
    std::int64_t value = 0;
    const std::string& text = metadata[key];
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      throw UsageError(file + "the metadata's " + key + " is '" + text + "', not a number");
    }
    return value;
  };
  // A shape flag: taken from the file unless given, refused when given and different.
  auto size_field = [&](const std::string& key, std::int64_t& field) {
    const std::int64_t stored = whole_number(key);
    if (options.was_given("--" + key) && stored != field) {
      throw UsageError(file + "the file's model has " + key + " " + std::to_string(stored) +
                       ", --" + key + " says " + std::to_string(field));
    }
    field = stored;
  };
  size_field("hidden", config.hidden);
  size_field("expansion", config.expansion);
  size_field("depth", config.depth);
  auto word_field = [&](const std::string& key, const auto& named, auto& field) {
    const std::string& stored = metadata[key];
    const auto value = named(stored);
    if (!value) throw UsageError(file + "unknown " + key + " '" + stored + "'");
    if (options.was_given("--" + key) && *value != field) {
      throw UsageError(file + "the file's model has " + key + " " + stored + ", --" + key +
                       " says " + setting_text(field));
    }
    field = *value;
  };
  word_field("norm", norm_named, config.norm);
  word_field("activation", activation_named, config.activation);
  // inputs and classes come from the data: the file must agree with it.
  if (whole_number("inputs") != config.inputs) {
    throw UsageError(file + "the file's model has inputs " + metadata["inputs"] +
                     ", --data has " + std::to_string(config.inputs) + " features per sample");
  }
  if (whole_number("classes") != config.classes) {
    throw UsageError(file + "the file's model has classes " + metadata["classes"] +
                     ", --data has " + std::to_string(config.classes) + " classes");
  }
  return config;
}

train::TrainConfig train_config(const TrainOptions& options) {
  train::TrainConfig config = options.train;
  if (config.steps == 0 && config.epochs == 0) config.epochs = 1;
  const bool dynamic = config.loss_scaling == train::LossScaling::dynamic;
  for (const char* flag : {"--scale-init", "--scale-growth", "--scale-backoff", "--scale-interval",
                           "--scale-min", "--scale-max", "--scale-hysteresis"}) {
    if (options.was_given(flag) && !dynamic) {
      throw UsageError(std::string(flag) + " applies to --loss-scale dynamic only");
    }
  }
  if (dynamic) {
    const auto& o = config.dynamic_scaling;
    if (!(o.growth_factor > 1)) throw UsageError("--scale-growth must be greater than 1");
    if (!(o.backoff_factor < 1)) throw UsageError("--scale-backoff must be less than 1");
    if (!(o.min_scale <= o.max_scale)) {
      throw UsageError("--scale-min must not exceed --scale-max");
    }
    if (!(o.min_scale <= o.initial_scale && o.initial_scale <= o.max_scale)) {
      throw UsageError("--scale-init must lie between --scale-min and --scale-max");
    }
  }
  return config;
}

std::int64_t checked_micro_batch(const TrainOptions& options, const Dataset& train) {
  const std::int64_t batch = options.train.batch;
  if (options.train.micro_batch > batch) {
    throw UsageError("--micro-batch " + std::to_string(options.train.micro_batch) +
                     " is larger than --batch " + std::to_string(batch));
  }
  if (options.train.drop_last && batch > train.size()) {
    throw UsageError("--drop-last with --batch " + std::to_string(batch) + " leaves no batch: " +
                     train.name + " has " + std::to_string(train.size()) + " training samples");
  }
  return options.train.micro_batch > 0 ? options.train.micro_batch : batch;
}

train::RunConfig with_program_settings(SettingsRecord record, const TrainOptions& options) {
  record.add(options.source);
  return record.values();
}

void check_batchnorm_micro_batches(std::int64_t batch, std::int64_t micro_batch,
                                   std::int64_t short_batch) {
  auto leaves_one = [&](std::int64_t rows) {
    return rows > 0 && (std::min(rows, micro_batch) == 1 || rows % micro_batch == 1);
  };
  if (leaves_one(batch)) {
    throw UsageError("--norm batch needs at least 2 samples in every micro-batch (batch " +
                     std::to_string(batch) + " in micro-batches of " +
                     std::to_string(micro_batch) + " leaves one with a single sample)");
  }
  if (leaves_one(short_batch)) {
    throw UsageError("--norm batch needs at least 2 samples in every micro-batch (each "
                     "epoch's last batch of " + std::to_string(short_batch) +
                     (short_batch == 1 ? " sample" : " samples") +
                     " leaves one with a single sample; --drop-last drops it)");
  }
}

nn::GptConfig gpt_config(const TrainOptions& options) {
  nn::GptConfig shape = options.gpt;
  shape.dropout = options.model.dropout;
  shape.precision = options.model.precision;
  shape.seed = options.train.seed;
  return shape;
}

void check_plan_flags(const TrainOptions& options) {
  for (const char* flag : {"--micro-batch", "--checkpoint", "--loss-scale"}) {
    if (options.was_given(flag)) {
      throw UsageError(std::string("--plan auto chooses ") + (flag + 2) + " itself: drop " + flag);
    }
  }
}

void apply_plan(const planning::Plan& plan, TrainOptions& options) {
  options.train.micro_batch = plan.micro_batch;
  options.model.precision = plan.precision;
  options.train.loss_scaling = planning::plan_loss_scale(plan.precision);
  options.checkpoint = plan.checkpoint;
  if (plan.attention) options.gpt.attention = *plan.attention;
}

void check_outputs(TrainOptions& options) {
  std::vector<std::string*> paths;
  std::vector<NamedFile> outputs, inputs;
  const auto output = [&](const char* flag, std::string& path) {
    if (path.empty()) return;
    outputs.push_back({flag, path});
    paths.push_back(&path);
  };
  output("--save", options.output.save);
  output("--log", options.output.log);
  output("--calibration", options.plan.calibration);
  for (const std::string& file : files_of(options.source.data)) inputs.push_back({"--data", file});
  if (options.test_data) {
    for (const std::string& file : files_of(*options.test_data)) {
      inputs.push_back({"--test-data", file});
    }
  }
  if (!options.output.init.empty()) inputs.push_back({"--init", options.output.init});
  const std::vector<std::string> targets = check_output_files(outputs, inputs);
  for (std::size_t i = 0; i < paths.size(); ++i) *paths[i] = targets[i];
}

namespace {

/// Refuses `bytes` held before any step (`what` names them) where they are past the
/// device's own memory (NoPlanFits, ending with `remedy`) or past --device-memory
/// (UsageError, ending with `after`).
void check_held_before_any_step(const TrainOptions& options, Device device, std::size_t bytes,
                                const std::string& what, const std::string& remedy,
                                const std::string& after, bool against_cap = true) {
  const std::size_t own = device.is_cuda() ? cuda_rt::mem_info().total_bytes : host_memory_bytes();
  if (own < bytes) {
    throw NoPlanFits(what + " take " + format_bytes_asked(bytes) +
                     " before any step, more than the " +
                     format_bytes(own) + " of " +
                     (device.is_cuda() ? device.name() : std::string("this machine")) +
                     ": " + remedy);
  }
  if (against_cap && options.device_memory && *options.device_memory < bytes) {
    throw UsageError("--device-memory " + format_bytes(*options.device_memory) +
                     " is below the " + format_bytes(bytes) + " that " + what +
                     " hold before any step" + after);
  }
}

}  // namespace

void check_parameters_fit(const TrainOptions& options, std::size_t parameter_bytes,
                          Device device, bool against_cap) {
  check_held_before_any_step(options, device, parameter_bytes, "the model's parameters",
                             "no micro-batch or checkpointing makes them fit", "", against_cap);
}

void cap_device_memory(const TrainOptions& options, const nn::StepPrediction& plain,
                       Device device) {
  check_held_before_any_step(options, device, plain.stats.live_total,
                             "the model's parameters, gradients and optimizer state and one "
                             "micro-batch's samples",
                             "a smaller --micro-batch holds fewer samples, a smaller model "
                             "less of the rest (checkpointing saves neither)",
                             " (a step then peaks at " + format_bytes(plain.peak()) + ")");
  if (options.device_memory) allocator_for(device).set_cap(*options.device_memory);
}

std::string checkpointing_lines(const checkpointing::Policy& asked,
                                const checkpointing::Policy& policy,
                                const checkpointing::Schedule* schedule, bool explain,
                                const nn::StepPrediction& predicted) {
  std::ostringstream out;
  if (asked != policy) {
    out << "checkpoint " << asked.text() << ": " << policy.text()
        << ", the policy of fewest recomputations whose predicted step fits\n";
  }
  if (schedule) {
    const checkpointing::ScheduleStats stats = checkpointing::simulate(*schedule);
    out << "activation checkpointing " << policy.text() << ": at most " << stats.max_checkpoints
        << (stats.max_checkpoints == 1 ? " block input" : " block inputs") << " kept and "
        << stats.max_taped << (stats.max_taped == 1 ? " block's" : " blocks'")
        << " activations at a time; " << stats.advances + stats.tapes
        << " block forwards per micro-batch instead of " << schedule->depth
        << (policy.keep == nn::BlockKeep::all_but_probabilities
                ? "; each block drops its attention's probabilities after its forward and "
                  "rebuilds them from q and k in its backward"
                : "")
        << "\n";
    if (explain) out << checkpointing::explain(*schedule) << "\n";
  }
  if (schedule || explain) {
    out << "predicted step peak " << format_bytes(predicted.peak()) << " (" << predicted.peak()
        << " bytes), at: " << predicted.peak_moment << "\n";
  }
  return out.str();
}

/// "fp16 (f32 master weights), loss scale dynamic from 65536 (x2 after 2000 clean ...)"
std::string precision_description(nn::Precision precision, const train::TrainConfig& c) {
  std::ostringstream out;
  out << nn::precision_name(precision)
      << (nn::is_mixed(precision) ? " (f32 master weights)" : "") << ", loss scale ";
  switch (c.loss_scaling) {
    case train::LossScaling::none: out << "none"; break;
    case train::LossScaling::fixed: out << "static " << c.fixed_scale; break;
    case train::LossScaling::dynamic: {
      const auto& d = c.dynamic_scaling;
      out << "dynamic from " << d.initial_scale << " (x" << d.growth_factor << " after "
          << d.growth_interval << " clean steps, x" << d.backoff_factor << " after "
          << d.hysteresis << (d.hysteresis == 1 ? " overflow" : " overflows in a row")
          << ", within [" << d.min_scale << ", " << d.max_scale << "])";
      break;
    }
  }
  return out.str();
}

/// "0.002 = 0.001 x sqrt(1024/256) (cosine after 5 linear warm-up steps from lr/5)"
std::string learning_rate_description(const TrainOptions& options,
                                      const nn::LrSchedule& schedule) {
  std::ostringstream lr;
  lr << schedule.base_lr;
  const nn::LrScale scale = options.optimizer.lr_scale;
  if (scale != nn::LrScale::none) {
    const std::string ratio = std::to_string(options.train.batch) + "/" +
                              std::to_string(options.optimizer.lr_reference_batch);
    lr << " = " << base_learning_rate(options) << " x "
       << (scale == nn::LrScale::sqrt ? "sqrt(" + ratio + ")" : ratio);
  }
  lr << " (" << nn::lr_schedule_name(schedule.kind);
  if (schedule.warmup_steps > 0) {
    lr << " after " << schedule.warmup_steps << " linear warm-up steps from lr/"
       << schedule.warmup_steps;
  }
  lr << ")";
  return lr.str();
}

std::string optimizer_line(const TrainOptions& options, const nn::LrSchedule& schedule,
                           const nn::Optimizer::Options& optimizer, std::int64_t micro_batch) {
  const std::int64_t batch = options.train.batch;
  const std::int64_t accumulation_steps = ceil_div(batch, micro_batch);
  const double weight_decay =
      std::visit([](const auto& o) { return o.weight_decay; }, optimizer);
  std::ostringstream out;
  out << "optimizer " << (options.optimizer.kind == OptimizerKind::sgd ? "sgd" : "adamw")
      << ", lr " << learning_rate_description(options, schedule) << ", weight decay "
      << weight_decay << ", seed " << options.train.seed << ", batch " << batch
      << ", micro-batch " << micro_batch << ": " << accumulation_steps
      << (accumulation_steps == 1 ? " accumulation step" : " accumulation steps")
      << " per optimizer step";
  if (batch % micro_batch != 0) {
    out << " (the last micro-batch has " << batch % micro_batch << " samples)";
  }
  return out.str();
}

}  // namespace bigbatch::cli
