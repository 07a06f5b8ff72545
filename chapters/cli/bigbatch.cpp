// bigbatch.cpp: the command-line program. `bigbatch train` trains the model of
// nn/model.hpp on a data set with the trainer of chapters/train/trainer.hpp.
//
// Exit codes: 0 success, 1 any other failure, 2 bad input (flags, data, files),
// 3 out of memory (the allocator's cap, --device-memory, or the device itself).
// Every error is one line on stderr that names the flag or file at fault.
#include <unistd.h>

#include <csignal>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "common/cpu_features.hpp"
#include "common/cuda_runtime.hpp"
#include "common/data/dataset.hpp"
#include "common/format.hpp"
#include "common/io/safetensors.hpp"
#include "common/json.hpp"
#include "common/memory.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/train/snapshot.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/lr_schedule.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bigbatch {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitOutOfMemory = 3;
constexpr const char* kExitCodes =
    "Exit codes: 0 success; 1 any other failure; 2 bad input (flags, data or files; "
    "nothing is trained); 3 out of memory (past --device-memory or the device's own); "
    "130 or 143 stopped by SIGINT or SIGTERM (after a snapshot, with --snapshot-dir).";

/// A mistake of the user's: reported without a stack of context, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// No plan fits --device-memory (bigbatch plan, --plan auto): exit code 3, as out of memory.
class NoPlanFits : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainOptions {
  std::string data = "synthetic";
  std::string test_data;
  std::int64_t synthetic_samples = 60000;
  std::int64_t synthetic_features = 784;
  std::int64_t batch = 256;
  std::int64_t micro_batch = 0;
  std::int64_t depth = 2;
  std::int64_t hidden = 256;
  std::int64_t expansion = 4;
  float dropout = 0.0f;
  std::string norm = "layer";
  std::string activation = "gelu";
  std::string optimizer = "adamw";
  std::optional<double> lr, momentum, weight_decay;
  std::string lr_schedule = "constant";
  std::int64_t warmup_steps = 0;
  std::string lr_scale = "none";
  std::int64_t lr_reference_batch = 256;
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  bool drop_last = false;
  std::uint64_t seed = 0;
  std::string shuffle = "on";
  std::string device = "cpu";
  std::string device_memory;
  std::string init, save, log;
  std::int64_t eval_every = 0;
  std::int64_t print_every = 0;
  std::string precision = "fp32";
  std::string loss_scale = "none";  ///< none, static:S or dynamic
  float clip_grad_norm = 0;         ///< 0: off
  std::string checkpoint = "none";  ///< chapter 05's policy
  bool explain = false;             ///< print the checkpoint schedule
  std::string snapshot_dir;         ///< where snapshots go ("": none, unless --resume)
  std::int64_t snapshot_every = 0;  ///< 0: only at the end and when interrupted
  std::int64_t snapshot_keep = 2;
  std::string resume;               ///< a snapshot folder to continue from
  loss_scaling::DynamicScalerOptions scaling;  ///< --scale-*: for --loss-scale dynamic
  std::string plan;                 ///< "auto": chapter 06's planner chooses (train)
  std::string calibration;          ///< the planner's cost-model file
  bool recalibrate = false;         ///< measure the cost model again
  bool json = false;                ///< bigbatch plan --json: the answer as one JSON object
  std::set<std::string> given;  ///< the flags on the command line, e.g. "--depth"
};

struct Splits {
  Dataset train;
  std::optional<Dataset> test;
};

Dataset load_npy_spec(const std::string& spec, const std::string& flag) {
  const std::string files = spec.substr(4);
  const std::size_t comma = files.find(',');
  if (comma == std::string::npos || comma == 0 || comma + 1 == files.size()) {
    throw UsageError(flag + " " + spec + ": expected npy:FEATURES.npy,LABELS.npy");
  }
  try {
    return load_npy_dataset(files.substr(0, comma), files.substr(comma + 1));
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
}

Splits load_data(const TrainOptions& options) {
  Splits splits;
  if (options.data == "fashion-mnist") {
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
  } else if (options.data == "synthetic") {
    SyntheticOptions synthetic;
    synthetic.samples = options.synthetic_samples;
    synthetic.features = options.synthetic_features;
    const Dataset all = make_synthetic(synthetic);
    // A deterministic hold-out: the last 10% of the samples.
    const std::int64_t held_out = all.size() / 10;
    splits.train = slice(all, 0, all.size() - held_out);
    if (held_out > 0) splits.test = slice(all, all.size() - held_out, all.size());
  } else if (options.data.rfind("npy:", 0) == 0) {
    splits.train = load_npy_spec(options.data, "--data");
  } else {
    throw UsageError("--data " + options.data +
                     ": expected fashion-mnist, synthetic or npy:FEATURES.npy,LABELS.npy");
  }
  if (!options.test_data.empty()) {
    if (options.test_data.rfind("npy:", 0) != 0) {
      throw UsageError("--test-data " + options.test_data + ": expected npy:X.npy,y.npy");
    }
    splits.test = load_npy_spec(options.test_data, "--test-data");
    if (splits.test->feature_dim() != splits.train.feature_dim()) {
      throw UsageError("--test-data has " + std::to_string(splits.test->feature_dim()) +
                       " features per sample, the training data " +
                       std::to_string(splits.train.feature_dim()));
    }
  }
  return splits;
}

Device choose_device(const std::string& text) {
  Device device;
  try {
    device = parse_device(text);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--device: ") + e.what());
  }
  std::string why_not;
  if (device.is_cuda() && !cuda_rt::available(&why_not)) {
    throw UsageError("--device " + text + ": CUDA is not available: " + why_not);
  }
  return device;
}

/// The learning rate the user asked for, before scaling: --lr or the optimizer's default.
double base_learning_rate(const TrainOptions& options) {
  return options.lr.value_or(options.optimizer == "sgd" ? 0.05 : 1e-3);
}

nn::LrScale lr_scale(const TrainOptions& options) {
  if (options.lr_scale == "linear") return nn::LrScale::linear;
  if (options.lr_scale == "sqrt") return nn::LrScale::sqrt;
  return nn::LrScale::none;
}

/// The optimizer's options, its learning rate scaled for the batch by --lr-scale.
nn::Optimizer::Options optimizer_options(const TrainOptions& options) {
  const double lr = nn::scaled_learning_rate(base_learning_rate(options), lr_scale(options),
                                             options.batch, options.lr_reference_batch);
  if (options.optimizer == "sgd") {
    SgdOptions sgd;
    sgd.lr = lr;
    sgd.momentum = options.momentum.value_or(0.9);
    sgd.weight_decay = options.weight_decay.value_or(0.0);
    return sgd;
  }
  if (options.momentum) throw UsageError("--momentum applies to --optimizer sgd only");
  AdamWOptions adamw;
  adamw.lr = lr;
  adamw.weight_decay = options.weight_decay.value_or(1e-2);
  return adamw;
}

/// {"parameters":123,"master_weights":0,...}: the device's categories (not host_data).
Json bytes_json(const MemoryStats::PerCategory& bytes) {
  Json object = Json::object();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    if (counts_on_device(category)) object[category_name(category)] = bytes[c];
  }
  return object;
}

