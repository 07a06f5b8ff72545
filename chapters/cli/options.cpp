// options.cpp: the flags, read into TrainOptions' typed fields, and every word of them.
#include "chapters/cli/options.hpp"

#include <CLI/CLI.hpp>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/format.hpp"

namespace bigbatch::cli {
namespace {

/// The words a flag takes, with their values, in the order --help lists them.
template <class E>
using Words = std::vector<std::pair<std::string, E>>;

const Words<nn::Norm> kNorms = {{"layer", nn::Norm::layer}, {"batch", nn::Norm::batch}};
const Words<nn::Activation> kActivations = {{"gelu", nn::Activation::gelu},
                                            {"relu", nn::Activation::relu}};
const Words<nn::Precision> kPrecisions = {{"fp32", nn::Precision::fp32},
                                          {"fp16", nn::Precision::fp16},
                                          {"bf16", nn::Precision::bf16}};
const Words<nn::AttentionKernel> kAttentionKernels = {
    {"plain", nn::AttentionKernel::plain}, {"efficient", nn::AttentionKernel::efficient}};
const Words<ModelKind> kModels = {{"mlp", ModelKind::mlp}, {"gpt", ModelKind::gpt}};
const Words<OptimizerKind> kOptimizers = {{"sgd", OptimizerKind::sgd},
                                          {"adamw", OptimizerKind::adamw}};
const Words<nn::LrScale> kLrScales = {
    {"none", nn::LrScale::none}, {"linear", nn::LrScale::linear}, {"sqrt", nn::LrScale::sqrt}};
const Words<nn::LrScheduleKind> kSchedules = {{"constant", nn::LrScheduleKind::constant},
                                              {"cosine", nn::LrScheduleKind::cosine}};
const Words<bool> kOnOff = {{"on", true}, {"off", false}};
const Words<bool> kPlans = {{"auto", true}};
const Words<collectives::Reduction> kReductions = {
    {"deterministic", collectives::Reduction::deterministic},
    {"engine", collectives::Reduction::engine}};
const Words<data_parallel::ZeroStage> kZeroStages = {
    {"0", data_parallel::ZeroStage::replicated},
    {"1", data_parallel::ZeroStage::optimizer_state},
    {"2", data_parallel::ZeroStage::gradients}};
const Words<ModelledDevice> kModelledDevices = {{"h200", ModelledDevice::h200}};

template <class E>
std::optional<E> value_of(const Words<E>& words, std::string_view word) {
  for (const auto& [text, value] : words) {
    if (text == word) return value;
  }
  return std::nullopt;
}

template <class E>
std::string word_of(const Words<E>& words, E value) {
  for (const auto& [text, v] : words) {
    if (v == value) return text;
  }
  return "?";
}

/// "layer or batch", "none, linear or sqrt".
template <class E>
std::string listed(const Words<E>& words) {
  std::string list;
  for (std::size_t i = 0; i < words.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i].first;
  }
  return list;
}

/// A flag whose text is checked (and read) by `read`, which returns the refusal in words
/// ("expected ..., got 'x'") or nothing, and whose value `apply` then stores. Every flag
/// that is not a plain number or a file name goes through here: the parsing edge.
CLI::Option* add_read_option(CLI::App& app, const std::string& flag, const std::string& help,
                             std::function<std::string(const std::string&)> read,
                             std::function<void(const std::string&)> apply,
                             const std::string& type_name) {
  auto* option = app.add_option_function<std::string>(flag, std::move(apply), help);
  option->check(CLI::Validator(
      [read = std::move(read)](std::string& text) { return read(text); }, type_name));
  return option;
}

/// A flag that takes one of `words` into `field`, its default shown as a word.
template <class E>
CLI::Option* add_word_option(CLI::App& app, const std::string& flag, E& field,
                             const Words<E>& words, const std::string& help) {
  auto* option = add_read_option(
      app, flag, help,
      [&words](const std::string& text) -> std::string {
        if (value_of(words, text)) return {};
        return "expected " + listed(words) + ", got '" + text + "'";
      },
      [&words, &field](const std::string& text) { field = *value_of(words, text); },
      listed(words));
  option->default_str(word_of(words, field));
  return option;
}

}  // namespace

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

