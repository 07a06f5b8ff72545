// Chapter 08: the model readers actually train. A GPT (nn/gpt.hpp) on the kernels every
// chapter shares, trained on byte tokens of an English corpus, with the lessons of chapters
// 02 to 05 told again in tokens: (a) accumulation divides by the step's count of target
// tokens, (b) what a block keeps for its backward, against the sequence length T, (c) fp32,
// fp16 with the dynamic scaler, and bf16 on the same run, and what the trained model writes,
// (d) where attention's 1/sqrt(D) goes so that fp16 does not overflow, (e) chapter 05's
// checkpoint policies on the transformer's blocks: the same bits for fewer bytes, (f) a
// sequence length whose attention no micro-batch fits, fitted by recomputing the blocks, by
// recomputing the attention's probabilities, and by memory-efficient attention.
// See README.md in this folder; --quick is the CTest setting.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/text_corpus.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/report.hpp"
#include "kernels/attention.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "nn/generate.hpp"
#include "nn/gpt.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bb = bigbatch;
namespace nn = bigbatch::nn;

namespace {

// Debian's fortunes-min, which the package fortunes (scripts/install-deps.sh) pulls in.
constexpr const char* kCorpus = "/usr/share/games/fortunes/fortunes";
constexpr std::int64_t kLength = 64;  // T, positions per sequence

struct Corpus {
  bb::TokenSequences train, held_out;
  std::string name;
};

// The corpus as padded sequences, every tenth document held out (as `bigbatch train
// --data text:FILE`); without the package, random documents of uneven lengths stand in.
Corpus load_corpus() {
  std::vector<std::string> documents;
  Corpus corpus;
  if (std::ifstream(kCorpus)) {
    documents = bb::read_documents(kCorpus);
    corpus.name = kCorpus;
  } else {
    std::printf("%s not found (Debian package fortunes): random documents stand in; the "
                "losses below then say nothing about English\n", kCorpus);
    documents = bb::synthetic_documents(400, 8, 200, 5);
    corpus.name = "400 random documents";
  }
  std::vector<std::string> training, held_out;
  for (std::size_t i = 0; i < documents.size(); ++i) {
    (i % 10 == 9 ? held_out : training).push_back(documents[i]);
  }
  corpus.train = bb::make_sequences(training, kLength);
  corpus.held_out = bb::make_sequences(held_out, kLength);
  return corpus;
}

nn::GptConfig small_gpt(nn::Precision precision) {
  return {.vocabulary = 256, .context = kLength, .layers = 2, .width = 64, .heads = 4,
          .dropout = 0.1f, .seed = 8, .precision = precision};
}

// The runs of (c) and (e): `steps` AdamW steps of `batch` sequences in micro-batches.
bb::train::TrainConfig steps_of(std::int64_t batch, std::int64_t micro, std::int64_t steps) {
  bb::train::TrainConfig config;
  config.batch = batch;
  config.micro_batch = micro;
  config.steps = steps;
  config.seed = 4;
  return config;
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

// ---- (a) accumulation by tokens --------------------------------------------------------

// Sequences [first, first + count) of `data` as tokens [count, T] and targets [count, T].
std::pair<bb::Tensor, bb::Tensor> rows_of(const bb::TokenSequences& data, std::int64_t first,
                                          std::int64_t count) {
  const auto part = [&](const std::vector<std::int32_t>& all) {
    return std::vector<std::int32_t>(all.begin() + first * data.length,
                                     all.begin() + (first + count) * data.length);
  };
  return {bb::Tensor::from_vector(part(data.tokens), {count, data.length}),
          bb::Tensor::from_vector(part(data.targets), {count, data.length})};
}

std::vector<double> gradients_of(nn::Gpt& model) {
  std::vector<double> all;
  for (const nn::NamedParameter& p : model.parameters()) {
    const std::vector<float> g = p.grad.to_vector<float>();
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

double distance(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (std::size_t k = 0; k < a.size(); ++k) sum += (a[k] - b[k]) * (a[k] - b[k]);
  return std::sqrt(sum);
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (a[k] != b[k]) return false;  // each is a float widened exactly
  }
  return true;
}

// One step's gradient of batch sequences [0, B) of the corpus, three ways: the batch in one
// piece; micro-batches of m with every target divided by the step's count N; and the
// mistake of 2024, each micro-batch's loss its own mean (divided by its own count n_k) and
// the M means averaged. The mistake weighs micro-batch k's targets by w_k = N / (M n_k):
// its gradient is sum_k w_k g_k, with g_k micro-batch k's share of the right one, which
// predicts its error before it is made.
void accumulation_by_tokens(bb::SelfCheck& report, const Corpus& corpus) {
  report.section("(a) Accumulation by tokens: every target divided by the step's count");
  const std::int64_t B = 8, m = 2, M = B / m;
  const bb::TokenSequences& data = corpus.train;
  nn::Gpt model(small_gpt(nn::Precision::fp32), bb::Device::cpu());
  const std::int64_t N = data.real_targets(0, B);
  std::string counts;
  for (std::int64_t k = 0; k < M; ++k) {
    counts += (k ? ", " : "") + std::to_string(data.real_targets(k * m, (k + 1) * m));
  }
  report.note("a batch of " + std::to_string(B) + " sequences of " + std::to_string(kLength) +
              " positions from " + corpus.name + ": " + std::to_string(N) +
              " target tokens, in micro-batches of " + std::to_string(m) + " holding " + counts);

  nn::ForwardContext context;
  context.dropout_seed = 3;  // sequence s draws its masks as sequence first_row + s
  // The right way, as the trainer runs it: one call over the batch, which divides by N and
  // completes the tied head's gradient once, after the last micro-batch.
  const auto accumulate = [&](std::int64_t micro) {
    model.zero_grad();
    const auto [tokens, targets] = rows_of(data, 0, B);
    nn::accumulate_gradients(model, tokens, targets, micro, context, N);
    return gradients_of(model);
  };
  const std::vector<double> batch = accumulate(B);
  const std::vector<double> by_tokens = accumulate(m);
  // Micro-batch k alone, its targets divided by `count`: the mistake with M n_k, and with N
  // the share g_k of the right gradient.
  const auto micro_batch = [&](std::int64_t k, std::int64_t count) {
    const auto [tokens, targets] = rows_of(data, k * m, m);
    nn::ForwardContext at = context;
    at.first_row = k * m;
    nn::accumulate_gradients(model, tokens, targets, m, at, count);
  };
  model.zero_grad();
  for (std::int64_t k = 0; k < M; ++k) micro_batch(k, M * data.real_targets(k * m, (k + 1) * m));
  const std::vector<double> means = gradients_of(model);
  std::vector<double> predicted(batch.size(), 0.0);  // sum_k w_k g_k
  for (std::int64_t k = 0; k < M; ++k) {
    model.zero_grad();
    micro_batch(k, N);
    const std::vector<double> g = gradients_of(model);
    const double w = static_cast<double>(N) /
                     static_cast<double>(M * data.real_targets(k * m, (k + 1) * m));
    for (std::size_t e = 0; e < g.size(); ++e) predicted[e] += w * g[e];
  }
  const double norm = distance(batch, std::vector<double>(batch.size(), 0.0));
  const double measured = distance(means, batch) / norm;
  const double foreseen = distance(predicted, batch) / norm;
  report.note("per-micro-batch means: the gradient is off by " + fixed(100 * measured, 2) +
              "% of its norm (predicted from the weights N / (M n_k): " +
              fixed(100 * foreseen, 2) + "%)");
  report.check(same_bits(by_tokens, batch),
               "every target divided by the step's " + std::to_string(N) +
                   ": the micro-batches give the batch's gradient, bit for bit");
  report.check(measured > 0.01, "per-micro-batch means are visibly wrong (over 1% of the norm)");
  // Both are f32 gradients rounded a few hundred times on their way (u = 6e-8 each): they
  // agree to about 1e-5 of the norm, so 1e-3 holds with a wide margin, while a prediction
  // that missed the weights would be off by the error itself.
  report.check(std::abs(measured - foreseen) < 1e-3,
               "the error is the one the weights predict (within 0.1% of the norm)");
}

// ---- (b) what a block keeps ------------------------------------------------------------

// A training forward's activation bytes per block, measured as the allocator's live bytes
// of a 2-block model less a 1-block model's, against gpt_saved_bytes and Korthikanti et al.
// (2022)'s 34 s b h + 5 a s^2 b for 16-bit activations.
void bytes_per_block(bb::SelfCheck& report, bool quick) {
  report.section("(b) What a block keeps for its backward, against T (bf16, width 384, "
                 "6 heads, one sequence)");
  const std::int64_t width = 384, heads = 6;
  const std::vector<std::int64_t> lengths =
      quick ? std::vector<std::int64_t>{64, 128, 256}
            : std::vector<std::int64_t>{64, 128, 256, 512, 1024};
  report.note("| T | measured | predicted | Korthikanti's | attention's T^2 share (ours) |");
  bool all_predicted = true, korthikanti_less_recomputed = true;
  for (const std::int64_t T : lengths) {
    const auto forward_bytes = [&](std::int64_t layers) {
      const nn::GptConfig config{.vocabulary = 256, .context = T, .layers = layers,
                                 .width = width, .heads = heads, .dropout = 0.1f, .seed = 1,
                                 .precision = nn::Precision::bf16};
      nn::Gpt model(config, bb::Device::cpu());
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(T));
      for (std::int64_t t = 0; t < T; ++t) tokens[t] = static_cast<std::int32_t>(t % 256);
      const bb::Tensor x = bb::Tensor::from_vector(tokens, {1, T});
      const auto live = [] {
        return bb::allocator_for(bb::Device::cpu()).stats().live_of(
            bb::MemoryCategory::activations);
      };
      const std::size_t before = live();
      const bb::Tensor logits = model.forward(x, nn::ForwardContext{});
      return static_cast<std::int64_t>(live() - before);
    };
    const std::int64_t measured = forward_bytes(2) - forward_bytes(1);
    const nn::GptConfig shape{.vocabulary = 256, .context = T, .layers = 1, .width = width,
                              .heads = heads, .precision = nn::Precision::bf16};
    const auto predicted = static_cast<std::int64_t>(nn::gpt_saved_bytes(shape, 1, T).per_block);
    const std::int64_t korthikanti = 34 * T * width + 5 * heads * T * T;
    const double share = 2.0 * static_cast<double>(heads * T * T) / static_cast<double>(predicted);
    // Their three one-byte masks (s b h for each residual branch, a s^2 b for the
    // attention's) and the dropped probabilities (2 a s^2 b) are drawn again or recomputed
    // here; our four f32 LayerNorm statistics (16 s b) they leave out.
    const std::int64_t masks = 2 * T * width + heads * T * T, dropped = 2 * heads * T * T;
    all_predicted = all_predicted && measured == predicted;
    korthikanti_less_recomputed =
        korthikanti_less_recomputed && measured == korthikanti - masks - dropped + 16 * T;
    report.note("| " + std::to_string(T) + " | " + std::to_string(measured) + " | " +
                std::to_string(predicted) + " | " + std::to_string(korthikanti) + " | " +
                fixed(100 * share, 1) + "% |");
  }
  report.check(all_predicted, "the measured bytes per block are gpt_saved_bytes', to the byte");
  report.check(korthikanti_less_recomputed,
               "the measured bytes are Korthikanti's less the masks and the dropped "
               "probabilities, plus the LayerNorm statistics");
}

// ---- (c) three precisions --------------------------------------------------------------

struct PrecisionRun {
  std::string name;
  double loss = 0;
  std::int64_t skipped = 0;
  double ms_per_step = 0;
  std::size_t activation_bytes = 0;
};

void three_precisions(bb::SelfCheck& report, const Corpus& corpus, bool quick) {
  // --quick: a quarter of the tokens per step, a tenth of the steps (15 still learn over 2
  // nats; the sanitizers' build runs this at a fraction of the speed).
  const std::int64_t steps = quick ? 15 : 150, batch = quick ? 16 : 32, micro = quick ? 4 : 8;
  report.section("(c) fp32, fp16 + dynamic loss scaling and bf16 on the same run: " +
                 std::to_string(steps) + " AdamW steps of " + std::to_string(batch) +
                 " sequences in micro-batches of " + std::to_string(micro));
  const bb::Dataset train = bb::make_token_dataset(corpus.train, "train");
  const bb::Dataset held_out = bb::make_token_dataset(corpus.held_out, "held out");
  std::vector<PrecisionRun> runs;
  double untrained = 0;
  std::string sample;
  for (const nn::Precision precision :
       {nn::Precision::fp32, nn::Precision::fp16, nn::Precision::bf16}) {
    nn::Gpt model(small_gpt(precision), bb::Device::cpu());
    nn::Optimizer optimizer(model.parameters(), bb::AdamWOptions{.lr = 3e-3});
    bb::train::TrainConfig config = steps_of(batch, micro, steps);
    if (precision == nn::Precision::fp16) config.loss_scaling = bb::train::LossScaling::dynamic;
    if (precision == nn::Precision::fp32) untrained = nn::evaluate(model, held_out, 64).loss;
    bb::train::Trainer trainer(model, optimizer, train, config);
    PrecisionRun run;
    run.name = precision == nn::Precision::fp16 ? "fp16 + dynamic scale"
                                                : nn::precision_name(precision);
    double seconds = 0;
    trainer.run([&](const bb::train::StepRecord& record) {
      run.skipped = record.skipped_steps;
      seconds += record.seconds;
    });
    run.ms_per_step = 1e3 * seconds / static_cast<double>(steps);
    run.loss = nn::evaluate(model, held_out, 64).loss;
    run.activation_bytes =
        nn::gpt_saved_bytes(model.config(), 1, kLength).total(model.config().layers);
    runs.push_back(run);
    if (precision == nn::Precision::fp32) {
      nn::SamplingOptions options;
      options.tokens = 120;
      options.temperature = 0.8f;
      options.seed = 1;
      const std::string prompt = "The ";
      const std::vector<std::int32_t> text =
          nn::generate(model, std::vector<std::int32_t>(prompt.begin(), prompt.end()), options);
      for (const std::int32_t t : text) {  // a byte that is not printable ASCII as '?'
        sample += t == '\n' ? ' ' : (t < 32 || t > 126) ? '?' : static_cast<char>(t);
      }
      sample = prompt + sample;
    }
  }
  report.note("held-out loss before training: " + fixed(untrained, 3) + " nats (ln 256 = " +
              fixed(std::log(256.0), 3) + ")");
  report.note("| precision | activation bytes per sequence | skipped steps | held-out loss | "
              "ms per step (this CPU) |");
  for (const PrecisionRun& run : runs) {
    report.note("| " + run.name + " | " + std::to_string(run.activation_bytes) + " | " +
                std::to_string(run.skipped) + " | " + fixed(run.loss, 3) + " | " +
                fixed(run.ms_per_step, 1) + " |");
  }
  report.note("the fp32 model writes, from \"The \" (temperature 0.8; newlines as spaces): " +
              sample);
  const PrecisionRun &fp32 = runs[0], &fp16 = runs[1], &bf16 = runs[2];
  report.check(fp32.loss < untrained - 0.5, "training lowers the held-out loss by over half a nat");
  report.check(bf16.skipped == 0, "bf16 runs without a scaler and skips no step");
  // The 16-bit runs round every activation (fp16 2^-11, bf16 2^-8 relative) and so leave
  // fp32's trajectory by a little each step, bf16 more than fp16. Not derived: measured on
  // this run, they end 0.011 (fp16) and 0.060 (bf16) nats from fp32 after 150 steps, where
  // the steps have learnt 2.8 nats. 0.1 nats is a few percent of
  // that; a 16-bit run that trained wrongly (a lost scale, unrounded masters) ends a nat or
  // more away.
  report.check(std::abs(fp16.loss - fp32.loss) < 0.1 && std::abs(bf16.loss - fp32.loss) < 0.1,
               "fp16 + scaler and bf16 end within 0.1 nats of fp32's held-out loss");
  report.check(2 * fp16.activation_bytes > fp32.activation_bytes &&
                   fp16.activation_bytes == bf16.activation_bytes &&
                   fp16.activation_bytes < fp32.activation_bytes,
               "16-bit activations take fp16's bytes in bf16, fewer than fp32's (the f32 "
               "statistics and logits stay)");
}

// ---- (d) where the scale goes ----------------------------------------------------------

// How many of a tensor's elements (any dtype the cast reads) are not finite.
std::int64_t non_finite(const bb::Tensor& t) {
  const bb::Tensor wide(t.shape(), bb::DType::f32, t.device(), bb::MemoryCategory::workspace);
  bb::cast(t, wide);
  std::int64_t count = 0;
  for (const float v : wide.to_vector<float>()) count += std::isfinite(v) ? 0 : 1;
  return count;
}

// One head of D channels whose queries and keys are every channel a: q . k = D a^2 for
// every pair. fp16's largest finite value is 65504, and a product from 65520 up rounds to
// infinity. A 16-bit GEMM that stores q k^T and scales afterwards (the order of the
// formula, softmax(q k^T / sqrt(D))) therefore overflows from D a^2 >= 65520, and its
// softmax is NaN. The attention kernel multiplies each float dot product by 1/sqrt(D)
// before anything is rounded, and keeps the scores in float: it stays finite for any q and
// k that fp16 holds.
void scale_before_rounding(bb::SelfCheck& report) {
  report.section("(d) fp16: attention's 1/sqrt(D) before anything is rounded to 16 bits");
  const std::int64_t D = 64, T = 16;
  report.note("one head of D = " + std::to_string(D) + " channels, T = " + std::to_string(T) +
              ", every query and key channel a: q . k = D a^2, s = q . k / sqrt(D)");
  report.note("| a | q . k | s | 16-bit q k^T: entries inf | the kernel's output: entries not "
              "finite |");
  bool kernel_finite = true, overflow_where_predicted = true;
  for (const float a : {8.0f, 16.0f, 31.0f, 32.0f, 64.0f, 128.0f}) {
    std::vector<float> qkv(static_cast<std::size_t>(T * 3 * D)), qk(static_cast<std::size_t>(T * D), a);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t c = 0; c < D; ++c) {
        qkv[t * 3 * D + c] = a;                                               // q
        qkv[t * 3 * D + D + c] = a;                                           // k
        qkv[t * 3 * D + 2 * D + c] = static_cast<float>((t + c) % 7) - 3.0f;  // v
      }
    }
    const auto half = [](const std::vector<float>& values, bb::Shape shape) {
      const bb::Tensor wide = bb::Tensor::from_vector(values, shape);
      const bb::Tensor narrow(shape, bb::DType::f16, bb::Device::cpu(),
                              bb::MemoryCategory::workspace);
      bb::cast(wide, narrow);
      return narrow;
    };
    // The product first, in a 16-bit GEMM (f32 sums, the result rounded to fp16).
    const bb::Tensor q = half(qk, {T, D});
    const bb::Tensor scores({T, T}, bb::DType::f16, bb::Device::cpu(),
                            bb::MemoryCategory::workspace);
    bb::gemm(q, false, q, true, scores);
    // The kernel.
    const bb::Tensor y({1, T, D}, bb::DType::f16, bb::Device::cpu(),
                       bb::MemoryCategory::workspace);
    const bb::Tensor p({1, 1, T, T}, bb::DType::f16, bb::Device::cpu(),
                       bb::MemoryCategory::workspace);
    bb::causal_attention_forward(half(qkv, {1, T, 3 * D}), y, p, 1);
    const double dot = static_cast<double>(D) * a * a;
    const std::int64_t inf = non_finite(scores), bad = non_finite(y) + non_finite(p);
    kernel_finite = kernel_finite && bad == 0;
    overflow_where_predicted = overflow_where_predicted && (inf == T * T) == (dot >= 65520);
    report.note("| " + fixed(a, 0) + " | " + fixed(dot, 0) + " | " +
                fixed(dot / std::sqrt(static_cast<double>(D)), 0) + " | " + std::to_string(inf) +
                " of " + std::to_string(T * T) + " | " + std::to_string(bad) + " |");
  }
  report.check(overflow_where_predicted,
               "the 16-bit product overflows exactly where D a^2 >= 65520, in every entry");
  report.check(kernel_finite, "the kernel's output and probabilities are finite at every a, "
                              "s = 131072 included (scores stay in float)");
}