/// One line of --log: the step's record; a float that is not finite (a diverged run)
/// is written null. The gradient norm appears when it was measured.
Json log_line(const train::StepRecord& record, double elapsed_seconds, bool norm_measured) {
  Json line = {{"step", record.step},
               {"epoch", record.epoch},
               {"loss", json_float(record.loss)},
               {"lr", record.learning_rate},
               {"samples", record.samples},
               {"time_s", elapsed_seconds},
               {"step_time_s", record.seconds},
               {"loss_scale", json_float(record.loss_scale)},
               {"skipped", record.skipped}};
  if (norm_measured) {
    line["grad_norm"] = json_float(record.grad_norm);
    line["clip_factor"] = json_float(record.clip_factor);
  }
  line["peak_bytes_total"] = record.memory.peak_total;
  line["peak_bytes"] = bytes_json(record.memory.at_peak);
  return line;
}

/// 75 s as "1:15", 4000 s as "1:06:40".
std::string clock_time(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60,
                  total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

/// Progress: one line rewritten in place on a terminal (at most ten times a second),
/// plain lines otherwise: the first step, every N steps and the last. Speeds are those of
/// the steps since the previous line (the current speed, not the run's average), timed by
/// the trainer, so evaluation between steps does not count; the ETA is the remaining steps
/// at that speed.
class Progress {
 public:
  Progress(std::int64_t total_steps, std::int64_t print_every, bool show_scale, bool show_norm)
      : total_(total_steps),
        show_scale_(show_scale),
        show_norm_(show_norm),
        terminal_(::isatty(STDOUT_FILENO) != 0),
        every_(print_every > 0 ? print_every : std::max<std::int64_t>(1, total_steps / 20)),
        start_(std::chrono::steady_clock::now()) {}

  void update(const train::StepRecord& record) {
    window_steps_ += 1;
    window_samples_ += record.batch_samples;
    window_seconds_ += record.seconds;
    const bool first_or_last = !printed_ || record.step == total_;  // this process's first
    printed_ = true;
    const double now = elapsed();
    if (terminal_ ? !(first_or_last || now - last_draw_ >= 0.1)
                  : !(first_or_last || record.step % every_ == 0)) {
      return;
    }
    const double seconds_per_step = window_seconds_ / static_cast<double>(window_steps_);
    const double samples_per_second =
        window_seconds_ > 0 ? static_cast<double>(window_samples_) / window_seconds_ : 0.0;
    const double eta = seconds_per_step * static_cast<double>(total_ - record.step);
    char numbers[200];
    std::snprintf(numbers, sizeof numbers,
                  "epoch %.2f  loss %.4f  lr %.3g  %.1f ms/step  %.0f samples/s  elapsed %s  "
                  "ETA %s",
                  record.epoch, record.loss, record.learning_rate, 1e3 * seconds_per_step,
                  samples_per_second, clock_time(now).c_str(), clock_time(eta).c_str());
    std::string scale;
    if (show_scale_) {
      char text[64];
      std::snprintf(text, sizeof text, "  scale %g  skipped %lld",
                    static_cast<double>(record.loss_scale),
                    static_cast<long long>(record.skipped_steps));
      scale = text;
    }
    if (show_norm_) {
      char text[64];
      std::snprintf(text, sizeof text, "  norm %.3g%s", static_cast<double>(record.grad_norm),
                    record.clip_factor < 1.0f ? " (clipped)" : "");
      scale += text;
    }
    const std::string counter =
        "step " + std::to_string(record.step) + "/" + std::to_string(total_);
    if (terminal_) {
      constexpr int kWidth = 20;
      const auto filled = static_cast<std::size_t>(kWidth * record.step / total_);
      std::cout << '\r' << counter << " [" << std::string(filled, '=')
                << std::string(kWidth - filled, ' ') << "] " << numbers << scale << "\033[K"
                << std::flush;
      dirty_ = true;
    } else {
      std::cout << counter << "  " << numbers << scale << "\n" << std::flush;
    }
    last_draw_ = now;
    window_steps_ = 0;
    window_samples_ = 0;
    window_seconds_ = 0;
  }
  /// Ends the rewritten line before anything else is printed.
  void break_line() {
    if (dirty_) std::cout << '\n';
    dirty_ = false;
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::int64_t total_;
  bool show_scale_;
  bool show_norm_;
  bool terminal_;
  std::int64_t every_;
  std::chrono::steady_clock::time_point start_;
  double last_draw_ = 0;
  std::int64_t window_steps_ = 0, window_samples_ = 0;
  double window_seconds_ = 0;
  bool dirty_ = false;
  bool printed_ = false;
};

/// The memory of the training step with the highest peak, by category at that moment
/// (the rows add up to the total), beside what is live now; host data in its own row.
std::string step_memory_report(Device device, const MemoryStats& step, std::int64_t steps) {
  const TrackingAllocator& allocator = allocator_for(device);
  const MemoryStats now = allocator.stats();
  std::ostringstream out;
  out << "memory on " << device.name();
  if (const auto cap = allocator.cap()) out << " (capped at " << format_bytes(*cap) << ")";
  out << ": the training step's peak (the highest of the " << steps
      << " steps), by category at that moment, and what is live now\n";
  char line[192];
  std::snprintf(line, sizeof line, "  %-16s %16s %12s\n", "category", "at step's peak",
                "live now");
  out << line;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    const bool on_device = counts_on_device(category);
    std::snprintf(line, sizeof line, "  %-16s %16s %12s  %s\n",
                  std::string(category_name(category)).c_str(),
                  on_device ? format_bytes(step.at_peak[c]).c_str() : "-",
                  format_bytes(now.live[c]).c_str(),
                  std::string(category_remark(category)).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %16s %12s\n", "total",
                format_bytes(step.peak_total).c_str(), format_bytes(now.live_total).c_str());
  out << line;
  if (device.is_cuda()) {
    const auto info = cuda_rt::mem_info();
    out << "  cudaMemGetInfo: " << format_bytes(info.free_bytes) << " free of "
        << format_bytes(info.total_bytes) << "\n";
  }
  return out.str();
}

/// Fails early (before any training) when --save could not be written at the end.
void check_writable(const std::string& path) {
  const std::string probe = path + ".tmp";
  std::ofstream out(probe);
  if (!out) throw UsageError("--save: cannot write " + path);
  out.close();
  std::remove(probe.c_str());
}

/// The model's shape from the flags, or, with --init, from the file's metadata (written
/// by Model::save) where no flag says otherwise; a flag that disagrees with the file is
/// refused by name. A file without bigbatch's metadata (e.g. from PyTorch) keeps the
/// flags' shape, and Model::load checks every tensor against it.
nn::ModelConfig model_config(const TrainOptions& options, std::int64_t inputs,
                             std::int64_t classes) {
  nn::ModelConfig config;
  config.inputs = inputs;
  config.classes = classes;
  config.hidden = options.hidden;
  config.expansion = options.expansion;
  config.depth = options.depth;
  config.dropout = options.dropout;
  config.norm = options.norm == "batch" ? nn::Norm::batch : nn::Norm::layer;
  config.activation = options.activation == "relu" ? nn::Activation::relu : nn::Activation::gelu;
  config.seed = options.seed;
  config.precision = options.precision == "fp16" ? nn::Precision::fp16 : nn::Precision::fp32;
  if (options.init.empty()) return config;

  std::map<std::string, std::string> metadata;
  try {
    metadata = load_safetensors_metadata(options.init);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--init: ") + e.what());
  }
  if (metadata["format"] != "bigbatch residual MLP") return config;
  const std::string file = "--init " + options.init + ": ";
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
    if (options.given.count("--" + key) && stored != field) {
      throw UsageError(file + "the file's model has " + key + " " + std::to_string(stored) +
                       ", --" + key + " says " + std::to_string(field));
    }
    field = stored;
  };
  size_field("hidden", config.hidden);
  size_field("expansion", config.expansion);
  size_field("depth", config.depth);
  auto name_field = [&](const std::string& key, const std::string& flag_value) {
    const std::string& stored = metadata[key];
    if (options.given.count("--" + key) && stored != flag_value) {
      throw UsageError(file + "the file's model has " + key + " " + stored + ", --" + key +
                       " says " + flag_value);
    }
    return stored;
  };
  const std::string norm = name_field("norm", options.norm);
  const std::string activation = name_field("activation", options.activation);
  if ((norm != "layer" && norm != "batch") || (activation != "gelu" && activation != "relu")) {
    throw UsageError(file + "unknown norm '" + norm + "' or activation '" + activation + "'");
  }
  config.norm = norm == "batch" ? nn::Norm::batch : nn::Norm::layer;
  config.activation = activation == "relu" ? nn::Activation::relu : nn::Activation::gelu;
  // inputs and classes come from the data: the file must agree with it.
  if (whole_number("inputs") != inputs) {
    throw UsageError(file + "the file's model has inputs " + metadata["inputs"] +
                     ", --data has " + std::to_string(inputs) + " features per sample");
  }
  if (whole_number("classes") != classes) {
    throw UsageError(file + "the file's model has classes " + metadata["classes"] +
                     ", --data has " + std::to_string(classes) + " classes");
  }
  return config;
}

/// Refuses a BatchNorm micro-batch of a single sample (its variance is 0: PyTorch refuses
/// it too), in any batch of the run: the full ones and an epoch's short last one.
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

/// --loss-scale and --scale-*: what the trainer does at each optimizer boundary.
void configure_loss_scaling(const TrainOptions& options, train::TrainConfig& config) {
  const bool dynamic = options.loss_scale == "dynamic";
  for (const char* flag : {"--scale-init", "--scale-growth", "--scale-backoff", "--scale-interval",
                           "--scale-min", "--scale-max", "--scale-hysteresis"}) {
    if (options.given.count(flag) && !dynamic) {
      throw UsageError(std::string(flag) + " applies to --loss-scale dynamic only");
    }
  }
  if (options.loss_scale == "none") return;
  if (dynamic) {
    const auto& o = options.scaling;
    if (!(o.growth_factor > 1)) throw UsageError("--scale-growth must be greater than 1");
    if (!(o.backoff_factor < 1)) throw UsageError("--scale-backoff must be less than 1");
    if (!(o.min_scale <= o.max_scale)) {
      throw UsageError("--scale-min must not exceed --scale-max");
    }
    if (!(o.min_scale <= o.initial_scale && o.initial_scale <= o.max_scale)) {
      throw UsageError("--scale-init must lie between --scale-min and --scale-max");
    }
    config.loss_scaling = train::LossScaling::dynamic;
    config.dynamic_scaling = options.scaling;
    return;
  }
  const std::string prefix = "static:";
  char* end = nullptr;
  const std::string number = options.loss_scale.substr(prefix.size());
  const double scale = std::strtod(number.c_str(), &end);
  if (options.loss_scale.rfind(prefix, 0) != 0 || number.empty() ||
      end != number.c_str() + number.size() || !(scale > 0) || !(scale < 3.4e38)) {
    throw UsageError("--loss-scale: expected none, static:S with S > 0 (e.g. static:1024) or "
                     "dynamic, got '" + options.loss_scale + "'");
  }
  config.loss_scaling = train::LossScaling::fixed;
  config.fixed_scale = static_cast<float>(scale);
}

/// "fp16 (f32 master weights), loss scale dynamic: 65536, x2 after 2000 clean steps, ..."
std::string precision_description(const TrainOptions& options, const train::TrainConfig& c) {
  std::ostringstream out;
  out << options.precision << (options.precision == "fp16" ? " (f32 master weights)" : "")
      << ", loss scale ";
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

/// The settings a run's trajectory depends on, by flag, as a snapshot records them and a
/// resumed run must repeat them (chapters/train/snapshot.hpp). Left out: what changes only
/// how the run is watched or stored (--log, --print-every, --eval-every, --save, the
/// snapshot flags), where it starts from (--init: the snapshot has the parameters), and
/// what gives the same bits (--checkpoint, --device-memory; --micro-batch with
/// LayerNorm, where accumulation is exact).
train::RunConfig run_config(const TrainOptions& o, const nn::Optimizer::Options& optimizer) {
  const auto number = [](double value) {
    std::ostringstream out;
    out.precision(17);
    out << value;
    return out.str();
  };
  train::RunConfig c = {
      {"data", o.data},
      {"samples", std::to_string(o.synthetic_samples)},
      {"features", std::to_string(o.synthetic_features)},
      {"batch", std::to_string(o.batch)},
      {"depth", std::to_string(o.depth)},
      {"hidden", std::to_string(o.hidden)},
      {"expansion", std::to_string(o.expansion)},
      {"dropout", number(o.dropout)},
      {"norm", o.norm},
      {"activation", o.activation},
      {"optimizer", o.optimizer},
      {"lr-schedule", o.lr_schedule},
      {"warmup-steps", std::to_string(o.warmup_steps)},
      {"steps", std::to_string(o.steps)},
      {"epochs", std::to_string(o.epochs)},
      {"drop-last", o.drop_last ? "on" : "off"},
      {"seed", std::to_string(o.seed)},
      {"shuffle", o.shuffle},
      {"device", o.device},
      {"precision", o.precision},
      {"loss-scale", o.loss_scale},
      {"clip-grad-norm", number(o.clip_grad_norm)},
  };
  std::visit(
      [&](const auto& opt) {
        c["lr"] = number(opt.lr);  // after --lr-scale
        c["weight-decay"] = number(opt.weight_decay);
      },
      optimizer);
  if (const auto* sgd = std::get_if<SgdOptions>(&optimizer)) c["momentum"] = number(sgd->momentum);
  if (o.loss_scale == "dynamic") {
    c["scale-init"] = number(o.scaling.initial_scale);
    c["scale-growth"] = number(o.scaling.growth_factor);
    c["scale-backoff"] = number(o.scaling.backoff_factor);
    c["scale-interval"] = std::to_string(o.scaling.growth_interval);
    c["scale-hysteresis"] = std::to_string(o.scaling.hysteresis);
    c["scale-min"] = number(o.scaling.min_scale);
    c["scale-max"] = number(o.scaling.max_scale);
  }
  if (o.norm == "batch") c["micro-batch"] = std::to_string(o.micro_batch);
  return c;
}

/// Keeps the lines of a --log file up to step `last` (a resumed run appends the rest),
/// rewriting it atomically; nothing when the file does not exist.
void truncate_log(const std::string& path, std::int64_t last) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    // A line cut short by the kill that stopped the run does not parse: it goes.
    const Json parsed = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object() || !parsed.contains("step") || !parsed["step"].is_number_integer() ||
        parsed["step"].get<std::int64_t>() > last) {
      continue;
    }
    kept += line + "\n";
  }
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary, std::ios::trunc);
  out << kept;
  out.close();
  if (!out || std::rename(temporary.c_str(), path.c_str()) != 0) {
    throw UsageError("--log: cannot rewrite " + path + " for the resumed run");
  }
}