CLI::Option* add_seed_option(CLI::App& app, std::uint64_t& seed, const std::string& help) {
  return app.add_option("--seed", seed, help)->capture_default_str()->check(whole_number_from(0));
}

namespace {

/// --loss-scale: none, static:S or dynamic, into the trainer's rule and fixed scale.
std::string read_loss_scale(const std::string& text, train::TrainConfig* config) {
  const std::string refusal = "expected none, static:S with S > 0 (e.g. static:1024) or "
                              "dynamic, got '" + text + "'";
  if (text == "none" || text == "dynamic") {
    if (config != nullptr) {
      config->loss_scaling =
          text == "none" ? train::LossScaling::none : train::LossScaling::dynamic;
    }
    return {};
  }
  const std::string prefix = "static:";
  if (text.rfind(prefix, 0) != 0) return refusal;
  const std::string number = text.substr(prefix.size());
  char* end = nullptr;
  const double scale = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(scale > 0) ||
      !(scale < 3.4e38)) {
    return refusal;
  }
  if (config != nullptr) {
    config->loss_scaling = train::LossScaling::fixed;
    config->fixed_scale = static_cast<float>(scale);
  }
  return {};
}

/// The text of an std::invalid_argument from `parse(text)`, or nothing when it reads.
template <class Parse>
std::string refusal_of(Parse&& parse) {
  try {
    parse();
    return {};
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

}  // namespace

DataSource DataSource::parse(std::string_view text) {
  if (text == "fashion-mnist") return {DataKind::fashion_mnist, {}, {}, {}};
  if (text == "synthetic") return {DataKind::synthetic, {}, {}, {}};
  for (const auto& [prefix, kind] : {std::pair{std::string_view("text:"), DataKind::text},
                                     std::pair{std::string_view("tokens:"), DataKind::tokens}}) {
    if (text.substr(0, prefix.size()) != prefix) continue;
    if (text.size() == prefix.size()) {
      throw std::invalid_argument(std::string(text) + ": expected " + std::string(prefix) +
                                  (kind == DataKind::text ? "FILE" : "SEQUENCES.npy"));
    }
    return {kind, {}, {}, std::string(text.substr(prefix.size()))};
  }
  const std::string_view prefix = "npy:";
  if (text.substr(0, prefix.size()) == prefix) {
    const std::string_view files = text.substr(prefix.size());
    const std::size_t comma = files.find(',');
    if (comma == std::string_view::npos || comma == 0 || comma + 1 == files.size()) {
      throw std::invalid_argument(std::string(text) + ": expected npy:FEATURES.npy,LABELS.npy");
    }
    return {DataKind::npy, std::string(files.substr(0, comma)),
            std::string(files.substr(comma + 1)), {}};
  }
  throw std::invalid_argument("expected fashion-mnist, synthetic, npy:FEATURES.npy,LABELS.npy, "
                              "text:FILE or tokens:SEQUENCES.npy, got '" + std::string(text) +
                              "'");
}

std::string DataSource::text() const {
  switch (kind) {
    case DataKind::fashion_mnist: return "fashion-mnist";
    case DataKind::synthetic: return "synthetic";
    case DataKind::npy: return "npy:" + features_file + "," + labels_file;
    case DataKind::text: return "text:" + file;
    case DataKind::tokens: return "tokens:" + file;
  }
  return "?";
}

std::optional<nn::Norm> norm_named(std::string_view word) { return value_of(kNorms, word); }
std::optional<nn::Precision> precision_named(std::string_view word) {
  return value_of(kPrecisions, word);
}

std::optional<nn::AttentionKernel> attention_kernel_named(std::string_view word) {
  return value_of(kAttentionKernels, word);
}
std::optional<nn::Activation> activation_named(std::string_view word) {
  return value_of(kActivations, word);
}

namespace {

/// Adds --data, --test-data, --validation, --samples, --features, --batch and --micro-batch.
void add_data_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive = whole_number_from(1);
  const CLI::Validator non_negative = whole_number_from(0);
  add_read_option(
      train, "--data",
      "fashion-mnist (train split; the test split is reported), synthetic (10% held out for "
      "testing), npy:FEATURES.npy,LABELS.npy, or for --model gpt text:FILE (byte tokens of the "
      "documents of a text file: fortune(6)'s %-separated format, else paragraphs; every "
      "tenth document held out for testing) or tokens:SEQUENCES.npy (token ids [N, L] of any "
      "integer dtype, a sequence a row, which negative values may pad to its end; its "
      "sequences hold L - 1 positions)",
      [](const std::string& text) { return refusal_of([&] { DataSource::parse(text); }); },
      [&o](const std::string& text) { o.source.data = DataSource::parse(text); }, "DATA")
      ->default_str(o.source.data.text());
  add_read_option(
      train, "--test-data", "npy:FEATURES.npy,LABELS.npy: a test split",
      [](const std::string& text) -> std::string {
        if (text.rfind("npy:", 0) != 0) return "expected npy:X.npy,y.npy, got '" + text + "'";
        return refusal_of([&] { DataSource::parse(text); });
      },
      [&o](const std::string& text) { o.test_data = DataSource::parse(text); }, "NPY");
  train.add_option("--validation", o.source.validation,
                   "hold out the training data's last N samples as a validation split, "
                   "trained on never and evaluated in place of the test split (choose "
                   "settings by it; keep the test split for the end)")
      ->check(non_negative);
  train.add_option("--samples", o.source.samples, "samples of --data synthetic")
      ->capture_default_str()->check(positive);
  train.add_option("--features", o.source.features,
                   "features per sample of --data synthetic (Fashion-MNIST's 784 by default)")
      ->capture_default_str()->check(positive);
  train.add_option("--batch", o.train.batch, "samples per optimizer step")
      ->capture_default_str()->check(positive);
  train.add_option("--micro-batch", o.train.micro_batch,
                   "rows per forward/backward (gradient accumulation; default: --batch; "
                   "need not divide it)")
      ->check(positive);
}

/// Adds --model and the GPT's --seq-len, --vocabulary, --layers, --width, --heads, --attention.
void add_gpt_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive = whole_number_from(1);
  add_word_option(train, "--model", o.model_kind, kModels,
                  "mlp (the residual MLP of chapters 00-07) or gpt (chapter 08's decoder: "
                  "nanoGPT's GPT on byte tokens, its head tied to the token embedding)");
  train.add_option("--seq-len", o.gpt.context,
                   "--model gpt: positions per sequence, the model's context (nanoGPT's "
                   "block_size); longer documents are cut into pieces (tokens:: at least the "
                   "file's L - 1)")
      ->capture_default_str()->check(positive);
  train.add_option("--vocabulary", o.gpt.vocabulary,
                   "--model gpt: token ids [0, V), the embedding's rows (text: bytes, 256 or "
                   "more; tokens:: above the file's largest id)")
      ->capture_default_str()->check(positive);
  train.add_option("--layers", o.gpt.layers, "--model gpt: transformer blocks")
      ->capture_default_str()->check(positive);
  train.add_option("--width", o.gpt.width, "--model gpt: the residual stream (n_embd)")
      ->capture_default_str()->check(positive);
  train.add_option("--heads", o.gpt.heads, "--model gpt: attention heads, dividing --width")
      ->capture_default_str()->check(positive);
  add_word_option(train, "--attention", o.gpt.attention, kAttentionKernels,
                  "--model gpt: plain (each block keeps its attention's probabilities, b heads "
                  "T^2, for the backward) or efficient (tiles of keys with a running max and "
                  "sum: each block keeps two floats a query row and rebuilds the "
                  "probabilities in its backward; other roundings, so other bits). bigbatch "
                  "plan and --plan auto weigh both unless it is given");
}