// ---- (e) checkpointing the blocks ---------------------------------------------------------

struct CheckpointedRun {
  std::string policy;
  bb::checkpointing::ScheduleStats schedule;
  std::size_t kept_bytes = 0;  // activations + checkpoints at the step's peak, the largest step
  std::size_t peak = 0;        // the largest step's peak, every category
  std::size_t predicted = 0;   // nn::predict_step's, before the run
  double ms_per_step = 0;
  std::vector<std::vector<float>> parameters;
};

// The same steps under each of chapter 05's whole-block policies: the runner keeps some
// blocks' inputs and recomputes the blocks between them in the backward, with the same
// dropout masks (the counter RNG keys them by sequence, block and position).
void checkpointed_blocks(bb::SelfCheck& report, const Corpus& corpus, bool quick) {
  const std::int64_t layers = quick ? 6 : 8, width = quick ? 64 : 128;
  const std::int64_t batch = quick ? 8 : 16, micro = quick ? 4 : 8, steps = quick ? 2 : 3;
  report.section("(e) Checkpointing the transformer's blocks (chapter 05): a GPT of " +
                 std::to_string(layers) + " blocks of width " + std::to_string(width) +
                 ", bf16, " + std::to_string(steps) + " AdamW steps of " +
                 std::to_string(batch) + " sequences in micro-batches of " +
                 std::to_string(micro));
  const bb::Dataset train = bb::make_token_dataset(corpus.train, "train");
  std::vector<CheckpointedRun> runs;
  for (const std::string policy : {"none", "every:2", "sqrt", "optimal:2", "optimal:1"}) {
    const bb::checkpointing::Policy parsed = bb::checkpointing::Policy::parse(policy);
    const nn::GptConfig config{.vocabulary = 256, .context = kLength, .layers = layers,
                               .width = width, .heads = 4, .dropout = 0.1f, .seed = 8,
                               .precision = nn::Precision::bf16};
    nn::Gpt model(config, bb::Device::cpu());
    CheckpointedRun run;
    run.policy = policy;
    run.schedule = bb::checkpointing::simulate(parsed.schedule_for(layers));
    run.predicted = bb::checkpointing::predict_policy(
                        {std::make_shared<bb::nn::GptLedger>(config, kLength), batch, micro,
                         bb::AdamWOptions{.lr = 3e-3}},
                        parsed)
                        .peak();
    if (parsed.needs_runner()) {
      model.set_block_runner(bb::checkpointing::GptScheduledRunner::for_policy(parsed, layers));
    }
    nn::Optimizer optimizer(model.parameters(), bb::AdamWOptions{.lr = 3e-3});
    bb::train::Trainer trainer(model, optimizer, train, steps_of(batch, micro, steps));
    double seconds = 0;
    trainer.run([&](const bb::train::StepRecord& record) {
      seconds += record.seconds;
      run.kept_bytes = std::max(run.kept_bytes,
                                record.memory.at_peak_of(bb::MemoryCategory::activations) +
                                    record.memory.at_peak_of(bb::MemoryCategory::checkpoints));
      run.peak = std::max(run.peak, record.memory.peak_total);
    });
    run.ms_per_step = 1e3 * seconds / static_cast<double>(steps);
    for (const nn::NamedParameter& p : model.parameters()) {
      run.parameters.push_back(p.value.to_vector<float>());
    }
    runs.push_back(std::move(run));
  }
  const CheckpointedRun& none = runs.front();
  report.note("| policy | block inputs kept | blocks taped at once | block forwards per "
              "micro-batch | activations + checkpoints at the step's peak (bytes) | of none's "
              "| ms per step (this CPU) | of none's time | step peak: measured = predicted "
              "(bytes) | parameters |");
  bool same_bits = true, fewer_bytes = true, fewest_with_one_slot = true, predicted = true;
  for (const CheckpointedRun& run : runs) {
    const bool same = run.parameters == none.parameters;
    same_bits = same_bits && same;
    if (&run != &none) fewer_bytes = fewer_bytes && run.kept_bytes < none.kept_bytes;
    fewest_with_one_slot = fewest_with_one_slot && runs.back().kept_bytes <= run.kept_bytes;
    report.note("| " + run.policy + " | " + std::to_string(run.schedule.max_checkpoints) +
                " | " + std::to_string(run.schedule.max_taped) + " | " +
                std::to_string(run.schedule.advances + run.schedule.tapes) + " | " +
                std::to_string(run.kept_bytes) + " | " +
                fixed(100.0 * static_cast<double>(run.kept_bytes) /
                          static_cast<double>(none.kept_bytes), 1) +
                "% | " + fixed(run.ms_per_step, 1) + " | " +
                fixed(run.ms_per_step / none.ms_per_step, 2) + "x | " +
                std::to_string(run.peak) + (run.peak == run.predicted ? " = " : " != ") +
                std::to_string(run.predicted) + " | " + (same ? "none's bits" : "DIFFERENT") +
                " |");
    predicted = predicted && run.peak == run.predicted;
  }
  report.check(same_bits, "every policy trains the parameters of no checkpointing, bit for bit");
  report.check(fewer_bytes, "every policy keeps fewer activation bytes at the step's peak");
  report.check(fewest_with_one_slot, "one kept block input (optimal:1) keeps the fewest");
  report.check(predicted, "nn::predict_step predicted every policy's step peak to the byte");
}

