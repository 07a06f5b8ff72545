// bigbatch.cpp: the command-line program. `bigbatch train` trains the model of
// nn/model.hpp on a data set with the trainer of chapters/train/trainer.hpp.
//
// Exit codes: 0 success, 1 any other failure, 2 bad input (flags, data, files),
// 3 out of memory (the allocator's cap, --device-memory, or the device itself).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/cuda_runtime.hpp"
#include "common/data/dataset.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bigbatch {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitOutOfMemory = 3;

/// A mistake of the user's: reported without a stack of context, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainOptions {
  std::string data = "synthetic";
  std::string test_data;
  std::int64_t synthetic_samples = 60000;
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
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  std::uint64_t seed = 0;
  std::string shuffle = "on";
  std::string device = "cpu";
  std::string device_memory;
  std::string init, save, log;
  std::int64_t eval_every = 0;
  std::int64_t print_every = 0;
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
    splits.train = load_fashion_mnist(FashionMnistSplit::train, directory);
    splits.test = load_fashion_mnist(FashionMnistSplit::test, directory);
  } else if (options.data == "synthetic") {
    SyntheticOptions synthetic;
    synthetic.samples = options.synthetic_samples;
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

nn::Optimizer::Options optimizer_options(const TrainOptions& options) {
  if (options.optimizer == "sgd") {
    SgdOptions sgd;
    sgd.lr = options.lr.value_or(0.05);
    sgd.momentum = options.momentum.value_or(0.9);
    sgd.weight_decay = options.weight_decay.value_or(0.0);
    return sgd;
  }
  if (options.momentum) throw UsageError("--momentum applies to --optimizer sgd only");
  AdamWOptions adamw;
  adamw.lr = options.lr.value_or(1e-3);
  adamw.weight_decay = options.weight_decay.value_or(1e-2);
  return adamw;
}

/// {"parameters":123,"master_weights":0,...}
std::string peak_json(const MemoryStats::PerCategory& peak) {
  std::ostringstream out;
  out << '{';
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    out << (c ? "," : "") << '"' << category_name(static_cast<MemoryCategory>(c))
        << "\":" << peak[c];
  }
  out << '}';
  return out.str();
}

/// A float as JSON: NaN and infinities (a diverged run) become null.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

/// Progress: one line rewritten in place on a terminal, plain lines every N steps else.
class Progress {
 public:
  Progress(std::int64_t total_steps, std::int64_t print_every)
      : total_(total_steps),
        terminal_(::isatty(STDOUT_FILENO) != 0),
        every_(print_every > 0 ? print_every : std::max<std::int64_t>(1, total_steps / 20)),
        start_(std::chrono::steady_clock::now()) {}

  void update(const train::StepRecord& record) {
    const double seconds = elapsed();
    const double rate = seconds > 0 ? static_cast<double>(record.samples) / seconds : 0.0;
    char line[160];
    if (terminal_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * record.step / total_);
      std::snprintf(line, sizeof line, "\rstep %lld/%lld [%s%s] loss %.4f  %.0f samples/s ",
                    static_cast<long long>(record.step), static_cast<long long>(total_),
                    std::string(filled, '=').c_str(), std::string(kWidth - filled, ' ').c_str(),
                    record.loss, rate);
      std::cout << line << std::flush;
      dirty_ = true;
    } else if (record.step % every_ == 0 || record.step == total_) {
      std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  %.0f samples/s\n",
                    static_cast<long long>(record.step), static_cast<long long>(total_),
                    record.loss, rate);
      std::cout << line << std::flush;
    }
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
  bool terminal_;
  std::int64_t every_;
  std::chrono::steady_clock::time_point start_;
  bool dirty_ = false;
};

/// Fails early (before any training) when --save could not be written at the end.
void check_writable(const std::string& path) {
  const std::string probe = path + ".tmp";
  std::ofstream out(probe);
  if (!out) throw UsageError("--save: cannot write " + path);
  out.close();
  std::remove(probe.c_str());
}

