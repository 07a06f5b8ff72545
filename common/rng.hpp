// rng.hpp: counter-based random numbers (Philox 4x32-10), the same code on both backends.
//
// A value is a pure function of (seed, stream, index): there is no generator state to
// advance. The four consecutive indices 4q, 4q + 1, 4q + 2, 4q + 3 form group q and take
// the four words of one Philox evaluation in order,
//   random_bits(seed, stream, index) = philox4x32_10(counter = (q_lo, q_hi, stream_lo,
//                                      stream_hi), key = (seed_lo, seed_hi)).v[index & 3]
// with q = index >> 2 (lo/hi: the low and high 32 bits). A caller may start or stop
// anywhere, mid-group included; one that needs many consecutive values evaluates each group
// once (random_group) and takes its four words.
//
// Why and how: docs/internals.md#commonrnghpp
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace bigbatch {

/// The output of one Philox evaluation: four 32-bit random words.
struct Philox4x32 {
  /// The words, in the order indices 4q .. 4q + 3 take them.
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

/// The four words of group `group`: random_bits of indices 4 group + w is .v[w].
BIGBATCH_HD inline Philox4x32 random_group(std::uint64_t seed, std::uint64_t stream,
                                           std::uint64_t group) {
  return philox4x32_10(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                       static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

/// 32 random bits for element `index` of stream `stream` under `seed`: word index & 3
/// of group index >> 2.
BIGBATCH_HD inline std::uint32_t random_bits(std::uint64_t seed, std::uint64_t stream,
                                             std::uint64_t index) {
  return random_group(seed, stream, index >> 2).v[index & 3];
}

/// The float uniform on [0, 1) made from 32 random bits: their top 24 bits times 2^-24,
/// so exactly k * 2^-24 for some integer k.
BIGBATCH_HD inline float uniform_from_bits(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

/// A float uniform on [0, 1) with 24 random bits: uniform_from_bits(random_bits(...)).
BIGBATCH_HD inline float random_uniform(std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t index) {
  return uniform_from_bits(random_bits(seed, stream, index));
}

}  // namespace bigbatch