/// The signal that asked the run to stop (SIGINT or SIGTERM), 0 while none has.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void request_stop(int signal) {
  g_stop_signal = signal;
  std::signal(signal, SIG_DFL);  // a second one stops at once
}

/// Thrown from the step callback to leave the training loop after a signal.
struct Interrupted {
  int signal;
};

/// The planner's cost-model file: --calibration, else $XDG_CACHE_HOME (or ~/.cache)
/// /bigbatch/calibration.json.
std::string calibration_path(const TrainOptions& options) {
  if (!options.calibration.empty()) return options.calibration;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && *cache != 0) {
    return std::string(cache) + "/bigbatch/calibration.json";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != 0 ? home : ".") + "/.cache/bigbatch/calibration.json";
}

/// One plan as JSON (bigbatch plan --json): its settings, predicted peak in bytes (and the
/// moment that holds it) and predicted seconds per step.
Json plan_json(const planning::Plan& plan, std::int64_t batch) {
  return {{"micro_batch", plan.micro_batch},
          {"micro_batches", (batch + plan.micro_batch - 1) / plan.micro_batch},
          {"precision", nn::precision_name(plan.precision)},
          {"loss_scale", plan.precision == nn::Precision::fp16 ? "dynamic" : "none"},
          {"checkpoint", plan.checkpoint.text()},
          {"recompute", plan.recompute},
          {"peak_bytes", plan.prediction.peak()},
          {"peak_moment", plan.prediction.peak_moment},
          {"seconds", plan.seconds}};
}