/// Adds the MLP's shape: --depth, --hidden, --expansion, --dropout, --norm, --activation.
void add_mlp_shape_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive = whole_number_from(1);
  const CLI::Validator non_negative = whole_number_from(0);
  train.add_option("--depth", o.model.depth, "residual blocks (with --init: the file's)")
      ->capture_default_str()->check(non_negative);
  train.add_option("--hidden", o.model.hidden,
                   "width of the residual stream (with --init: the file's)")
      ->capture_default_str()->check(positive);
  train.add_option("--expansion", o.model.expansion,
                   "blocks' inner width / hidden (with --init: the file's)")
      ->capture_default_str()->check(positive);
  train.add_option("--dropout", o.model.dropout, "dropout probability inside the blocks")
      ->capture_default_str()->check(real_number_in(0.0, 0.999, "in [0, 0.999]"));
  add_word_option(train, "--norm", o.model.norm, kNorms,
                  "layer or batch (with --init: the file's)");
  add_word_option(train, "--activation", o.model.activation, kActivations,
                  "gelu (tanh approximation) or relu (with --init: the file's)");
}

/// Adds --optimizer, --lr and the --lr-* flags, --warmup-steps, --momentum, --weight-decay.
void add_optimizer_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive = whole_number_from(1);
  const CLI::Validator non_negative = whole_number_from(0);
  const CLI::Validator non_negative_real = real_number_in(0.0, HUGE_VAL, "0 or more");
  add_word_option(train, "--optimizer", o.optimizer.kind, kOptimizers, "sgd or adamw");
  train.add_option("--lr", o.optimizer.lr,
                   "learning rate at --lr-reference-batch [default: 1e-3 for adamw, 0.05 "
                   "for sgd]")
      ->check(non_negative_real);
  add_word_option(train, "--lr-scale", o.optimizer.lr_scale, kLrScales,
                  "none, linear (lr x batch / reference: Goyal et al. 2017, for SGD) or "
                  "sqrt (lr x sqrt(batch / reference): common for Adam)");
  train.add_option("--lr-reference-batch", o.optimizer.lr_reference_batch,
                   "the batch --lr was tuned for (--lr-scale)")
      ->capture_default_str()->check(positive);
  add_word_option(train, "--lr-schedule", o.train.lr_schedule, kSchedules,
                  "constant, or cosine: lr (1 + cos(pi t / T)) / 2 over the T optimizer "
                  "steps after the warm-up (PyTorch's CosineAnnealingLR, eta_min 0). t counts "
                  "optimizer steps taken: a step skipped on an overflow does not advance the "
                  "schedule or the warm-up, so the next step gets the rate the skipped one "
                  "had (as PyTorch's scheduler.step() after a skipped optimizer.step())");
  train.add_option("--warmup-steps", o.train.warmup_steps,
                   "W optimizer steps of linear warm-up: step i < W uses lr (i + 1) / W "
                   "(PyTorch's LinearLR with start_factor 1/W)")
      ->capture_default_str()->check(non_negative);
  train.add_option("--momentum", o.optimizer.momentum, "SGD momentum [default: 0.9]")
      ->check(non_negative_real);
  train.add_option("--weight-decay", o.optimizer.weight_decay,
                   "weight decay [default: 0.01 for adamw, 0 for sgd]")
      ->check(non_negative_real);
}