// ---- (f) a length plain attention cannot fit -------------------------------------------

struct BudgetRun {
  std::string way;            // a checkpoint policy, or "efficient" (the kernel)
  std::size_t predicted = 0;  // nn::predict_step's peak, before the run
  std::size_t peak = 0;       // the largest step's measured peak, every category
  double ms_per_step = 0;
  float last_loss = 0;
  std::vector<std::vector<float>> parameters;
};

// A way of keeping the attention as the model's configuration and a checkpoint policy.
struct Way {
  nn::GptConfig config;
  bb::checkpointing::Policy policy;
};

Way way_of(const std::string& way, const nn::GptConfig& plain) {
  const bool efficient = way == "efficient";
  nn::GptConfig config = plain;
  if (efficient) config.attention = nn::AttentionKernel::efficient;
  return {config, bb::checkpointing::Policy::parse(efficient ? "none" : way)};
}

// nn::predict_step's peak of a step of `batch` sequences of T at micro-batch 1.
std::size_t predicted_peak(const Way& w, std::int64_t batch, std::int64_t T) {
  return bb::checkpointing::predict_policy({std::make_shared<bb::nn::GptLedger>(w.config, T),
                                            batch, 1, bb::AdamWOptions{.lr = 3e-3}},
                                           w.policy)
      .peak();
}