/// Chapter 06's answer for the model, batch, optimizer and --device-memory of `options`,
/// with its table printed (with --json, one JSON object instead); throws UsageError without
/// --device-memory, NoPlanFits when no plan fits (after the JSON object, with --json).
planning::PlanResult plan_for(const TrainOptions& options, const nn::ModelConfig& config,
                              Device device) {
  if (options.device_memory.empty()) {
    throw UsageError("planning needs --device-memory SIZE, the memory to plan for");
  }
  planning::PlanRequest request{config, options.batch, optimizer_options(options), 0};
  try {
    request.budget = parse_bytes(options.device_memory);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--device-memory: ") + e.what());
  }
  if (options.given.count("--precision")) {
    request.precisions = {options.precision == "fp16" ? nn::Precision::fp16 : nn::Precision::fp32};
  }
  const std::string path = calibration_path(options);
  bool measured = false;
  planning::CostModel cost;
  try {
    cost = planning::calibration_for(path, config, request.optimizer, device, options.batch,
                                     options.recalibrate, &measured);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--calibration: ") + e.what());
  }
  const planning::PlanResult result = planning::make_plan(request, cost);
  if (options.json) {
    Json answer = {{"batch", options.batch},
                   {"budget_bytes", request.budget},
                   {"device", device.name()},
                   {"calibration", path},
                   {"calibration_measured_now", measured},
                   {"cost_model", cost.to_json()},
                   {"weighed", result.weighed},
                   {"feasible", Json::array()}};
    for (const planning::Plan& p : result.feasible) {
      answer["feasible"].push_back(plan_json(p, options.batch));
    }
    if (result.smallest) {  // nothing fits: the smallest peak, and what no plan can trade
      answer["smallest"] = plan_json(*result.smallest, options.batch);
      answer["fixed_bytes"] = result.fixed_bytes;
    }
    std::cout << answer.dump() << "\n" << std::flush;
  } else {
    std::cout << "plan: batch " << options.batch << " under " << format_bytes(request.budget)
              << " on " << device.name() << "; step times from the cost model "
              << (measured ? "measured now, saved to " : "in ") << path << "\n";
  }
  if (result.feasible.empty()) {
    const planning::Plan& smallest = *result.smallest;
    throw NoPlanFits(
        "no plan fits the step in " + format_bytes(request.budget) + ": the smallest predicted "
        "peak is " + format_bytes(smallest.prediction.peak()) + " (" +
        planning::describe(smallest, options.batch) + "), of which " +
        format_bytes(result.fixed_bytes) + " are parameters, gradients, master weights, "
        "optimizer state and the batch, which no plan can trade away");
  }
  if (options.json) return result;
  std::printf("  %-24s %-10s %-22s %12s %12s\n", "micro-batch (per step)", "precision",
              "checkpoint", "peak", "step time");
  for (std::size_t i = 0; i < result.feasible.size(); ++i) {
    const planning::Plan& p = result.feasible[i];
    const std::string micro = std::to_string(p.micro_batch) + " (" +
                              std::to_string((options.batch + p.micro_batch - 1) / p.micro_batch) +
                              ")";
    std::printf("  %-24s %-10s %-22s %12s %10.4f s%s\n", micro.c_str(),
                nn::precision_name(p.precision).c_str(), p.checkpoint.text().c_str(),
                format_bytes(p.prediction.peak()).c_str(), p.seconds, i == 0 ? "  <- fastest" : "");
  }
  std::cout << "  (" << result.weighed << " plans weighed; fp16 trains with dynamic loss "
            << "scaling)\n";
  return result;
}

/// bigbatch plan: the table, and the train flags of the fastest plan.
int run_plan(const TrainOptions& options) {
  const Splits splits = load_data(options);
  const std::int64_t classes =
      std::max(splits.train.num_classes, splits.test ? splits.test->num_classes : 0);
  const nn::ModelConfig config = model_config(options, splits.train.feature_dim(), classes);
  const planning::Plan best = plan_for(options, config, choose_device(options.device)).best();
  if (options.json) return 0;
  std::cout << "train it with: --micro-batch " << best.micro_batch << " --precision "
            << nn::precision_name(best.precision)
            << (best.precision == nn::Precision::fp16 ? " --loss-scale dynamic" : "")
            << " --checkpoint " << best.checkpoint.text() << " (or --plan auto)\n";
  return 0;
}

/// --plan auto: the flags the plan sets, written into a copy of the options.
TrainOptions with_plan(const TrainOptions& given) {
  for (const char* flag : {"--micro-batch", "--checkpoint", "--loss-scale"}) {
    if (given.given.count(flag)) {
      throw UsageError(std::string("--plan auto chooses ") + (flag + 2) + " itself: drop " + flag);
    }
  }
  if (given.plan != "auto") throw UsageError("--plan: expected auto, got '" + given.plan + "'");
  TrainOptions options = given;
  const Splits splits = load_data(options);
  const std::int64_t classes =
      std::max(splits.train.num_classes, splits.test ? splits.test->num_classes : 0);
  const nn::ModelConfig config = model_config(options, splits.train.feature_dim(), classes);
  const planning::Plan best = plan_for(options, config, choose_device(options.device)).best();
  std::cout << "plan auto: " << planning::describe(best, options.batch) << "\n";
  options.micro_batch = best.micro_batch;
  options.precision = nn::precision_name(best.precision);
  options.loss_scale = best.precision == nn::Precision::fp16 ? "dynamic" : "none";
  options.checkpoint = best.checkpoint.text();
  return options;
}