/// Adds --steps, --epochs, --drop-last, --seed and --shuffle.
void add_run_length_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive = whole_number_from(1);
  auto* steps = train.add_option("--steps", o.train.steps,
                                 "optimizer steps; they continue across epochs")
                    ->check(positive);
  auto* epochs = train.add_option("--epochs", o.train.epochs,
                                  "whole passes over the training data, as in PyTorch: an "
                                  "epoch is ceil(N / batch) steps, the last batch short "
                                  "(N mod batch samples) unless --drop-last; a batch never "
                                  "spans two epochs [default: 1 when --steps is not given]")
                     ->check(positive);
  steps->excludes(epochs);
  train.add_flag("--drop-last", o.train.drop_last,
                 "drop each epoch's short last batch: floor(N / batch) steps per epoch");
  add_seed_option(train, o.train.seed, "initialisation, shuffling and dropout seed");
  add_word_option(train, "--shuffle", o.train.shuffle, kOnOff,
                  "on: a fresh permutation per epoch; off: data order");
}

/// Adds --device and --device-memory.
void add_device_flags(CLI::App& train, TrainOptions& o) {
  add_read_option(
      train, "--device", "cpu, cuda or cuda:N",
      [](const std::string& text) { return refusal_of([&] { parse_device(text); }); },
      [&o](const std::string& text) { o.source.device = parse_device(text); }, "DEVICE")
      ->default_str(o.source.device.name());
  add_read_option(
      train, "--device-memory",
      "cap the device's tracked memory (e.g. 48MiB, 2GiB; the data sets stay on the host and "
      "do not count); past it the run fails with exit code 3",
      [](const std::string& text) { return refusal_of([&] { parse_bytes(text); }); },
      [&o](const std::string& text) { o.device_memory = parse_bytes(text); }, "SIZE");
}