int run_train(const TrainOptions& options) {
  if (options.micro_batch > options.batch) {
    throw UsageError("--micro-batch " + std::to_string(options.micro_batch) +
                     " is larger than --batch " + std::to_string(options.batch));
  }
  // Rows per forward pass, in training and in evaluation: what the memory was sized for.
  const std::int64_t micro_batch = options.micro_batch > 0 ? options.micro_batch : options.batch;
  if (options.norm == "batch" && (micro_batch < 2 || options.batch % micro_batch == 1)) {
    throw UsageError("--norm batch needs at least 2 samples in every micro-batch (batch " +
                     std::to_string(options.batch) + " in micro-batches of " +
                     std::to_string(micro_batch) + " leaves one with a single sample)");
  }
  if (!options.save.empty()) check_writable(options.save);
  const Device device = choose_device(options.device);
  const Splits splits = load_data(options);
  const std::int64_t classes =
      std::max(splits.train.num_classes, splits.test ? splits.test->num_classes : 0);

  if (!options.device_memory.empty()) {
    try {
      allocator_for(device).set_cap(parse_bytes(options.device_memory));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--device-memory: ") + e.what());
    }
  }

  nn::ModelConfig model_config;
  model_config.inputs = splits.train.feature_dim();
  model_config.hidden = options.hidden;
  model_config.expansion = options.expansion;
  model_config.classes = classes;
  model_config.depth = options.depth;
  model_config.dropout = options.dropout;
  model_config.norm = options.norm == "batch" ? nn::Norm::batch : nn::Norm::layer;
  model_config.activation =
      options.activation == "relu" ? nn::Activation::relu : nn::Activation::gelu;
  model_config.seed = options.seed;
  nn::Model model(model_config, device);
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
  config.shuffle = options.shuffle == "on";
  config.seed = options.seed;
  train::Trainer trainer(model, optimizer, splits.train, config);

  std::ofstream log;
  if (!options.log.empty()) {
    log.open(options.log);
    if (!log) throw UsageError("--log: cannot write " + options.log);
  }
  std::cout << "bigbatch train: " << splits.train.name << " (" << splits.train.size()
            << " samples, " << splits.train.feature_dim() << " features, " << classes
            << " classes), model depth " << options.depth << " hidden " << options.hidden
            << " (" << model.parameter_count() << " parameters), batch " << options.batch
            << " in micro-batches of " << micro_batch << ", "
            << trainer.total_steps() << " steps on " << device.name() << "\n";

  Progress progress(trainer.total_steps(), options.print_every);
  float last_loss = 0;
  trainer.run([&](const train::StepRecord& record) {
    last_loss = record.loss;
    progress.update(record);
    std::string evaluation;
    if (options.eval_every > 0 && splits.test && record.step % options.eval_every == 0) {
      const nn::EvaluationResult test = nn::evaluate(model, *splits.test, micro_batch);
      progress.break_line();
      std::cout << "step " << record.step << ": test loss " << test.loss << ", accuracy "
                << test.accuracy << "\n";
      evaluation = ",\"test_loss\":" + json_number(test.loss) +
                   ",\"test_accuracy\":" + json_number(test.accuracy);
    }
    if (log.is_open()) {
      log << "{\"step\":" << record.step << ",\"loss\":" << json_number(record.loss)
          << ",\"samples\":" << record.samples << ",\"peak_bytes\":"
          << peak_json(record.peak_bytes) << evaluation << "}\n";
    }
  });
  progress.break_line();
  const double seconds = progress.elapsed();
  if (log.is_open()) {
    log.close();
    if (!log) throw std::runtime_error("--log: writing " + options.log + " failed");
  }

  std::printf("trained %lld steps in %.1f s (%.1f steps/s)\n",
              static_cast<long long>(trainer.total_steps()), seconds,
              static_cast<double>(trainer.total_steps()) / seconds);
  std::printf("final train loss (last batch): %.4f\n", last_loss);
  if (!options.save.empty()) {  // before the evaluation: nothing trained is lost after this
    model.save(options.save);
    std::cout << "saved the parameters to " << options.save << "\n";
  }
  if (splits.test) {
    const nn::EvaluationResult test = nn::evaluate(model, *splits.test, micro_batch);
    std::printf("test (%s, %lld samples): loss %.4f, accuracy %.4f\n", splits.test->name.c_str(),
                static_cast<long long>(test.samples), test.loss, test.accuracy);
  }
  std::cout << allocator_for(device).report() << "\n";
  return 0;
}

