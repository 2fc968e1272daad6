//===- Profiler.h - Where a step's time goes: `parrun --profile` ----------===//
//
// With --profile every op of the op lists and every schedule instruction outside them (loads,
// transfers, gradient collectives, the optimizer step) is timed on its rank, the device
// synchronised around it (a no-op on the CPU; on CUDA it serialises the stream, so the table
// shows each op's own time, not the overlapped step). Ops are keyed by kind, a fused pair
// (OpFusion.h) by both kinds: "gelu+bias_add". The GEMM ops also count their floating-point
// operations (2mnk per product), so the table gives the rate they reach. The first step pays
// for first touches and is left out unless it is the only one.
//
// Every rank keeps its own profile; at the end the ranks exchange them and the reporting rank
// prints the sum, in ms per step (over the ranks, when there are several: a rank-ms figure).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_PROFILER_H
#define PARC_RUNTIME_PROFILER_H

#include "parc/Plan/Plan.h"

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace parc::runtime {

class OpProfile {
public:
  struct Entry {
    int64_t calls = 0;
    double seconds = 0, flops = 0;
  };

  void add(const std::string &key, double seconds, double flops = 0);
  /// A step of `seconds` wall time, over which the entries were recorded.
  void addStep(double seconds);
  /// A text form for the exchange between ranks, and the sum of several.
  std::string encode() const;
  static OpProfile merge(llvm::ArrayRef<std::string> encoded);

  /// The table: entries by time, then the step time no entry covers.
  void print(llvm::raw_ostream &out, int64_t ranks, int64_t threadsPerRank) const;

  const std::map<std::string, Entry> &entries() const { return byKey; }
  int64_t steps() const { return stepCount; }

private:
  std::map<std::string, Entry> byKey;
  int64_t stepCount = 0;
  double stepSeconds = 0;
};

/// The key of an op: its kind, and the kind fused into it ("layernorm+residual_add").
std::string profileKey(const plan::Op &op);

/// The floating-point operations of a GEMM op (matmul, matmul_bwd, attention, attention_bwd)
/// from its inputs' shapes; 0 for every other op.
double opFlops(const plan::Op &op, llvm::function_ref<std::vector<int64_t>(size_t)> inputShape);

/// Seconds since construction.
class StopWatch {
public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

private:
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

} // namespace parc::runtime

#endif
