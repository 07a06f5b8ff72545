#include "kernels/embedding.hpp"

#include <algorithm>

#include "common/data/dataset.hpp"
#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {
namespace {

/// The gradients' dtype: f64 next to f64 data, f32 otherwise.
DType gradient_dtype(DType data) { return data == DType::f64 ? DType::f64 : DType::f32; }

/// tokens: [B, T] i32; a table: [rows, C] floating (f64 on the CPU only), with `rows`
/// at least `min_rows`.
void check_tokens_and_table(const char* op, const Tensor& tokens, const char* name,
                            const Tensor& table, std::int64_t min_rows) {
  detail::check_rank(op, "tokens", tokens, 2);
  detail::check_dtype(op, "tokens", tokens, DType::i32);
  detail::check_rank(op, name, table, 2);
  BIGBATCH_CHECK(table.dim(0) >= min_rows, op, ": ", name, " needs at least ", min_rows,
                 " rows, got ", table.describe());
}

/// out or dout: [B, T, C] with the tables' width C, floating (f64 on the CPU only).
void check_sequence_data(const char* op, const char* name, const Tensor& t, const Tensor& tokens,
                         std::int64_t channels) {
  detail::check_floating(op, name, t);
  detail::check_shape(op, name, t, {tokens.dim(0), tokens.dim(1), channels});
}

/// Every token in [0, V) for CPU tensors; CUDA tokens were checked where they were placed on
/// the device (see the header).
void check_token_values(const char* op, const Tensor& tokens, std::int64_t vocabulary) {
  if (tokens.device().is_cpu()) check_labels(tokens, vocabulary, std::string(op) + " (tokens)");
}

/// The shared checks of both directions: tokens [B, T]; the tables (or their gradients)
/// [V, C] and [P, C] of `table_dtype`, P >= T; the sequence data [B, T, C]; one device.
Device check_embedding(const char* op, const Tensor& tokens, const char* token_name,
                       const Tensor& token_table, const char* position_name,
                       const Tensor& position_table, const char* data_name, const Tensor& data,
                       DType table_dtype) {
  check_tokens_and_table(op, tokens, token_name, token_table, 1);
  check_tokens_and_table(op, tokens, position_name, position_table, tokens.dim(1));
  check_sequence_data(op, data_name, data, tokens, token_table.dim(1));
  detail::check_dtype(op, token_name, token_table, table_dtype);
  detail::check_dtype(op, position_name, position_table, table_dtype);
  detail::check_shape(op, position_name, position_table,
                      {position_table.dim(0), token_table.dim(1)});
  const Device device = detail::common_device(op, {&tokens, &token_table, &position_table, &data});
  check_token_values(op, tokens, token_table.dim(0));
  return device;
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out) {
  constexpr const char* op = "embedding_forward";
  const Device device =
      check_embedding(op, tokens, "wte", wte, "wpe", wpe, "out", out, out.dtype());
  if (device.is_cuda()) BIGBATCH_RUN_CUDA(op, cuda::embedding_forward(tokens, wte, wpe, out));
  cpu::embedding_forward(tokens, wte, wpe, out);
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe) {
  constexpr const char* op = "embedding_backward";
  const Device device = check_embedding(op, tokens, "dwte", dwte, "dwpe", dwpe, "dout", dout,
                                        gradient_dtype(dout.dtype()));
  if (device.is_cuda()) BIGBATCH_RUN_CUDA(op, cuda::embedding_backward(tokens, dout, dwte, dwpe));
  cpu::embedding_backward(tokens, dout, dwte, dwpe);
}

namespace cpu {
namespace {

using scalar_math::ComputeType;

template <class T>
void forward_typed(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out) {
  const std::int64_t B = tokens.dim(0), T_ = tokens.dim(1), C = wte.dim(1);
  const std::int32_t* token = tokens.data<std::int32_t>();  // [B, T]
  const T* token_table = wte.data<T>();                     // [V, C]
  const T* position_table = wpe.data<T>();                  // [P, C]
  T* o = out.data<T>();                                     // [B, T, C]
  parallel_for(B * T_, std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(C, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 run_vectorized([&] {
                   for (std::int64_t bt = begin; bt < end; ++bt) {
                     const T* w = token_table + token[bt] * C;
                     const T* p = position_table + (bt % T_) * C;
                     T* row = o + bt * C;
                     for (std::int64_t c = 0; c < C; ++c) store(row + c, load(w + c) + load(p + c));
                   }
                 });
               });
}

/// The scatter-add in the header's order: every thread owns a range of channels and walks
/// all positions in row-major order, so each table element sees its terms in that order.
template <class T>
void backward_typed(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                    const Tensor& dwpe) {
  using A = ComputeType<T>;
  const std::int64_t B = tokens.dim(0), T_ = tokens.dim(1), C = dwte.dim(1);
  const std::int32_t* token = tokens.data<std::int32_t>();  // [B, T]
  const T* d = dout.data<T>();                              // [B, T, C]
  A* token_grad = dwte.data<A>();                           // [V, C]
  A* position_grad = dwpe.data<A>();                        // [P, C]
  const std::int64_t channels_per_chunk =
      std::max<std::int64_t>(16, kElementwiseGrain / std::max<std::int64_t>(B * T_, 1));
  parallel_for(C, channels_per_chunk, [&](std::int64_t first, std::int64_t last) {
    run_vectorized([&] {
      for (std::int64_t bt = 0; bt < B * T_; ++bt) {
        const T* row = d + bt * C;
        A* w = token_grad + token[bt] * C;
        A* p = position_grad + (bt % T_) * C;
        for (std::int64_t c = first; c < last; ++c) {
          const A g = load(row + c);
          w[c] = w[c] + g;
          p[c] = p[c] + g;
        }
      }
    });
  });
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out) {
  with_float_type("embedding_forward", out.dtype(),
                  [&]<class T>(T) { forward_typed<T>(tokens, wte, wpe, out); });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe) {
  with_float_type("embedding_backward", dout.dtype(),
                  [&]<class T>(T) { backward_typed<T>(tokens, dout, dwte, dwpe); });
}

}  // namespace cpu
}  // namespace bigbatch
