// rng.hpp: counter-based random numbers (Philox 4x32-10).
//
// A value is a pure function of (seed, stream, index): there is no generator state
// to advance. Dropout keyed by a sample's global index therefore draws the same mask
// whether that sample sits in a batch of 1024 or a micro-batch of 7, and the same
// again when a checkpointed segment is recomputed. The same code runs on both backends.
//
// Philox 4x32-10 is Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy
// as 1, 2, 3" (SC'11); the tests check it against that paper's known-answer vectors.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace bigbatch {

struct Philox4x32 {
  std::uint32_t v[4];
};

/// Ten rounds of Philox 4x32 on counter (c0..c3) with key (k0, k1).
BIGBATCH_HD inline Philox4x32 philox4x32_10(std::uint32_t c0, std::uint32_t c1,
                                            std::uint32_t c2, std::uint32_t c3,
                                            std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2;
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

/// 32 random bits for element `index` of stream `stream` under `seed`.
BIGBATCH_HD inline std::uint32_t random_bits(std::uint64_t seed, std::uint64_t stream,
                                             std::uint64_t index) {
  return philox4x32_10(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                       static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32))
      .v[0];
}

/// A float uniform on [0, 1) with 24 random bits: exactly k * 2^-24 for some integer k.
BIGBATCH_HD inline float random_uniform(std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t index) {
  return static_cast<float>(random_bits(seed, stream, index) >> 8) * 0x1p-24f;
}

}  // namespace bigbatch
