// comm_model.cpp: the alpha-beta formulas of comm_model.hpp and their fit.
#include "chapters/07_data_parallel/comm_model.hpp"

#include <algorithm>

#include "common/check.hpp"

namespace bigbatch::data_parallel {

double reduce_scatter_seconds(double bytes, int ranks, const Link& link) {
  BIGBATCH_CHECK(ranks >= 1 && bytes >= 0 && link.bytes_per_second > 0,
                 "reduce_scatter_seconds: ", bytes, " bytes over ", ranks, " ranks");
  const double steps = ranks - 1;
  return steps * (link.latency_seconds + bytes / (ranks * link.bytes_per_second));
}

double ring_all_reduce_seconds(double bytes, int ranks, const Link& link) {
  return 2 * reduce_scatter_seconds(bytes, ranks, link);
}

double hierarchical_all_reduce_seconds(double bytes, int ranks, int per_node,
                                       const Link& inside, const Link& between) {
  BIGBATCH_CHECK(per_node >= 1 && ranks >= per_node && ranks % per_node == 0,
                 "hierarchical_all_reduce_seconds: ", ranks, " ranks in nodes of ", per_node);
  return 2 * reduce_scatter_seconds(bytes, per_node, inside) +
         ring_all_reduce_seconds(bytes / per_node, ranks / per_node, between);
}

Cluster h200_cluster() { return {{5e-6, 450e9}, {10e-6, 50e9}, 8}; }

double cluster_all_reduce_seconds(double bytes, int ranks, const Cluster& cluster) {
  BIGBATCH_CHECK(ranks >= 1, "cluster_all_reduce_seconds: ", ranks, " ranks");
  if (ranks <= cluster.per_node) return ring_all_reduce_seconds(bytes, ranks, cluster.inside);
  BIGBATCH_CHECK(ranks % cluster.per_node == 0, "cluster_all_reduce_seconds: ", ranks,
                 " ranks do not fill nodes of ", cluster.per_node);
  return hierarchical_all_reduce_seconds(bytes, ranks, cluster.per_node, cluster.inside,
                                         cluster.between);
}

Link fit_ring(std::span<const std::pair<double, double>> measured, int ranks) {
  BIGBATCH_CHECK(ranks >= 2 && measured.size() >= 2, "fit_ring: ", measured.size(),
                 " measurements over ", ranks, " ranks");
  // seconds = a + b x, with a = 2 (R - 1) alpha, x = bytes, b = 2 (R - 1) / (R beta).
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : measured) {
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double spread = n * sxx - sx * sx;
  BIGBATCH_CHECK(spread > 0, "fit_ring: the measurements need two sizes or more");
  const double b = (n * sxy - sx * sy) / spread;
  const double a = std::max(0.0, (sy - b * sx) / n);  // a latency below 0 is noise: 0
  BIGBATCH_CHECK(b > 0, "fit_ring: the time does not grow with the size (slope ", b, ")");
  const double steps = 2.0 * (ranks - 1);
  return {a / steps, steps / (ranks * b)};
}

StepEstimate data_parallel_step(double micro_batch_seconds, int micro_batches,
                                double sum_seconds) {
  BIGBATCH_CHECK(micro_batches >= 1 && micro_batch_seconds >= 0 && sum_seconds >= 0,
                 "data_parallel_step: ", micro_batches, " micro-batches");
  StepEstimate e;
  e.compute = micro_batches * micro_batch_seconds;
  e.communication = sum_seconds;
  e.step = e.compute + e.communication;
  e.share = e.step > 0 ? e.communication / e.step : 0;
  return e;
}

}  // namespace bigbatch::data_parallel