/// Adds --init, --save, --log and --eval-every.
void add_output_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator non_negative = whole_number_from(0);
  train.add_option("--init", o.output.init,
                   "initial parameters from a safetensors file (from --save); the model's "
                   "shape is the file's, a shape flag that disagrees is refused");
  train.add_option("--save", o.output.save,
                   "write the trained parameters as safetensors (like --log and --calibration: "
                   "a regular file, or a link followed to one, checked before training; "
                   "refused when it names a folder, a device, another output or an input)");
  train.add_option("--log", o.output.log,
                   "one JSON line per step: step, epoch (fractional), loss, lr, samples, "
                   "time_s (since the start), step_time_s, loss_scale, skipped (an overflow), "
                   "with a loss scaler or --clip-grad-norm grad_norm (before clipping; null "
                   "on an overflow) and clip_factor, with --data-parallel or --simulate-ranks "
                   "reduce_time_s (the step's gradient sum over the ranks), with --model gpt targets (the "
                   "step's target tokens that are not padding), "
                   "peak_bytes_total (the step's own peak on the device) and peak_bytes (its "
                   "breakdown by category)");
  train.add_option("--eval-every", o.output.eval_every,
                   "evaluate on the test split (or --validation's) every N steps; the log "
                   "gains test_loss and test_accuracy (validation_loss, validation_accuracy)")
      ->check(non_negative);
}

/// Adds --precision and --checkpoint.
void add_memory_flags(CLI::App& train, TrainOptions& o) {
  add_word_option(train, "--precision", o.model.precision, kPrecisions,
                  "fp32, or fp16 or bf16: mixed precision with 16-bit weights and "
                  "activations, f32 master weights, gradients, statistics and loss "
                  "(nn/model.hpp). fp16 wants --loss-scale dynamic (small gradients flush "
                  "to zero); bf16 has fp32's range and runs without a scaler");
  add_read_option(
      train, "--checkpoint",
      "activation checkpointing (chapter 05): none, every:K (keep every K-th block's input), "
      "sqrt (K = ceil(sqrt(depth))), optimal:SLOTS (the binomial schedule with SLOTS kept "
      "block inputs: the fewest recomputations), selective (keep only the GEMM outputs, "
      "recompute the norms and activations), POLICY+selective, or budget:BYTES (the policy "
      "of fewest recomputations whose predicted step peak fits in BYTES, e.g. 96MiB); "
      "--model gpt checkpoints its transformer blocks (every policy but selective) and "
      "also takes attention (each block drops its attention's probabilities, b heads T^2, "
      "and rebuilds them in its backward) and POLICY+attention",
      [](const std::string& text) {
        return refusal_of([&] { checkpointing::Policy::parse(text); });
      },
      [&o](const std::string& text) { o.checkpoint = checkpointing::Policy::parse(text); },
      "POLICY")
      ->default_str(o.checkpoint.text());
}

