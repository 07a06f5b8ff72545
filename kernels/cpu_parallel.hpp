// cpu_parallel.hpp: splitting a loop across the CPU's threads (OpenMP when built with it).
//
// parallel_for(n, grain, body) calls body(begin, end) on disjoint chunks that cover
// [0, n). Each chunk is at least `grain` long, so small loops stay on one thread and
// pay no fork/join. Which thread runs a chunk never changes a result: every output
// element is computed by exactly one call, in the same order, at every thread count.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace bigbatch::cpu {

/// The most threads parallel_for may use: OpenMP's limit, or 1 without OpenMP.
inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Calls body(begin, end) on disjoint chunks covering [0, n), each at least `grain` long:
/// none for n <= 0, one on the calling thread when n < 2 * grain or one thread is allowed.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t grain, const Body& body) {
  if (n <= 0) return;
  const std::int64_t chunks_wanted = std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1));
  const int threads = static_cast<int>(std::min<std::int64_t>(max_threads(), chunks_wanted));
  if (threads <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t count = omp_get_num_threads();
    const std::int64_t begin = n * t / count;
    const std::int64_t end = n * (t + 1) / count;
    if (begin < end) body(begin, end);
  }
#else
  body(std::int64_t{0}, n);
#endif
}

}  // namespace bigbatch::cpu
