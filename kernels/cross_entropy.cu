// cross_entropy.cu: softmax cross-entropy on the GPU (the contract is in cross_entropy.hpp).
//
// One block per row computes the row's max and sum of exponentials with fixed-tree block
// reductions. The forward writes one loss per row to a workspace; a single thread then adds
// them in row order, the order the CPU uses (the row losses themselves may differ from the
// CPU's by rounding: tree reductions, expf/logf), and accumulates into the loss. The labels were
// checked on the host by the dispatcher before any launch.
#include "kernels/cross_entropy.hpp"
#include "kernels/cuda_common.cuh"

#include <vector>

namespace bigbatch::cuda {
namespace {

/// The row's max logit and sum of exp(z - max), for every thread of the block.
template <class T>
__device__ void row_softmax_statistics(const T* row, std::int64_t C, float* max,
                                       float* sum_exp) {
  float local_max = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    local_max = fmaxf(local_max, to_float(row[c]));
  }
  *max = block_max(local_max);
  float local_sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    local_sum += expf(to_float(row[c]) - *max);
  }
  *sum_exp = block_sum(local_sum);
}

template <class T>
__global__ void row_loss_kernel(const T* logits, const std::int32_t* labels, float* row_loss,
                                std::int64_t M, std::int64_t C) {
  for (std::int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const T* row = logits + i * C;
    float max, sum_exp;
    row_softmax_statistics(row, C, &max, &sum_exp);
    if (threadIdx.x == 0) {
      row_loss[i] = detail::cross_entropy_row_loss(max, to_float(row[labels[i]]), logf(sum_exp));
    }
  }
}

/// loss[0] += (row losses added in row order) * factor: one thread, the CPU's order.
__global__ void accumulate_loss_kernel(const float* row_loss, std::int64_t M, float factor,
                                       float* loss) {
  float total = 0.0f;
  for (std::int64_t i = 0; i < M; ++i) total += row_loss[i];
  loss[0] = __fadd_rn(loss[0], __fmul_rn(total, factor));
}

template <class T>
__global__ void gradient_kernel(const T* logits, const std::int32_t* labels, float* dlogits,
                                std::int64_t M, std::int64_t C, float factor) {
  for (std::int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const T* row = logits + i * C;
    float max, sum_exp;
    row_softmax_statistics(row, C, &max, &sum_exp);
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      dlogits[i * C + c] = detail::cross_entropy_gradient(expf(to_float(row[c]) - max), sum_exp,
                                                          c == labels[i], factor);
    }
  }
}

/// correct_per_block[b]: the rows of block b whose argmax is their label (one thread per row).
template <class T>
__global__ void count_correct_kernel(const T* logits, const std::int32_t* labels,
                                     std::int32_t* correct_per_block, std::int64_t M,
                                     std::int64_t C) {
  __shared__ int block_correct;
  if (threadIdx.x == 0) block_correct = 0;
  __syncthreads();
  int correct = 0;
  for (const std::int64_t i : grid_stride(M)) {
    const T* row = logits + i * C;
    std::int64_t best = 0;
    float best_value = to_float(row[0]);
    for (std::int64_t c = 1; c < C; ++c) {
      const float value = to_float(row[c]);
      if (detail::argmax_replaces(value, best_value)) {
        best = c;
        best_value = value;
      }
    }
    correct += best == labels[i] ? 1 : 0;
  }
  atomicAdd(&block_correct, correct);  // integer addition: exact in any order
  __syncthreads();
  if (threadIdx.x == 0) correct_per_block[blockIdx.x] = block_correct;
}

template <class T>
void forward_typed(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                   float global_count, float scale) {
  const std::int64_t M = logits.dim(0), C = logits.dim(1);
  if (M == 0) return;
  const Tensor row_loss({M}, DType::f32, logits.device(), MemoryCategory::workspace);
  row_loss_kernel<T><<<row_blocks(M), kThreadsPerBlock>>>(
      logits.data<T>(), labels.data<std::int32_t>(), row_loss.data<float>(), M, C);
  BIGBATCH_CHECK_LAUNCH("cross_entropy row_loss_kernel");
  accumulate_loss_kernel<<<1, 1>>>(row_loss.data<float>(), M,
                                   detail::cross_entropy_factor<float>(global_count, scale),
                                   loss.data<float>());
  BIGBATCH_CHECK_LAUNCH("cross_entropy accumulate_loss_kernel");
}

template <class T>
void backward_typed(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                    float global_count, float scale) {
  const std::int64_t M = logits.dim(0), C = logits.dim(1);
  if (M == 0) return;
  gradient_kernel<T><<<row_blocks(M), kThreadsPerBlock>>>(
      logits.data<T>(), labels.data<std::int32_t>(), dlogits.data<float>(), M, C,
      detail::cross_entropy_factor<float>(global_count, scale));
  BIGBATCH_CHECK_LAUNCH("cross_entropy gradient_kernel");
}

template <class T>
std::int64_t count_correct_typed(const Tensor& logits, const Tensor& labels) {
  const std::int64_t M = logits.dim(0), C = logits.dim(1);
  if (M == 0) return 0;
  const unsigned blocks = grid_for(M);
  const Tensor correct_per_block({blocks}, DType::i32, logits.device(),
                                 MemoryCategory::workspace);
  count_correct_kernel<T><<<blocks, kThreadsPerBlock>>>(
      logits.data<T>(), labels.data<std::int32_t>(), correct_per_block.data<std::int32_t>(), M, C);
  BIGBATCH_CHECK_LAUNCH("count_correct_kernel");
  std::int64_t correct = 0;
  for (const std::int32_t c : correct_per_block.to_vector<std::int32_t>()) correct += c;
  return correct;
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                           float global_count, float scale) {
  dispatch_f16_f32("cross_entropy_forward", logits.dtype(), [&]<class T>(ElementType<T>) {
    forward_typed<T>(logits, labels, loss, global_count, scale);
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale) {
  dispatch_f16_f32("cross_entropy_backward", logits.dtype(), [&]<class T>(ElementType<T>) {
    backward_typed<T>(logits, labels, dlogits, global_count, scale);
  });
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  return dispatch_f16_f32("count_correct", logits.dtype(), [&]<class T>(ElementType<T>) {
    return count_correct_typed<T>(logits, labels);
  });
}

}  // namespace bigbatch::cuda
