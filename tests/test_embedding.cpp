// Token and position embeddings: the forward rounded once from the exact sum, the backward's
// scatter-add against a float64 oracle in the documented order (with its rounding bound),
// that order shown by values whose sum depends on it, micro-batches of sequences against the
// batch bit for bit, the token checks, and CUDA against the CPU bit for bit (skipped, saying
// why, without a GPU).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/embedding.hpp"
#include "tests/harness.hpp"
#include "tests/running_error.hpp"

namespace bigbatch {
namespace {

using testing::Bounded;
using testing::DeviceTest;
using testing::RoundingModel;

struct Problem {
  std::int64_t B, T, V, P, C;
  DType dtype;
  std::vector<std::int32_t> tokens;    // [B, T]
  std::vector<double> wte, wpe, dout;  // [V, C], [P, C], [B, T, C]: the dtype's values
  std::vector<double> dwte0, dwpe0;    // the gradients' values before the backward (f32)
};

/// Tokens drawn from a small vocabulary so that every token repeats many times.
Problem make_problem(std::int64_t B, std::int64_t T, std::int64_t V, std::int64_t C, DType dtype,
                     std::uint64_t seed) {
  const std::int64_t P = T + 3;  // the position table is longer than the sequences
  Problem p{B, T, V, P, C, dtype, {}, {}, {}, {}, {}, {}};
  for (const double u : testing::random_values(B * T, seed, 0, 1)) {
    p.tokens.push_back(static_cast<std::int32_t>(u * static_cast<double>(V)));
  }
  const auto rounded = [&](std::int64_t n, std::uint64_t s, DType d) {
    return testing::to_doubles(
        testing::make_tensor(testing::random_values(n, s), {n}, d, Device::cpu()));
  };
  const DType gradient = dtype == DType::f64 ? DType::f64 : DType::f32;
  p.wte = rounded(V * C, seed + 1, dtype);
  p.wpe = rounded(P * C, seed + 2, dtype);
  p.dout = rounded(B * T * C, seed + 3, dtype);
  p.dwte0 = rounded(V * C, seed + 4, gradient);
  p.dwpe0 = rounded(P * C, seed + 5, gradient);
  return p;
}

DType gradient_dtype(const Problem& p) { return p.dtype == DType::f64 ? DType::f64 : DType::f32; }

struct Outputs {
  Tensor out, dwte, dwpe;
};

Outputs run(const Problem& p, Device device) {
  const Tensor tokens = Tensor::from_vector(p.tokens, {p.B, p.T}, device);
  Outputs o{Tensor({p.B, p.T, p.C}, p.dtype, device),
            testing::make_tensor(p.dwte0, {p.V, p.C}, gradient_dtype(p), device),
            testing::make_tensor(p.dwpe0, {p.P, p.C}, gradient_dtype(p), device)};
  testing::poison(o.out);
  embedding_forward(tokens, testing::make_tensor(p.wte, {p.V, p.C}, p.dtype, device),
                    testing::make_tensor(p.wpe, {p.P, p.C}, p.dtype, device), o.out);
  embedding_backward(tokens, testing::make_tensor(p.dout, {p.B, p.T, p.C}, p.dtype, device), o.dwte,
                     o.dwpe);
  return o;
}

class Embedding : public DeviceTest {};

// The two table entries are within a factor 2^30 of each other, so their double sum is exact;
// the kernel rounds that sum once to the dtype (through float, as the oracle's make_tensor).
TEST_P(Embedding, ForwardIsTheExactSumRoundedOnce) {
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;
    SCOPED_TRACE(dtype_name(dtype));
    const Problem p = make_problem(3, 5, 7, 6, dtype, 3);
    std::vector<double> want;
    for (std::int64_t bt = 0; bt < p.B * p.T; ++bt) {
      for (std::int64_t c = 0; c < p.C; ++c) {
        want.push_back(p.wte[p.tokens[bt] * p.C + c] + p.wpe[(bt % p.T) * p.C + c]);
      }
    }
    EXPECT_TRUE(
        testing::bitwise_equal(run(p, device()).out.to(Device::cpu()),
                               testing::make_tensor(want, {p.B, p.T, p.C}, dtype, Device::cpu())));
  }
}

// The oracle adds each table element's terms in the documented order (positions in row-major
// order) onto its starting value, carrying the bound of one float rounding per addition.
TEST_P(Embedding, BackwardAddsEveryPositionWithinTheBoundOfItsOrder) {
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;
    SCOPED_TRACE(dtype_name(dtype));
    const Problem p = make_problem(4, 9, 5, 6, dtype, 13);
    const RoundingModel m{testing::unit_roundoff(gradient_dtype(p)), 0};
    std::vector<Bounded> dwte, dwpe;
    for (const double v : p.dwte0) dwte.push_back({v, 0});
    for (const double v : p.dwpe0) dwpe.push_back({v, 0});
    for (std::int64_t bt = 0; bt < p.B * p.T; ++bt) {
      for (std::int64_t c = 0; c < p.C; ++c) {
        const Bounded g{p.dout[bt * p.C + c], 0};
        Bounded& w = dwte[p.tokens[bt] * p.C + c];
        Bounded& q = dwpe[(bt % p.T) * p.C + c];
        w = m.add(w, g);
        q = m.add(q, g);
      }
    }
    const Outputs o = run(p, device());
    for (const auto& [got, want] : {std::pair{o.dwte, &dwte}, std::pair{o.dwpe, &dwpe}}) {
      std::vector<double> exact, bound;
      for (const Bounded& b : *want) {
        exact.push_back(b.v);
        bound.push_back(testing::tolerance(b, m));
      }
      EXPECT_TRUE(testing::all_close(testing::to_doubles(got), exact,
                                     [&](std::size_t i) { return bound[i]; }));
    }
  }
}