// One way of keeping the attention, trained `steps` steps at micro-batch 1 (the smallest
// there is); the allocator's cap, if any, is the caller's.
BudgetRun train_budget_way(const std::string& way, const nn::GptConfig& plain,
                           const bb::Dataset& data, std::int64_t batch, std::int64_t steps) {
  const Way w = way_of(way, plain);
  const nn::GptConfig& config = w.config;
  const bb::checkpointing::Policy& policy = w.policy;
  BudgetRun run;
  run.way = way;
  run.predicted = predicted_peak(w, batch, data.feature_dim());
  nn::Gpt model(config, bb::Device::cpu());
  if (policy.needs_runner()) {
    model.set_block_runner(
        bb::checkpointing::GptScheduledRunner::for_policy(policy, config.layers));
  }
  nn::Optimizer optimizer(model.parameters(), bb::AdamWOptions{.lr = 3e-3});
  bb::train::Trainer trainer(model, optimizer, data, steps_of(batch, 1, steps));
  double seconds = 0;
  trainer.run([&](const bb::train::StepRecord& record) {
    seconds += record.seconds;
    run.peak = std::max(run.peak, record.memory.peak_total);
    run.last_loss = record.loss;
  });
  run.ms_per_step = 1e3 * seconds / static_cast<double>(steps);
  for (const nn::NamedParameter& p : model.parameters()) {
    run.parameters.push_back(p.value.to_vector<float>());
  }
  return run;
}

