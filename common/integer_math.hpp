// integer_math.hpp: division that rounds up, for the count of pieces a whole is cut into
// (micro-batches, panels, blocks, buckets) and sizes rounded up to a multiple.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bigbatch {

/// ceil(a / b) for a >= 0 and b > 0: how many pieces of at most b make a (a + b - 1 must
/// not overflow).
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
/// The same for sizes.
constexpr std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

/// a rounded up to a multiple of m > 0.
constexpr std::int64_t round_up(std::int64_t a, std::int64_t m) { return ceil_div(a, m) * m; }
/// The same for sizes.
constexpr std::size_t round_up(std::size_t a, std::size_t m) { return ceil_div(a, m) * m; }

}  // namespace bigbatch
