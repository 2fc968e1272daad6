//===- BenchReport.h - The kernel bench's rows, table and JSON ------------===//
//
// What parc_kernel_bench measured, one Row per kernel, judged against the ceilings it measured
// on the same GPU: a kernel is "ok" within 2x of its ceiling (issue 6's target), and not judged
// when even the ceiling would take less than a launch (5 us).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_BENCH_GPU_BENCHREPORT_H
#define PARC_BENCH_GPU_BENCHREPORT_H

#include <string>
#include <vector>

namespace parc::bench {

constexpr double kLaunchBoundSeconds = 5e-6;
/// Issue 6: each kernel within 2x of its ceiling.
constexpr double kTargetFraction = 0.5;

enum class Bound { Memory, Compute };

struct Row {
  std::string name;
  Bound bound;
  double work = 0;    // bytes (Memory) or FLOPs (Compute)
  double seconds = 0; // median
  std::string error;
};

struct Ceilings {
  double bytesPerSecond = 0, flopsPerSecond = 0;
  double of(Bound bound) const { return bound == Bound::Memory ? bytesPerSecond : flopsPerSecond; }
};

/// "ok", "SLOW", "launch-bound" or "ERROR".
const char *verdict(const Row &row, const Ceilings &ceilings);
/// The table on stdout, one line per row and a summary.
void printTable(const std::vector<Row> &rows, const Ceilings &ceilings, int reps);
/// The rows as `parc-kernel-bench/1` JSON; false when the file cannot be written.
bool writeJson(const std::string &path, const std::string &device, const std::vector<Row> &rows,
               const Ceilings &ceilings);

} // namespace parc::bench

#endif