// Token 0 at three positions with the terms 1, 1e8, -1e8: in position order, 1 is lost against
// 1e8 in float (the spacing there is 8) and the sum is 0; in reverse order it would be 1.
TEST_P(Embedding, ATokensTermsAreAddedInPositionOrder) {
  Problem p = make_problem(1, 3, 2, 1, DType::f32, 5);
  p.tokens = {0, 0, 0};
  p.dout = {1.0, 1e8, -1e8};
  p.dwte0 = {0.0, 0.0};
  const Outputs o = run(p, device());
  EXPECT_EQ(testing::to_doubles(o.dwte)[0], 0.0);
}

TEST_P(Embedding, MicroBatchesOfSequencesGiveTheBatchBitsForBit) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Problem batch = make_problem(5, 6, 3, 8, dtype, 23);
    const Outputs whole = run(batch, device());
    // The micro-batches run in order into one pair of gradient buffers.
    Problem micro = batch;
    std::int64_t first = 0;
    for (const std::int64_t size : {2, 1, 2}) {
      micro.B = size;
      micro.tokens.assign(batch.tokens.begin() + first * batch.T,
                          batch.tokens.begin() + (first + size) * batch.T);
      micro.dout.assign(batch.dout.begin() + first * batch.T * batch.C,
                        batch.dout.begin() + (first + size) * batch.T * batch.C);
      const Outputs part = run(micro, device());
      EXPECT_TRUE(testing::bitwise_equal(part.out.to(Device::cpu()),
                                         whole.out.to(Device::cpu()).rows(first, first + size)));
      micro.dwte0 = testing::to_doubles(part.dwte);
      micro.dwpe0 = testing::to_doubles(part.dwpe);
      first += size;
    }
    EXPECT_EQ(micro.dwte0, testing::to_doubles(whole.dwte));
    EXPECT_EQ(micro.dwpe0, testing::to_doubles(whole.dwpe));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Embedding, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

TEST(EmbeddingBackends, CudaComputesTheCpuBits) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // More positions than a block stages at once (1024), a vocabulary of bytes.
    const Problem p = make_problem(6, 200, 256, 40, dtype, 33);
    const Outputs cpu = run(p, Device::cpu()), gpu = run(p, Device::cuda());
    EXPECT_TRUE(testing::bitwise_equal(gpu.out.to(Device::cpu()), cpu.out));
    EXPECT_TRUE(testing::bitwise_equal(gpu.dwte.to(Device::cpu()), cpu.dwte));
    EXPECT_TRUE(testing::bitwise_equal(gpu.dwpe.to(Device::cpu()), cpu.dwpe));
  }
}

TEST(EmbeddingArguments, TokensAndShapesAreChecked) {
  const Tensor wte({4, 3}, DType::f32), wpe({5, 3}, DType::f32), out({2, 5, 3}, DType::f32);
  const auto tokens = [](std::vector<std::int32_t> v) { return Tensor::from_vector(v, {2, 5}); };
  EXPECT_NO_THROW(embedding_forward(tokens({0, 1, 2, 3, 0, 1, 2, 3, 0, 1}), wte, wpe, out));
  EXPECT_THROW(embedding_forward(tokens({0, 1, 2, 4, 0, 1, 2, 3, 0, 1}), wte, wpe, out),
               std::invalid_argument);  // 4 is outside [0, 4)
  EXPECT_THROW(embedding_forward(tokens({0, 1, 2, -1, 0, 1, 2, 3, 0, 1}), wte, wpe, out),
               std::invalid_argument);
  EXPECT_THROW(embedding_forward(tokens({0, 1, 2, 3, 0, 1, 2, 3, 0, 1}), wte,
                                 Tensor({4, 3}, DType::f32), out),
               std::invalid_argument);  // 4 positions for sequences of 5
  EXPECT_THROW(embedding_forward(tokens({0, 1, 2, 3, 0, 1, 2, 3, 0, 1}), wte,
                                 Tensor({5, 3}, DType::bf16), out),
               std::invalid_argument);
  EXPECT_THROW(embedding_backward(tokens({0, 1, 2, 3, 0, 1, 2, 3, 0, 1}), out,
                                  Tensor({4, 3}, DType::bf16), Tensor({5, 3}, DType::f32)),
               std::invalid_argument);  // gradients are f32
}

}  // namespace
}  // namespace bigbatch
