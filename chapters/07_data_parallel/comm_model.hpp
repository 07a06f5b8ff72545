// comm_model.hpp: chapter 07's alpha-beta model of the gradient sum, for clusters this
// machine is not. Modelled, not measured.
//
// A message of n bytes from one rank to another costs alpha + n / beta (alpha: the
// latency, beta: the bandwidth of the link). The collectives, for R ranks and n bytes:
//   reduce-scatter, all-gather   (R - 1) steps of n / R bytes: (R - 1) (alpha + n / (R beta))
//   ring all-reduce              the two in turn: 2 (R - 1) (alpha + n / (R beta))
//   on nodes of G devices        reduce-scatter inside each node (its link), a ring
//                                all-reduce of n / G bytes across the R / G nodes (the
//                                network), an all-gather inside the node
// The ring moves 2 (R - 1) / R n bytes per rank, nearly 2 n for any R: its bandwidth term
// does not grow with R, its latency term does. A data-parallel step is k micro-batches of
// compute per rank and one such sum, so k (accumulation) is the knob that makes the sum a
// small share of the step: the compute grows with k, the sum does not.
#pragma once

#include <span>
#include <utility>

namespace bigbatch::data_parallel {

/// One link's alpha and beta.
struct Link {
  double latency_seconds = 0;   ///< alpha
  double bytes_per_second = 0;  ///< beta
};

/// Ring all-reduce of `bytes` over `ranks` (>= 1; 0 seconds for one rank).
double ring_all_reduce_seconds(double bytes, int ranks, const Link& link);
/// Reduce-scatter (or all-gather) of `bytes` over `ranks`: half a ring all-reduce.
double reduce_scatter_seconds(double bytes, int ranks, const Link& link);
/// All-reduce over `ranks` = nodes x `per_node` (ranks a multiple of per_node): inside
/// each node a reduce-scatter and an all-gather on `inside`, between the nodes a ring
/// all-reduce of bytes / per_node on `between`.
double hierarchical_all_reduce_seconds(double bytes, int ranks, int per_node,
                                       const Link& inside, const Link& between);
/// A cluster of nodes of `per_node` devices: a link inside a node, one between nodes.
struct Cluster {
  Link inside;       ///< between the devices of one node (NVLink)
  Link between;      ///< between nodes, per device (InfiniBand)
  int per_node = 1;  ///< devices in a node
};
/// Section (d)'s cluster of H200s, assumed from published figures, not measured: NVLink's
/// 900 GB/s per GPU counted as 450 each way with 5 us, InfiniBand's 400 Gb/s as 50 GB/s per
/// GPU with 10 us, 8 GPUs a node.
Cluster h200_cluster();
/// All-reduce of `bytes` over `ranks` of `cluster`: a ring inside one node when they fit
/// in one, else hierarchical (ranks a multiple of per_node: std::invalid_argument
/// otherwise).
double cluster_all_reduce_seconds(double bytes, int ranks, const Cluster& cluster);

/// alpha and beta of a ring over `ranks` (>= 2) fitted by least squares to measured
/// (bytes, seconds) of its all-reduce, at two sizes or more (a fitted latency below 0 is
/// taken as 0); throws std::invalid_argument for fewer, sizes all equal, or a time that
/// does not grow with the size.
Link fit_ring(std::span<const std::pair<double, double>> measured, int ranks);

/// One data-parallel step, the sum not overlapped with the compute.
struct StepEstimate {
  double compute = 0;        ///< k micro-batches of forward and backward
  double communication = 0;  ///< the gradient sum
  double step = 0;           ///< their sum
  double share = 0;          ///< communication / step
};
StepEstimate data_parallel_step(double micro_batch_seconds, int micro_batches,
                                double sum_seconds);

}  // namespace bigbatch::data_parallel
