// A synthetic classification data set labelled by a fixed random teacher network.
//
//   x[i, j]  = 2 * uniform(seed, stream 0, index i*D + j) - 1          uniform on [-1, 1)
//   W1[h, j] = (2 * uniform(seed, stream 1, h*D + j) - 1) * sqrt(3 / D)    [H, D]
//   b1[h]    = (2 * uniform(seed, stream 2, h) - 1) * sqrt(3 / D)          [H]
//   W2[c, h] = (2 * uniform(seed, stream 3, c*H + h) - 1) * sqrt(3 / H)    [C, H]
//   label[i] = argmax_c  sum_h W2[c, h] * tanh(b1[h] + sum_j W1[h, j] * x[i, j])
//
// The weights are uniform with standard deviation 1/sqrt(fan_in), so with x of
// variance 1/3 the hidden pre-activations have standard deviation about 0.6: tanh
// bends them enough that the labels are not a linear function of x, yet a student
// MLP learns them well. No output bias, so that no class is favoured a priori: every
// class gets roughly 1/C of the samples (the tests check at least 2% each).
//
// Reproducibility. Every random number is a pure function of (seed, stream, index)
// (common/rng.hpp), so sample i does not depend on how many samples are made nor on
// the thread that makes it. x is a multiple of 2^-23 in [-1, 1), exact in float. The
// teacher runs in double with a fixed summation order (j, then h, ascending) and
// -ffp-contract=off, so every operation is an IEEE-specified, correctly rounded one
// except tanh, which comes from the C library. Two libms may differ in tanh's last
// bit; that could change a label only where the two largest logits agree to about
// 1e-16. It can happen in principle; with the default options the closest pair of
// top-two logits differs by 1.3e-6 (measured over all 60000 samples), and the tests
// pin a fingerprint of the default data set's bytes.
#include <cmath>
#include <string>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/rng.hpp"

namespace bigbatch {
namespace {

// RNG streams, one per kind of value, so that changing a size never reshuffles another.
// The numbers are part of the data set's definition: never renumber them.
enum Stream : std::uint64_t {
  kFeatures = 0,
  kHiddenWeights = 1,
  kHiddenBias = 2,
  kOutputWeights = 3
};

// Uniform on [-1, 1): 2u - 1 with u = k * 2^-24 is exact in float.
float symmetric_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return 2.0f * random_uniform(seed, stream, index) - 1.0f;
}

struct Teacher {
  std::int64_t inputs, hidden, classes;
  std::vector<double> hidden_weights;  // W1: [hidden, inputs]
  std::vector<double> hidden_bias;     // b1: [hidden]
  std::vector<double> output_weights;  // W2: [classes, hidden]
};

std::vector<double> uniform_weights(std::uint64_t seed, Stream stream, std::int64_t count,
                                    std::int64_t fan_in) {
  const double scale = std::sqrt(3.0 / static_cast<double>(fan_in));  // std = 1/sqrt(fan_in)
  std::vector<double> weights(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) {
    weights[static_cast<std::size_t>(k)] =
        static_cast<double>(symmetric_uniform(seed, stream, static_cast<std::uint64_t>(k))) * scale;
  }
  return weights;
}

Teacher make_teacher(const SyntheticOptions& options) {
  const std::int64_t d = options.features, h = options.teacher_hidden, c = options.classes;
  return {.inputs = d,
          .hidden = h,
          .classes = c,
          .hidden_weights = uniform_weights(options.seed, kHiddenWeights, h * d, d),
          .hidden_bias = uniform_weights(options.seed, kHiddenBias, h, d),
          .output_weights = uniform_weights(options.seed, kOutputWeights, c * h, h)};
}

// The teacher's class for one sample x: [inputs]; the first of equal logits wins.
std::int32_t teacher_label(const Teacher& teacher, const float* x, std::vector<double>& hidden) {
  for (std::int64_t h = 0; h < teacher.hidden; ++h) {
    const double* w = &teacher.hidden_weights[static_cast<std::size_t>(h * teacher.inputs)];
    double pre_activation = teacher.hidden_bias[static_cast<std::size_t>(h)];
    for (std::int64_t j = 0; j < teacher.inputs; ++j) pre_activation += w[j] * x[j];
    hidden[static_cast<std::size_t>(h)] = std::tanh(pre_activation);
  }
  std::int32_t best_class = 0;
  double best_logit = 0.0;
  for (std::int64_t c = 0; c < teacher.classes; ++c) {
    const double* w = &teacher.output_weights[static_cast<std::size_t>(c * teacher.hidden)];
    double logit = 0.0;
    for (std::int64_t h = 0; h < teacher.hidden; ++h) {
      logit += w[h] * hidden[static_cast<std::size_t>(h)];
    }
    if (c == 0 || logit > best_logit) {
      best_logit = logit;
      best_class = static_cast<std::int32_t>(c);
    }
  }
  return best_class;
}

}  // namespace

Dataset make_synthetic(const SyntheticOptions& options) {
  BIGBATCH_CHECK(
      options.samples >= 0 && options.features >= 1 && options.classes >= 1 &&
          options.teacher_hidden >= 1,
      "make_synthetic: need samples >= 0 and features, classes, teacher_hidden >= 1; got ",
      options.samples, ", ", options.features, ", ", options.classes, ", ", options.teacher_hidden);
  const Teacher teacher = make_teacher(options);
  const std::int64_t n = options.samples, d = options.features;
  Dataset dataset;
  dataset.features = Tensor({n, d}, DType::f32, Device::cpu(), MemoryCategory::host_data);
  dataset.labels = Tensor({n}, DType::i32, Device::cpu(), MemoryCategory::host_data);
  dataset.num_classes = options.classes;
  dataset.name = "synthetic(seed " + std::to_string(options.seed) + ", " + std::to_string(n) + "x" +
                 std::to_string(d) + ", " + std::to_string(options.classes) + " classes)";
  float* features = dataset.features.data<float>();
  std::int32_t* labels = dataset.labels.data<std::int32_t>();

  // Samples are independent: splitting them among threads changes nothing.
#pragma omp parallel
  {
    std::vector<double> hidden(static_cast<std::size_t>(teacher.hidden));
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      float* x = features + i * d;
      for (std::int64_t j = 0; j < d; ++j) {
        x[j] = symmetric_uniform(options.seed, kFeatures, static_cast<std::uint64_t>(i * d + j));
      }
      labels[i] = teacher_label(teacher, x, hidden);
    }
  }
  return dataset;
}

}  // namespace bigbatch
