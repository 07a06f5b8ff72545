// cross_entropy.cu: softmax cross-entropy on the GPU (the contract is in cross_entropy.hpp).
//
// One block per row computes the row's max and sum of exponentials with fixed-tree block
// reductions. The forward writes one loss per row to a workspace, then sums them in
// reduction_order.hpp's order 2: one block per chunk of 4096 rows writes the chunk's sum
// over the chunk's first row loss (which it has read by then), and one block adds those
// partials and accumulates into the loss. Deterministic; the CPU adds the rows in order,
// so the two differ by rounding (as do the row losses: tree reductions, expf/logf).
// The labels are not checked here (cross_entropy.hpp): a label outside [0, C) makes its
// row's loss and gradient NaN, and nothing is read outside the row; the ignored label
// (kIgnoredLabel) makes them 0.
#include "kernels/cross_entropy.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_row_sums.cuh"

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

/// Whether a label names a class of a row of C logits.
__device__ inline bool label_in_range(std::int32_t label, std::int64_t C) {
  return label >= 0 && label < C;
}

template <class T>
__global__ void row_loss_kernel(const T* logits, const std::int32_t* labels, float* row_loss,
                                std::int64_t M, std::int64_t C) {
  for (std::int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const T* row = logits + i * C;
    float max, sum_exp;
    row_softmax_statistics(row, C, &max, &sum_exp);
    if (threadIdx.x == 0) {
      const std::int32_t label = labels[i];
      row_loss[i] = label == kIgnoredLabel      ? 0.0f
                    : label_in_range(label, C) ? detail::cross_entropy_row_loss(
                                                     max, to_float(row[label]), logf(sum_exp))
                                               : NAN;
    }
  }
}

/// Order 2's first level, one block per chunk: row_loss[chunk's first row] = the chunk's
/// sum. Every thread has read its rows before block_sum returns (it synchronises the
/// block), and no other block reads this chunk, so the overwrite is safe.
__global__ void chunk_sum_kernel(float* row_loss, std::int64_t M) {
  using reduction_order::kSumChunk;
  const std::int64_t begin = blockIdx.x * kSumChunk;
  const std::int64_t end = begin + kSumChunk < M ? begin + kSumChunk : M;
  const float sum = lane_tree_sum(row_loss, begin, end);
  if (threadIdx.x == 0) row_loss[begin] = sum;
}

/// Order 2's second level, one block: loss[0] += (the chunks' sums, at row_loss[c * 4096])
/// * factor.
__global__ void accumulate_loss_kernel(const float* row_loss, std::int64_t chunks, float factor,
                                       float* loss) {
  const float total = lane_tree_sum(row_loss, 0, chunks, reduction_order::kSumChunk);
  if (threadIdx.x == 0) loss[0] = __fadd_rn(loss[0], __fmul_rn(total, factor));
}

template <class T>
__global__ void gradient_kernel(const T* logits, const std::int32_t* labels, float* dlogits,
                                std::int64_t M, std::int64_t C, float factor) {
  for (std::int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const T* row = logits + i * C;
    float max, sum_exp;
    row_softmax_statistics(row, C, &max, &sum_exp);
    const std::int32_t label = labels[i];
    const bool valid = label_in_range(label, C);
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      dlogits[i * C + c] = label == kIgnoredLabel ? 0.0f
                           : valid ? detail::cross_entropy_gradient(expf(to_float(row[c]) - max),
                                                                    sum_exp, c == label, factor)
                                   : NAN;
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
  const std::int64_t chunks = (M + reduction_order::kSumChunk - 1) / reduction_order::kSumChunk;
  chunk_sum_kernel<<<static_cast<unsigned>(chunks), kThreadsPerBlock>>>(row_loss.data<float>(), M);
  BIGBATCH_CHECK_LAUNCH("cross_entropy chunk_sum_kernel");
  accumulate_loss_kernel<<<1, kThreadsPerBlock>>>(
      row_loss.data<float>(), chunks, detail::cross_entropy_factor<float>(global_count, scale),
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
  dispatch_floating("cross_entropy_forward", logits.dtype(), [&]<class T>(ElementType<T>) {
    forward_typed<T>(logits, labels, loss, global_count, scale);
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale) {
  dispatch_floating("cross_entropy_backward", logits.dtype(), [&]<class T>(ElementType<T>) {
    backward_typed<T>(logits, labels, dlogits, global_count, scale);
  });
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  return dispatch_floating("count_correct", logits.dtype(), [&]<class T>(ElementType<T>) {
    return count_correct_typed<T>(logits, labels);
  });
}

}  // namespace bigbatch::cuda