void add_train_flags(CLI::App& train, TrainOptions& o) {
  train.add_option("--data", o.data,
                   "fashion-mnist (train split; the test split is reported), synthetic "
                   "(10% held out for testing) or npy:FEATURES.npy,LABELS.npy")
      ->capture_default_str();
  train.add_option("--test-data", o.test_data, "npy:FEATURES.npy,LABELS.npy: a test split");
  train.add_option("--samples", o.synthetic_samples, "samples of --data synthetic")
      ->capture_default_str()->check(CLI::PositiveNumber);
  train.add_option("--batch", o.batch, "samples per optimizer step")
      ->capture_default_str()->check(CLI::PositiveNumber);
  train.add_option("--micro-batch", o.micro_batch,
                   "rows per forward/backward (gradient accumulation; default: --batch; "
                   "need not divide it)")
      ->check(CLI::PositiveNumber);
  train.add_option("--depth", o.depth, "residual blocks")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  train.add_option("--hidden", o.hidden, "width of the residual stream")
      ->capture_default_str()->check(CLI::PositiveNumber);
  train.add_option("--expansion", o.expansion, "blocks' inner width / hidden")
      ->capture_default_str()->check(CLI::PositiveNumber);
  train.add_option("--dropout", o.dropout, "dropout probability inside the blocks")
      ->capture_default_str()->check(CLI::Range(0.0f, 0.999f));
  train.add_option("--norm", o.norm, "layer or batch")
      ->capture_default_str()->check(CLI::IsMember({"layer", "batch"}));
  train.add_option("--activation", o.activation, "gelu (tanh approximation) or relu")
      ->capture_default_str()->check(CLI::IsMember({"gelu", "relu"}));
  train.add_option("--optimizer", o.optimizer, "sgd or adamw")
      ->capture_default_str()->check(CLI::IsMember({"sgd", "adamw"}));
  train.add_option("--lr", o.lr, "learning rate [default: 1e-3 for adamw, 0.05 for sgd]")
      ->check(CLI::NonNegativeNumber);
  train.add_option("--momentum", o.momentum, "SGD momentum [default: 0.9]")
      ->check(CLI::NonNegativeNumber);
  train.add_option("--weight-decay", o.weight_decay,
                   "weight decay [default: 0.01 for adamw, 0 for sgd]")
      ->check(CLI::NonNegativeNumber);
  auto* steps = train.add_option("--steps", o.steps, "optimizer steps")
                    ->check(CLI::PositiveNumber);
  auto* epochs = train.add_option("--epochs", o.epochs,
                                  "passes over the training data [default: 1 when --steps "
                                  "is not given]")
                     ->check(CLI::PositiveNumber);
  steps->excludes(epochs);
  train.add_option("--seed", o.seed, "initialisation, shuffling and dropout seed")
      ->capture_default_str();
  train.add_option("--shuffle", o.shuffle, "on: a fresh permutation per epoch; off: data order")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  train.add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  train.add_option("--device-memory", o.device_memory,
                   "cap the device's tracked memory (e.g. 2GiB, 300MB; on the cpu the data "
                   "set counts too); past it the run fails with exit code 3");
  train.add_option("--init", o.init, "initial parameters from a safetensors file (from --save)");
  train.add_option("--save", o.save, "write the trained parameters as safetensors");
  train.add_option("--log", o.log, "one JSON line per step: step, loss, samples, peak_bytes");
  train.add_option("--eval-every", o.eval_every, "evaluate on the test split every N steps")
      ->check(CLI::NonNegativeNumber);
  train.add_option("--print-every", o.print_every,
                   "steps between progress lines when stdout is not a terminal [default: "
                   "steps/20]")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace
}  // namespace bigbatch

int main(int argc, char** argv) {
  using namespace bigbatch;
  CLI::App app{"bigbatch: large effective batches on one GPU"};
  app.require_subcommand(1);
  TrainOptions options;
  CLI::App* train = app.add_subcommand("train", "train the residual MLP on a data set");
  add_train_flags(*train, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error with a hint
    return code == 0 ? 0 : kExitBadInput;
  }
  try {
    return run_train(options);
  } catch (const UsageError& e) {
    std::cerr << "bigbatch train: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const OutOfMemoryError& e) {
    std::cerr << "\nbigbatch train: " << e.what() << "\n";
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::cerr << "\nbigbatch train: " << e.what() << "\n";
    return kExitFailure;
  }
}