int run_train(const TrainOptions& given) {
  const TrainOptions& options = given.plan.empty() ? given : with_plan(given);
  if (options.micro_batch > options.batch) {
    throw UsageError("--micro-batch " + std::to_string(options.micro_batch) +
                     " is larger than --batch " + std::to_string(options.batch));
  }
  // Rows per forward pass, in training and in evaluation: what the memory was sized for.
  const std::int64_t micro_batch = options.micro_batch > 0 ? options.micro_batch : options.batch;
  if (options.norm == "batch") check_batchnorm_micro_batches(options.batch, micro_batch, 0);
  if (!options.save.empty()) check_writable(options.save);
  const Device device = choose_device(options.device);
  const Splits splits = load_data(options);
  const std::int64_t samples = splits.train.size();
  const std::int64_t classes =
      std::max(splits.train.num_classes, splits.test ? splits.test->num_classes : 0);
  if (options.drop_last && options.batch > samples) {
    throw UsageError("--drop-last with --batch " + std::to_string(options.batch) +
                     " leaves no batch: " + splits.train.name + " has " +
                     std::to_string(samples) + " training samples");
  }
  if (options.norm == "batch" && !options.drop_last) {
    check_batchnorm_micro_batches(options.batch, micro_batch, samples % options.batch);
  }

  const nn::ModelConfig config_of_model =
      model_config(options, splits.train.feature_dim(), classes);
  if (!options.device_memory.empty()) {
    std::size_t cap = 0;
    try {
      cap = parse_bytes(options.device_memory);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--device-memory: ") + e.what());
    }
    // Below what is live before any step (parameters, gradients, optimizer state and the
    // batch) nothing can train: that is a setting out of range, not a step that ran out.
    const nn::StepPrediction step = nn::predict_step(config_of_model, options.batch, micro_batch,
                                                     optimizer_options(options));
    if (cap < step.stats.live_total) {
      throw UsageError("--device-memory " + options.device_memory + " is below the " +
                       format_bytes(step.stats.live_total) + " that the model's parameters, "
                       "gradients and optimizer state and the batch hold before any step "
                       "(a step then peaks at " + format_bytes(step.peak()) + ")");
    }
    allocator_for(device).set_cap(cap);
  }
  nn::Model model(config_of_model, device);
  // The step as chapter 05's memory model sees it: budget:BYTES is chosen by its
  // prediction, and --explain prints the prediction.
  const checkpointing::StepShape step_shape{config_of_model, options.batch, micro_batch,
                                            optimizer_options(options)};
  checkpointing::Policy asked, policy;  // policy: asked, with a budget resolved
  std::shared_ptr<checkpointing::ScheduledRunner> runner;
  try {
    asked = checkpointing::Policy::parse(options.checkpoint);
    policy = checkpointing::resolve_policy(asked, step_shape);
    if (policy.needs_runner()) {
      runner = checkpointing::ScheduledRunner::for_policy(policy, config_of_model.depth);
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--checkpoint: ") + e.what());
  }
  if (runner) model.set_block_runner(runner);
  if (!options.init.empty()) {
    try {
      model.load(options.init);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--init: ") + e.what());
    }
  }
  nn::Optimizer optimizer(model.parameters(), optimizer_options(options));

  train::TrainConfig config;
  config.batch = options.batch;
  config.micro_batch = options.micro_batch;
  config.steps = options.steps;
  config.epochs = options.steps == 0 && options.epochs == 0 ? 1 : options.epochs;
  config.drop_last = options.drop_last;
  config.shuffle = options.shuffle == "on";
  config.seed = options.seed;
  config.lr_schedule =
      options.lr_schedule == "cosine" ? nn::LrScheduleKind::cosine : nn::LrScheduleKind::constant;
  config.warmup_steps = options.warmup_steps;
  config.clip_grad_norm = options.clip_grad_norm;
  configure_loss_scaling(options, config);
  train::Trainer trainer(model, optimizer, splits.train, config);

  // Snapshots go to --snapshot-dir, or back to the folder --resume reads.
  const train::RunConfig settings = run_config(options, optimizer.options());
  const std::string snapshot_dir =
      !options.snapshot_dir.empty() ? options.snapshot_dir : options.resume;
  if (snapshot_dir.empty() && (options.given.count("--snapshot-every") != 0 ||
                               options.given.count("--snapshot-keep") != 0)) {
    throw UsageError("--snapshot-every and --snapshot-keep need --snapshot-dir (or --resume)");
  }
  if (!options.resume.empty() && !std::filesystem::is_directory(options.resume)) {
    throw UsageError("--resume " + options.resume + ": no such folder");
  }
  std::optional<train::Snapshots> snapshots;
  if (!snapshot_dir.empty()) {
    try {
      snapshots.emplace(snapshot_dir, options.snapshot_keep);  // and its folder's lock
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string(options.snapshot_dir.empty() ? "--resume: " : "--snapshot-dir: ") +
                       e.what());
    }
  }
  std::int64_t resumed_at = 0;
  std::string last_snapshot;
  if (!options.resume.empty()) {
    // From the --resume folder, even when --snapshot-dir sends new snapshots elsewhere
    // (then that folder is locked too while it is read).
    std::optional<train::SnapshotFolderLock> reading;
    try {
      std::error_code unknown;  // a folder that cannot be compared is locked apart
      if (!std::filesystem::equivalent(snapshot_dir, options.resume, unknown)) {
        reading.emplace(options.resume);
      }
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--resume: ") + e.what());
    }
    const std::vector<train::SnapshotFile> files = train::list_snapshots(options.resume);
    if (files.empty()) {
      throw UsageError("--resume " + options.resume + ": no snapshot (step-*.safetensors) in it");
    }
    try {
      train::restore_snapshot(files.back().path, model, optimizer, trainer, settings);
    } catch (const train::SnapshotMismatchError& e) {  // a changed setting
      throw UsageError(std::string("--resume: ") + e.what());
    } catch (const std::runtime_error& e) {  // a damaged file: is an older one whole?
      std::string message = std::string("--resume: ") + e.what();
      const auto intact = std::find_if(std::next(files.rbegin()), files.rend(),
                                       [](const train::SnapshotFile& file) {
                                         return train::snapshot_is_intact(file.path);
                                       });
      message += intact == files.rend()
                     ? "; no older snapshot in " + options.resume + " is intact"
                     : "; the older snapshot " + intact->path +
                           " is intact: move the newer ones out of the folder to resume from it";
      throw UsageError(message);
    }
    resumed_at = trainer.steps_done();
    last_snapshot = files.back().path;
  }

  std::ofstream log;
  if (!options.log.empty()) {
    if (resumed_at > 0) truncate_log(options.log, resumed_at);
    log.open(options.log, resumed_at > 0 ? std::ios::app : std::ios::trunc);
    if (!log) throw UsageError("--log: cannot write " + options.log);
  }
  if (options.norm == "batch" && micro_batch < options.batch) {
    std::cerr << "bigbatch train: warning: --norm batch normalises each micro-batch of "
              << micro_batch << " with its own statistics, so the update is not the one a "
              << "batch of " << options.batch << " in one piece would give (gradient "
              << "accumulation is exact for --norm layer)\n";
  }

  // What is trained, then how: the two header lines.
  const std::int64_t accumulation_steps = (options.batch + micro_batch - 1) / micro_batch;
  std::cout << "bigbatch train: " << splits.train.name << " (" << samples << " samples, "
            << splits.train.feature_dim() << " features, " << classes
            << " classes), model depth " << config_of_model.depth << " hidden "
            << config_of_model.hidden << " (" << model.parameter_count() << " parameters), "
            << trainer.total_steps() << (trainer.total_steps() == 1 ? " step" : " steps")
            << " (" << trainer.batches_per_epoch() << " per epoch) on " << device.name() << "\n";
  const nn::LrSchedule& schedule = trainer.lr_schedule();
  std::ostringstream lr;  // "0.002 = 0.001 x sqrt(1024/256) (cosine after 5 linear ...)"
  lr << schedule.base_lr;
  if (options.lr_scale != "none") {
    const std::string ratio = std::to_string(options.batch) + "/" +
                              std::to_string(options.lr_reference_batch);
    lr << " = " << base_learning_rate(options) << " x "
       << (options.lr_scale == "sqrt" ? "sqrt(" + ratio + ")" : ratio);
  }
  lr << " (" << nn::lr_schedule_name(schedule.kind);
  if (schedule.warmup_steps > 0) {
    lr << " after " << schedule.warmup_steps << " linear warm-up steps from lr/"
       << schedule.warmup_steps;
  }
  lr << ")";
  const double weight_decay = std::visit([](const auto& o) { return o.weight_decay; },
                                         optimizer.options());
  std::cout << "optimizer " << options.optimizer << ", lr " << lr.str() << ", weight decay "
            << weight_decay << ", seed " << options.seed << ", batch " << options.batch
            << ", micro-batch " << micro_batch << ": " << accumulation_steps
            << (accumulation_steps == 1 ? " accumulation step" : " accumulation steps")
            << " per optimizer step";
  if (options.batch % micro_batch != 0) {
    std::cout << " (the last micro-batch has " << options.batch % micro_batch << " samples)";
  }
  std::cout << "\nprecision " << precision_description(options, config) << "\n";
  if (asked != policy) {
    std::cout << "checkpoint " << asked.text() << ": " << policy.text()
              << ", the policy of fewest recomputations whose predicted step fits\n";
  }
  if (runner) {
    const checkpointing::ScheduleStats stats = checkpointing::simulate(runner->schedule());
    std::cout << "activation checkpointing " << policy.text() << ": at most " << stats.max_checkpoints
              << " block inputs kept and " << stats.max_taped
              << (stats.max_taped == 1 ? " block's" : " blocks'")
              << " activations at a time; " << stats.advances + stats.tapes
              << " block forwards per micro-batch instead of " << config_of_model.depth << "\n";
    if (options.explain) std::cout << checkpointing::explain(runner->schedule()) << "\n";
  }
  if (runner || options.explain) {
    const nn::StepPrediction predicted = checkpointing::predict_policy(step_shape, policy);
    std::cout << "predicted step peak " << format_bytes(predicted.peak()) << " ("
              << predicted.peak() << " bytes), at: " << predicted.peak_moment << "\n";
  }
  if (resumed_at > 0) {
    std::cout << "resumed from " << last_snapshot << " after step " << resumed_at << " of "
              << trainer.total_steps() << "\n";
  }
  std::cout << std::flush;

  Progress progress(trainer.total_steps(), options.print_every,
                    config.loss_scaling != train::LossScaling::none,
                    config.clip_grad_norm > 0.0f);
  // The boundary's pass measures the gradients' norm when it runs: with a scaler or clipping.
  const bool norm_measured =
      config.loss_scaling != train::LossScaling::none || config.clip_grad_norm > 0.0f;
  // A resumed run that has no step left reports the snapshot's scale and skips.
  const train::TrainerState start = trainer.state();
  float last_loss = 0;
  float last_scale = start.scaler ? start.scaler->scale
                     : config.loss_scaling == train::LossScaling::fixed ? config.fixed_scale
                                                                         : 1.0f;
  std::int64_t skipped = start.skipped_steps;
  std::int64_t snapshot_step = resumed_at;
  const auto write_snapshot = [&] {
    if (log.is_open()) log.flush();  // every line up to the snapshot's step is in the file
    last_snapshot = snapshots->write(model, optimizer, trainer, settings);
    snapshot_step = trainer.steps_done();
  };
  g_stop_signal = 0;
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  try {
    trainer.run([&](const train::StepRecord& record) {
      last_loss = record.loss;
      last_scale = record.loss_scale;
      skipped = record.skipped_steps;
      progress.update(record);
      Json line = log_line(record, progress.elapsed(), norm_measured);
      if (options.eval_every > 0 && splits.test && record.step % options.eval_every == 0) {
        const nn::EvaluationResult test = nn::evaluate(model, *splits.test, micro_batch);
        progress.break_line();
        std::cout << "step " << record.step << ": test loss " << test.loss << ", accuracy "
                  << test.accuracy << "\n";
        line["test_loss"] = test.loss;
        line["test_accuracy"] = test.accuracy;
      }
      if (log.is_open()) log << line.dump() << '\n';
      const bool stop = g_stop_signal != 0;
      if (snapshots && (stop || (options.snapshot_every > 0 &&
                                 record.step % options.snapshot_every == 0))) {
        write_snapshot();
      }
      if (stop) throw Interrupted{static_cast<int>(g_stop_signal)};
    });
  } catch (const Interrupted& stop) {
    progress.break_line();
    if (log.is_open()) log.close();
    std::cout << "interrupted by " << (stop.signal == SIGINT ? "SIGINT" : "SIGTERM")
              << " after step " << trainer.steps_done() << " of " << trainer.total_steps();
    if (snapshots) {
      std::cout << ": snapshot " << last_snapshot << " written; continue with --resume "
                << snapshot_dir << "\n";
    } else {
      std::cout << ": nothing saved (give --snapshot-dir to keep the state)\n";
    }
    return 128 + stop.signal;
  } catch (const train::NonFiniteLossError& e) {
    throw std::runtime_error(std::string(e.what()) +
                             (last_snapshot.empty()
                                  ? std::string("; no snapshot was written")
                                  : "; the last snapshot is " + last_snapshot + " (step " +
                                        std::to_string(snapshot_step) + ")"));
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  progress.break_line();
  if (snapshots && snapshot_step != trainer.steps_done()) write_snapshot();
  const double seconds = progress.elapsed();
  if (log.is_open()) {
    log.close();
    if (!log) throw std::runtime_error("--log: writing " + options.log + " failed");
  }

  const std::int64_t steps_run = trainer.total_steps() - resumed_at;
  std::printf("trained %lld steps in %s (%.1f ms/step on average)\n",
              static_cast<long long>(steps_run), clock_time(seconds).c_str(),
              steps_run > 0 ? 1e3 * seconds / static_cast<double>(steps_run) : 0.0);
  if (snapshots) std::cout << "snapshot: " << last_snapshot << "\n";
  if (steps_run > 0) std::printf("final train loss (last batch): %.4f\n", last_loss);
  if (config.loss_scaling != train::LossScaling::none) {
    std::printf("loss scale: %g at the end; %lld of %lld steps skipped on an overflow\n",
                static_cast<double>(last_scale), static_cast<long long>(skipped),
                static_cast<long long>(trainer.total_steps()));
  }
  if (!options.save.empty()) {  // before the evaluation: nothing trained is lost after this
    model.save(options.save);
    std::cout << "saved the parameters to " << options.save << "\n";
  }
  if (splits.test) {
    const nn::EvaluationResult test = nn::evaluate(model, *splits.test, micro_batch);
    std::printf("test (%s, %lld samples): loss %.4f, accuracy %.4f\n", splits.test->name.c_str(),
                static_cast<long long>(test.samples), test.loss, test.accuracy);
  }
  if (steps_run > 0) std::cout << step_memory_report(device, trainer.largest_step_memory(), steps_run);
  return 0;
}

// ---- flags ------------------------------------------------------------------------------

/// A whole number >= minimum, refused in words ("--batch: must be at least 1, got 0")
/// rather than with CLI11's range check, which prints the type's limits.
CLI::Validator whole_number_from(std::int64_t minimum) {
  const std::string what = minimum == 0 ? "0 or more" : "at least " + std::to_string(minimum);
  return CLI::Validator(
      [minimum, what](std::string& text) -> std::string {
        std::int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error == std::errc::result_out_of_range) return "'" + text + "' is too large";
        if (error != std::errc() || end != text.data() + text.size()) {
          return "expected a whole number, got '" + text + "'";
        }
        if (value < minimum) return "must be " + what + ", got " + text;
        return {};
      },
      minimum == 0 ? ">=0" : ">=" + std::to_string(minimum));
}