/// Adds --snapshot-dir, --snapshot-every, --snapshot-keep, --resume and --explain.
void add_snapshot_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive = whole_number_from(1);
  const CLI::Validator non_negative = whole_number_from(0);
  train.add_option("--snapshot-dir", o.output.snapshot_dir,
                   "save the training state (parameters, optimizer, loss scaler, counters, "
                   "settings) to DIR/step-N.safetensors: every --snapshot-every steps, at the "
                   "end, and on SIGINT or SIGTERM (the step in progress finishes first); a "
                   "folder holds one run: one with another run's snapshots is refused");
  train.add_option("--snapshot-every", o.output.snapshot_every,
                   "steps between snapshots [default: 0, only at the end and when stopped]")
      ->check(non_negative);
  train.add_option("--snapshot-keep", o.output.snapshot_keep, "the newest snapshots to keep")
      ->capture_default_str()
      ->check(positive);
  train.add_option("--resume", o.output.resume,
                   "continue from the newest snapshot in DIR, to the same bits as a run "
                   "never stopped; the settings must be the run's (a changed one is named), "
                   "and --log is cut back to the snapshot's step and continued");
  train.add_flag("--explain", o.output.explain, "print the checkpoint schedule, action by "
                 "action, and the step's predicted peak and the moment that holds it");
}

/// Adds --clip-grad-norm, --loss-scale and the dynamic scaler's --scale-* flags.
void add_loss_scale_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator positive_real = real_number_in(1e-30, 3.4e38, "positive");
  const CLI::Validator positive = whole_number_from(1);
  train.add_option("--clip-grad-norm", o.train.clip_grad_norm,
                   "clip the step's gradients to this global L2 norm (PyTorch's "
                   "clip_grad_norm_): once per optimizer step, on the accumulated and unscaled "
                   "gradients; a skipped step is not clipped [default: off]")
      ->check(positive_real);
  add_read_option(
      train, "--loss-scale",
      "none, static:S (a fixed scale, e.g. static:1024: overflowing steps are skipped) or "
      "dynamic (GradScaler's rules; --scale-*)",
      [](const std::string& text) { return read_loss_scale(text, nullptr); },
      [&o](const std::string& text) { read_loss_scale(text, &o.train); }, "SCALE")
      ->default_str("none");
  auto& scaling = o.train.dynamic_scaling;
  train.add_option("--scale-init", scaling.initial_scale, "dynamic: the first scale")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-growth", scaling.growth_factor,
                   "dynamic: the factor after --scale-interval clean steps (> 1)")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-backoff", scaling.backoff_factor,
                   "dynamic: the factor on an overflow (in (0, 1))")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-interval", scaling.growth_interval,
                   "dynamic: clean optimizer steps in a row before a growth")
      ->capture_default_str()->check(positive);
  train.add_option("--scale-min", scaling.min_scale,
                   "dynamic: a backoff below it stops the run (exit code 1)")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-max", scaling.max_scale, "dynamic: growth stops here")
      ->capture_default_str()->check(positive_real);
  train.add_option("--scale-hysteresis", scaling.hysteresis,
                   "dynamic: overflows in a row before a backoff (every overflow skips its "
                   "step)")
      ->capture_default_str()->check(positive);
}

/// Adds --print-every.
void add_progress_flags(CLI::App& train, TrainOptions& o) {
  const CLI::Validator non_negative = whole_number_from(0);
  train.add_option("--print-every", o.output.print_every,
                   "steps between progress lines when stdout is not a terminal [default: "
                   "steps/20; the first and last steps are always printed]")
      ->check(non_negative);
}

}  // namespace

void add_train_flags(CLI::App& train, TrainOptions& o) {
  add_data_flags(train, o);
  add_gpt_flags(train, o);
  add_mlp_shape_flags(train, o);
  add_optimizer_flags(train, o);
  add_run_length_flags(train, o);
  add_device_flags(train, o);
  add_output_flags(train, o);
  add_memory_flags(train, o);
  add_snapshot_flags(train, o);
  add_loss_scale_flags(train, o);
  add_progress_flags(train, o);
}

void add_plan_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--calibration", o.plan.calibration,
                 "the planner's cost-model file (JSON, keyed by model, optimizer and device; "
                 "measured once and reused) [default: $XDG_CACHE_HOME or ~/.cache, "
                 "bigbatch/calibration.json]");
  app.add_flag("--recalibrate", o.plan.recalibrate,
               "measure the planner's cost model again (a few steps of the model)");
}