// A device of a few tens of MiB and sequences long enough that one sequence's attention
// probabilities, kept by every block, do not fit: micro-batch 1 is the smallest there is, so
// accumulation alone cannot help. Each of the three ways that keep less fits it: full
// recomputation (every:1), selective attention recomputation, memory-efficient attention.
// The device is the largest of their predicted peaks.
void attention_budget(bb::SelfCheck& report, bool quick) {
  const std::int64_t T = quick ? 512 : 1024, layers = 4, batch = 2, steps = 2;
  const nn::GptConfig plain{.vocabulary = 256, .context = T, .layers = layers, .width = 64,
                            .heads = 4, .dropout = 0.1f, .seed = 8};
  // Random bytes: the bytes and the time do not depend on what the tokens say.
  const bb::Dataset data = bb::make_token_dataset(
      bb::make_sequences(bb::synthetic_documents(batch, T + 1, T + 1, 6), T), "random bytes");
  const std::vector<std::string> ways = {"every:1", "attention", "efficient"};
  std::size_t device = 0;
  for (const std::string& way : ways) {
    device = std::max(device, predicted_peak(way_of(way, plain), batch, T));
  }
  report.section("(f) A length no micro-batch fits with plain attention: " +
                 std::to_string(batch) + " sequences of T = " + std::to_string(T) +
                 ", a GPT of " + std::to_string(layers) + " blocks (width 64, 4 heads, fp32), " +
                 "micro-batch 1, on a device of " + bb::format_bytes(device));
  const BudgetRun reference = train_budget_way("none", plain, data, batch, steps);  // no cap
  std::optional<std::string> out_of_memory;
  std::vector<BudgetRun> runs;
  {
    bb::ScopedMemoryCap cap(bb::Device::cpu(), device);
    try {
      train_budget_way("none", plain, data, batch, 1);
    } catch (const bb::OutOfMemoryError& error) {
      out_of_memory = error.what();
    }
    report.note("plain attention (none), predicted step peak " +
                bb::format_bytes(reference.predicted) + ", under the cap: " +
                out_of_memory.value_or("(no error)"));
    for (const std::string& way : ways) {
      try {
        runs.push_back(train_budget_way(way, plain, data, batch, steps));
      } catch (const bb::OutOfMemoryError& error) {  // a way the device does not fit
        report.note(way + " under the cap: " + error.what());
      }
    }
  }
  report.check(reference.predicted > device && out_of_memory.has_value(),
               "plain attention's step at micro-batch 1 is predicted over the device and runs "
               "out of memory on it");
  report.note("| way | step peak: measured = predicted | of none's | ms per step (this CPU) | "
              "of none's time | loss after " + std::to_string(steps) + " steps | parameters |");
  bool fit = runs.size() == ways.size(), predicted = true, same_bits = true, close = false;
  std::vector<const BudgetRun*> table = {&reference};
  for (const BudgetRun& run : runs) table.push_back(&run);
  for (const BudgetRun* run : table) {
    const bool same = run->parameters == reference.parameters;
    report.note("| " + run->way + (run == &reference ? " (no cap)" : "") + " | " +
                std::to_string(run->peak) + (run->peak == run->predicted ? " = " : " != ") +
                std::to_string(run->predicted) + " | " +
                fixed(100.0 * static_cast<double>(run->peak) /
                          static_cast<double>(reference.peak), 1) +
                "% | " + fixed(run->ms_per_step, 1) + " | " +
                fixed(run->ms_per_step / reference.ms_per_step, 2) + "x | " +
                fixed(run->last_loss, 5) + " | " + (same ? "none's bits" : "its own bits") +
                " |");
    predicted = predicted && run->peak == run->predicted;
    if (run == &reference) continue;
    fit = fit && run->peak <= device;
    if (run->way == "efficient") {
      // Its own roundings (the online softmax), so its own bits: 2 AdamW steps from the same
      // start leave the loss within 1e-3 of plain attention's (ulp-sized gradient
      // differences, which AdamW's normalised update carries but does not grow).
      close = !same && std::abs(run->last_loss - reference.last_loss) < 1e-3f;
    } else {
      same_bits = same_bits && same;
    }
  }
  report.check(fit, "every:1, attention and efficient each train within the device");
  report.check(predicted, "nn::predict_step predicted every step peak to the byte");
  report.check(same_bits, "every:1 and attention train plain attention's bits");
  report.check(close, "efficient attention trains its own bits, within 1e-3 of plain "
                      "attention's loss");
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (const auto status = bb::parse_demo_options(
          argc, argv,
          "  Chapter 08's GPT: accumulation by tokens, a block's bytes against T, three\n"
          "  precisions on one run, attention's scale in fp16, checkpointed blocks, and\n"
          "  a sequence length only recomputation or memory-efficient attention fits\n"
          "  (see chapters/08_transformer/README.md).",
          options)) {
    return *status;
  }
  std::printf("Chapter 08: the transformer\n");
  bb::SelfCheck report("chapter 08");
  const Corpus corpus = load_corpus();
  std::printf("corpus: %s, %lld training and %lld held-out sequences of %lld positions "
              "(%.1f%% padding)\n",
              corpus.name.c_str(), static_cast<long long>(corpus.train.count()),
              static_cast<long long>(corpus.held_out.count()),
              static_cast<long long>(kLength), 100 * corpus.train.padding_fraction());
  accumulation_by_tokens(report, corpus);
  bytes_per_block(report, options.quick);
  three_precisions(report, corpus, options.quick);
  scale_before_rounding(report);
  checkpointed_blocks(report, corpus, options.quick);
  attention_budget(report, options.quick);
  return report.finish();
}