/// A real number in [low, high], refused in words.
CLI::Validator real_number_in(double low, double high, const std::string& what) {
  return CLI::Validator(
      [low, high, what](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
          return "expected a number, got '" + text + "'";
        }
        if (value < low || value > high) return "must be " + what + ", got " + text;
        return {};
      },
      what);
}

/// One of a few words, refused with the list ("--norm: expected layer or batch, got x").
CLI::Validator one_of(const std::vector<std::string>& words) {
  std::string list;
  for (std::size_t i = 0; i < words.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  }
  return CLI::Validator(
      [words, list](std::string& text) -> std::string {
        if (std::find(words.begin(), words.end(), text) != words.end()) return {};
        return "expected " + list + ", got '" + text + "'";
      },
      list);
}

void add_train_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive_real = real_number_in(1e-30, 3.4e38, "positive");
  const CLI::Validator positive = whole_number_from(1), non_negative = whole_number_from(0);
  train.add_option("--data", o.data,
                   "fashion-mnist (train split; the test split is reported), synthetic "
                   "(10% held out for testing) or npy:FEATURES.npy,LABELS.npy")
      ->capture_default_str();
  train.add_option("--test-data", o.test_data, "npy:FEATURES.npy,LABELS.npy: a test split");
  train.add_option("--samples", o.synthetic_samples, "samples of --data synthetic")
      ->capture_default_str()->check(positive);
  train.add_option("--features", o.synthetic_features,
                   "features per sample of --data synthetic (Fashion-MNIST's 784 by default)")
      ->capture_default_str()->check(positive);
  train.add_option("--batch", o.batch, "samples per optimizer step")
      ->capture_default_str()->check(positive);
  train.add_option("--micro-batch", o.micro_batch,
                   "rows per forward/backward (gradient accumulation; default: --batch; "
                   "need not divide it)")
      ->check(positive);
  train.add_option("--depth", o.depth, "residual blocks (with --init: the file's)")
      ->capture_default_str()->check(non_negative);
  train.add_option("--hidden", o.hidden, "width of the residual stream (with --init: the file's)")
      ->capture_default_str()->check(positive);
  train.add_option("--expansion", o.expansion,
                   "blocks' inner width / hidden (with --init: the file's)")
      ->capture_default_str()->check(positive);
  train.add_option("--dropout", o.dropout, "dropout probability inside the blocks")
      ->capture_default_str()->check(real_number_in(0.0, 0.999, "in [0, 0.999]"));
  train.add_option("--norm", o.norm, "layer or batch (with --init: the file's)")
      ->capture_default_str()->check(one_of({"layer", "batch"}));
  train.add_option("--activation", o.activation,
                   "gelu (tanh approximation) or relu (with --init: the file's)")
      ->capture_default_str()->check(one_of({"gelu", "relu"}));
  train.add_option("--optimizer", o.optimizer, "sgd or adamw")
      ->capture_default_str()->check(one_of({"sgd", "adamw"}));
  const CLI::Validator non_negative_real = real_number_in(0.0, HUGE_VAL, "0 or more");
  train.add_option("--lr", o.lr,
                   "learning rate at --lr-reference-batch [default: 1e-3 for adamw, 0.05 "
                   "for sgd]")
      ->check(non_negative_real);
  train.add_option("--lr-scale", o.lr_scale,
                   "none, linear (lr x batch / reference: Goyal et al. 2017, for SGD) or "
                   "sqrt (lr x sqrt(batch / reference): common for Adam)")
      ->capture_default_str()->check(one_of({"none", "linear", "sqrt"}));
  train.add_option("--lr-reference-batch", o.lr_reference_batch,
                   "the batch --lr was tuned for (--lr-scale)")
      ->capture_default_str()->check(positive);
  train.add_option("--lr-schedule", o.lr_schedule,
                   "constant, or cosine: lr (1 + cos(pi t / T)) / 2 over the T optimizer "
                   "steps after the warm-up (PyTorch's CosineAnnealingLR, eta_min 0). t counts "
                   "optimizer steps taken: a step skipped on an overflow does not advance the "
                   "schedule or the warm-up, so the next step gets the rate the skipped one "
                   "had (as PyTorch's scheduler.step() after a skipped optimizer.step())")
      ->capture_default_str()->check(one_of({"constant", "cosine"}));
  train.add_option("--warmup-steps", o.warmup_steps,
                   "W optimizer steps of linear warm-up: step i < W uses lr (i + 1) / W "
                   "(PyTorch's LinearLR with start_factor 1/W)")
      ->capture_default_str()->check(non_negative);
  train.add_option("--momentum", o.momentum, "SGD momentum [default: 0.9]")
      ->check(non_negative_real);
  train.add_option("--weight-decay", o.weight_decay,
                   "weight decay [default: 0.01 for adamw, 0 for sgd]")
      ->check(non_negative_real);
  auto* steps = train.add_option("--steps", o.steps,
                                 "optimizer steps; they continue across epochs")
                    ->check(positive);
  auto* epochs = train.add_option("--epochs", o.epochs,
                                  "whole passes over the training data, as in PyTorch: an "
                                  "epoch is ceil(N / batch) steps, the last batch short "
                                  "(N mod batch samples) unless --drop-last; a batch never "
                                  "spans two epochs [default: 1 when --steps is not given]")
                     ->check(positive);
  steps->excludes(epochs);
  train.add_flag("--drop-last", o.drop_last,
                 "drop each epoch's short last batch: floor(N / batch) steps per epoch");
  train.add_option("--seed", o.seed, "initialisation, shuffling and dropout seed")
      ->capture_default_str()->check(non_negative);
  train.add_option("--shuffle", o.shuffle, "on: a fresh permutation per epoch; off: data order")
      ->capture_default_str()->check(one_of({"on", "off"}));
  train.add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  train.add_option("--device-memory", o.device_memory,
                   "cap the device's tracked memory (e.g. 48MiB, 2GiB; the data sets stay on "
                   "the host and do not count); past it the run fails with exit code 3");
  train.add_option("--init", o.init,
                   "initial parameters from a safetensors file (from --save); the model's "
                   "shape is the file's, a shape flag that disagrees is refused");
  train.add_option("--save", o.save, "write the trained parameters as safetensors");
  train.add_option("--log", o.log,
                   "one JSON line per step: step, epoch (fractional), loss, lr, samples, "
                   "time_s (since the start), step_time_s, loss_scale, skipped (an overflow), "
                   "with a loss scaler or --clip-grad-norm grad_norm (before clipping; null "
                   "on an overflow) and clip_factor, "
                   "peak_bytes_total (the step's own peak on the device) and peak_bytes (its "
                   "breakdown by category)");
  train.add_option("--eval-every", o.eval_every, "evaluate on the test split every N steps")
      ->check(non_negative);
  train.add_option("--precision", o.precision,
                   "fp32, or fp16: mixed precision with f16 weights and activations, f32 "
                   "master weights, gradients, statistics and loss (nn/model.hpp)")
      ->capture_default_str()->check(one_of({"fp32", "fp16"}));
  train.add_option("--checkpoint", o.checkpoint,
                   "activation checkpointing (chapter 05): none, every:K (keep every K-th "
                   "block's input), sqrt (K = ceil(sqrt(depth))), optimal:SLOTS (the "
                   "binomial schedule with SLOTS kept block inputs: the fewest recomputations), "
                   "selective (keep only the GEMM outputs, recompute the norms and "
                   "activations), POLICY+selective, or budget:BYTES (the policy of fewest "
                   "recomputations whose predicted step peak fits in BYTES, e.g. 96MiB)")
      ->capture_default_str();
  train.add_option("--snapshot-dir", o.snapshot_dir,
                   "save the training state (parameters, optimizer, loss scaler, counters, "
                   "settings) to DIR/step-N.safetensors: every --snapshot-every steps, at the "
                   "end, and on SIGINT or SIGTERM (the step in progress finishes first)");
  train.add_option("--snapshot-every", o.snapshot_every,
                   "steps between snapshots [default: 0, only at the end and when stopped]")
      ->check(whole_number_from(0));
  train.add_option("--snapshot-keep", o.snapshot_keep, "the newest snapshots to keep")
      ->capture_default_str()
      ->check(whole_number_from(1));
  train.add_option("--resume", o.resume,
                   "continue from the newest snapshot in DIR, to the same bits as a run "
                   "never stopped; the settings must be the run's (a changed one is named), "
                   "and --log is cut back to the snapshot's step and continued");
  train.add_flag("--explain", o.explain, "print the checkpoint schedule, action by action, "
                 "and the step's predicted peak and the moment that holds it");
  train.add_option("--clip-grad-norm", o.clip_grad_norm,
                   "clip the step's gradients to this global L2 norm (PyTorch's "
                   "clip_grad_norm_): once per optimizer step, on the accumulated and unscaled "
                   "gradients; a skipped step is not clipped [default: off]")
      ->check(positive_real);
  train.add_option("--loss-scale", o.loss_scale,
                   "none, static:S (a fixed scale, e.g. static:1024: overflowing steps are "
                   "skipped) or dynamic (GradScaler's rules; --scale-*)")
      ->capture_default_str();
  train.add_option("--scale-init", o.scaling.initial_scale, "dynamic: the first scale")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-growth", o.scaling.growth_factor,
                   "dynamic: the factor after --scale-interval clean steps (> 1)")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-backoff", o.scaling.backoff_factor,
                   "dynamic: the factor on an overflow (in (0, 1))")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-interval", o.scaling.growth_interval,
                   "dynamic: clean optimizer steps in a row before a growth")
      ->capture_default_str()->check(positive);
  train.add_option("--scale-min", o.scaling.min_scale,
                   "dynamic: a backoff below it stops the run (exit code 1)")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-max", o.scaling.max_scale, "dynamic: growth stops here")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-hysteresis", o.scaling.hysteresis,
                   "dynamic: overflows in a row before a backoff (every overflow skips its "
                   "step)")
      ->capture_default_str()->check(positive);
  train.add_option("--print-every", o.print_every,
                   "steps between progress lines when stdout is not a terminal [default: "
                   "steps/20; the first and last steps are always printed]")
      ->check(non_negative);
}

