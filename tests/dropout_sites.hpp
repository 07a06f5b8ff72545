// dropout_sites.hpp: the check that a model's dropout sites draw independent masks.
//
// A model keys each dropout mask by (the step's seed, a stream per site, the element's
// global index) (kernels/dropout.hpp). Two sites on one stream would draw one mask at the
// indices they share, and no comparison of a run with itself or with its micro-batches would
// see it: both sides draw the same masks. The check reads the specs a step drew
// (nn::ForwardContext::drawn_dropouts), and draws each pair of sites' masks to compare.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dropout.hpp"
#include "tests/harness.hpp"

namespace bigbatch::testing {

/// Checks the specs a forward and backward drew, `sites` in each pass: every spec has the
/// step's p, seed and first row; the forward's sites have a stream each; the backward draws
/// the forward's sites again, each once. Then the masks two sites draw over n elements keep
/// an element in both as often as independent masks do: (1 - p)^2 of them, within 6 standard
/// deviations of that binomial count (a true pair fails with probability below 2e-9; two
/// sites on one stream keep 1 - p of them in both, p (1 - p) n more: 1,500 above the mean
/// at p = 0.1, against 6 sigma = 300).
inline void expect_independent_dropout_sites(const std::vector<DropoutSpec>& drawn,
                                             std::size_t sites, float p, std::uint64_t seed,
                                             std::int64_t first_row) {
  ASSERT_EQ(drawn.size(), 2 * sites) << "each site drawn once forward and once backward";
  std::vector<std::uint64_t> forward, backward;
  for (std::size_t i = 0; i < drawn.size(); ++i) {
    EXPECT_EQ(drawn[i].p, p) << "site " << i;
    EXPECT_EQ(drawn[i].seed, seed) << "site " << i;
    EXPECT_EQ(drawn[i].first_row, first_row) << "site " << i;
    (i < sites ? forward : backward).push_back(drawn[i].stream);
  }
  std::vector<std::uint64_t> streams = forward;
  std::sort(streams.begin(), streams.end());
  EXPECT_EQ(std::adjacent_find(streams.begin(), streams.end()), streams.end())
      << "two sites of the forward draw from one stream";
  std::sort(backward.begin(), backward.end());
  EXPECT_EQ(backward, streams) << "the backward redraws other masks than the forward drew";

  constexpr std::int64_t n = 1 << 14;
  const Tensor ones = make_tensor(std::vector<double>(n, 1.0), {n}, DType::f32, Device::cpu());
  std::vector<std::vector<double>> masks;
  for (std::size_t i = 0; i < sites; ++i) {
    const Tensor mask({n}, DType::f32, Device::cpu());
    dropout_forward(ones, mask, drawn[i]);
    masks.push_back(to_doubles(mask));
  }
  const double both = (1.0 - p) * (1.0 - p);
  const double sd = std::sqrt(n * both * (1 - both));
  for (std::size_t a = 0; a < sites; ++a) {
    for (std::size_t b = a + 1; b < sites; ++b) {
      double kept = 0;
      for (std::int64_t k = 0; k < n; ++k) kept += masks[a][k] != 0 && masks[b][k] != 0;
      EXPECT_NEAR(kept, n * both, 6 * sd) << "sites " << a << " and " << b << " (streams "
                                          << drawn[a].stream << ", " << drawn[b].stream << ")";
    }
  }
}

}  // namespace bigbatch::testing