void add_device_model_flag(CLI::App& plan, TrainOptions& o) {
  add_word_option(plan, "--device-model", o.plan.modelled, kModelledDevices,
                  "h200: price the plans with a roofline model of NVIDIA's published H200 SXM "
                  "figures instead of measuring this machine (modelled, not measured; the "
                  "peaks are exact either way)")
      ->default_str("");
}

void add_plan_choice_flag(CLI::App& train, TrainOptions& o) {
  add_word_option(train, "--plan", o.plan.automatic, kPlans,
                  "auto: train with the plan `bigbatch plan` picks for --device-memory "
                  "(chapter 06: micro-batch, precision and checkpoint policy chosen for you)")
      ->default_str("");
}

namespace {

/// --zero, of `bigbatch train` (with ranks) and `bigbatch plan --ranks`.
void add_zero_flag(CLI::App& app, TrainOptions& o) {
  add_word_option(app, "--zero", o.parallel.zero, kZeroStages,
                  "what the ranks shard (DeepSpeed's ZeRO stages): 0 nothing, every rank "
                  "holds the whole optimizer state; 1 the optimizer state, each rank that of "
                  "its shard of every parameter, and in fp16 or bf16 the f32 masters too (a "
                  "reduce-scatter, the step of the shard, an all-gather of the parameters); "
                  "2 also the gradients, each rank holding its shard's, summed after every "
                  "micro-batch (with --bucket-size, in buckets during each backward); the "
                  "MLP's (not --model gpt's)");
}

}  // namespace

void add_data_parallel_flags(CLI::App& train, TrainOptions& o) {
  auto* parallel = train.add_flag(
      "--data-parallel", o.parallel.data_parallel,
      "train as one rank of an MPI job (mpirun -np R bigbatch train ... --data-parallel, "
      "chapter 07): each rank accumulates its share of every batch with no communication, "
      "and the ranks' gradients are summed once per optimizer step (MPI on the CPU, NCCL "
      "with --device cuda, one GPU per rank); rank 0 prints and writes the files; with "
      "--model gpt every rank divides by the whole batch's target tokens");
  auto* simulate = train.add_option(
      "--simulate-ranks", o.parallel.simulate_ranks,
      "compute each batch as R ranks would, in this one process: R gradient buffers added "
      "in rank order, the bits of mpirun -np R ... --data-parallel with the deterministic "
      "reduction")
      ->check(whole_number_from(1));
  parallel->excludes(simulate);
  add_word_option(train, "--reduction", o.parallel.reduction, kReductions,
                  "how --data-parallel sums over ranks: deterministic (rank order, the same "
                  "bits on every run with the same R) or engine (MPI_Allreduce, the "
                  "library's order)");
  add_read_option(
      train, "--bucket-size",
      "overlap --data-parallel's sum with the last micro-batch's backward (every "
      "micro-batch's under --zero 2): the gradients the backward has finished start their "
      "sums in buckets of this size (e.g. 4MiB; "
      "PyTorch DDP's default is 25MiB); 0, the default here, sums after the backward (on a "
      "CPU the engine moves the bytes with the cores that compute: chapter 07's README); "
      "the MLP's (not --model gpt's)",
      [](const std::string& text) { return refusal_of([&] { parse_bytes(text); }); },
      [&o](const std::string& text) { o.parallel.bucket_bytes = parse_bytes(text); }, "SIZE")
      ->default_str("0");
  add_zero_flag(train, o);
}

void add_rank_plan_flags(CLI::App& plan, TrainOptions& o) {
  plan.add_option("--ranks", o.plan.ranks,
                  "plan rank 0's step of a data-parallel run over R ranks of the modelled "
                  "cluster (chapter 07; needs --device-model): its share of the batch in "
                  "--device-memory, the gradient sum priced by the alpha-beta model")
      ->check(whole_number_from(1))
      ->capture_default_str();
  add_zero_flag(plan, o);
}

}  // namespace bigbatch::cli