/// The planner's flags (chapter 06), on `bigbatch plan` and `bigbatch train`.
void add_plan_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--calibration", o.calibration,
                 "the planner's cost-model file (JSON, keyed by model, optimizer and device; "
                 "measured once and reused) [default: $XDG_CACHE_HOME or ~/.cache, "
                 "bigbatch/calibration.json]");
  app.add_flag("--recalibrate", o.recalibrate,
               "measure the planner's cost model again (a few steps of the model)");
}

}  // namespace
}  // namespace bigbatch

int main(int argc, char** argv) {
  using namespace bigbatch;
  CLI::App app{"bigbatch: large effective batches on one GPU"};
  app.require_subcommand(1);
  std::string cpu;  // the CPU paths the kernels may take (BIGBATCH_MAX_ISA hides some)
  try {
    cpu = cpu_description();
  } catch (const std::invalid_argument& e) {
    std::cerr << "bigbatch: " << e.what() << "\n";
    return kExitBadInput;
  }
  app.set_version_flag("--version", std::string("bigbatch ") + BIGBATCH_VERSION + "\nCPU: " + cpu);
  app.footer(kExitCodes);
  TrainOptions options;
  CLI::App* train = app.add_subcommand("train", "train the residual MLP on a data set");
  train->footer(kExitCodes);
  add_train_flags(*train, options);
  add_plan_flags(*train, options);
  train->add_option("--plan", options.plan,
                    "auto: train with the plan `bigbatch plan` picks for --device-memory "
                    "(chapter 06: micro-batch, precision and checkpoint policy chosen for you)");
  CLI::App* plan = app.add_subcommand(
      "plan", "list the plans (micro-batch, precision, checkpoint policy) whose step fits in "
              "--device-memory, with predicted peak and step time, fastest first; takes "
              "train's flags");
  plan->footer(kExitCodes);
  add_train_flags(*plan, options);
  add_plan_flags(*plan, options);
  plan->add_flag("--json", options.json,
                 "print the answer as one JSON object instead of the table: batch, "
                 "budget_bytes, device, calibration, calibration_measured_now, cost_model, "
                 "weighed, feasible (every plan that fits, fastest first: micro_batch, "
                 "micro_batches, precision, loss_scale, checkpoint, recompute, peak_bytes, "
                 "peak_moment, seconds), and when nothing fits (exit code 3, the reason on "
                 "stderr) smallest (the plan of smallest peak) and fixed_bytes (what no plan "
                 "can trade away)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the flag, not CLI11's two (the error, then a hint).
    const std::string command = plan->parsed() ? " plan" : train->parsed() ? " train" : "";
    std::cerr << "bigbatch" << command << ": " << e.what() << " (see bigbatch" << command
              << " --help)\n";
    return kExitBadInput;
  }
  CLI::App* command = plan->parsed() ? plan : train;
  for (const CLI::Option* option : command->get_options()) {
    if (option->count() > 0) options.given.insert(option->get_name());
  }
  const std::string name = "bigbatch " + command->get_name();
  try {
    return command == plan ? run_plan(options) : run_train(options);
  } catch (const UsageError& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return kExitBadInput;
  } catch (const NoPlanFits& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return kExitOutOfMemory;
  } catch (const OutOfMemoryError& e) {
    std::cerr << "\n" << name << ": " << e.what() << "\n";
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::cerr << "\n" << name << ": " << e.what() << "\n";
    return kExitFailure;
  }
}
