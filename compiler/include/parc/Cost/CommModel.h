//===- CommModel.h - alpha-beta times of collectives and sends ------------===//
//
// The latency-bandwidth (alpha-beta) model of ring collectives, as in Thakur, Rabenseifner and
// Gropp, "Optimization of Collective Communication Operations in MPICH" (IJHPCA 2005), and
// NCCL's performance notes (docs/performance "bus bandwidth"). A ring over n ranks moves each
// byte through n - 1 hops per phase; all-reduce is a reduce-scatter followed by an all-gather,
// hence twice the steps. With alpha = link latency and beta = 1 / link bandwidth:
//
//   all-reduce      2 (n - 1) alpha + 2 (n - 1) / n * bytes * beta
//   all-gather        (n - 1) alpha +   (n - 1) / n * bytes * beta
//   reduce-scatter    (n - 1) alpha +   (n - 1) / n * bytes * beta
//   send                      alpha +                bytes * beta
//
// `bytes` is always the size of the full buffer: the all-reduced tensor, the gathered output
// or the reduce-scatter input. A group of one rank communicates nothing and costs 0.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_COMMMODEL_H
#define PARC_COST_COMMMODEL_H

#include "parc/Sema/Program.h"

#include <cstdint>

namespace parc {

/// Seconds for a ring all-reduce of `bytes` over `ranks` ranks on `link`.
double allReduceTime(double bytes, int64_t ranks, const LinkSpec &link);
/// Seconds for a ring all-gather whose gathered output is `bytes`.
double allGatherTime(double bytes, int64_t ranks, const LinkSpec &link);
/// Seconds for a ring reduce-scatter whose input is `bytes`.
double reduceScatterTime(double bytes, int64_t ranks, const LinkSpec &link);
/// Seconds for one point-to-point send of `bytes` (pipeline activations and gradients).
double sendTime(double bytes, const LinkSpec &link);

} // namespace parc

#endif
