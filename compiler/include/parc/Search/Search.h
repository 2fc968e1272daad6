//===- Search.h - parc chooses the mapping --------------------------------===//
//
// The search behind `auto`: every combination of the fields a parallel block leaves open
// (tp, pp, dp, cp, micro_batch, schedule and its chunks, zero, recompute, sequence_parallel,
// order), inside the values `auto(...)` allows. Candidates that break a divisibility rule
// (Feasibility.h) or do not fit in memory (MemoryModel.h) are counted and dropped; the others
// are ranked by the step-time model. Each survivor is evaluated in process from its work table
// with stepLowerBound, in O(pp x chunks); the step is then simulated in the order of those
// bounds until no bound beats the K-th simulated step, so the ranking is the one
// `--report=json` would give each mapping alone. Both cores share the enumeration.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEARCH_SEARCH_H
#define PARC_SEARCH_SEARCH_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/CostModel.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Sema/Program.h"
#include "parc/Support/Limits.h"

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace parc {

/// Why a candidate is not a mapping, in the order the search tests them.
enum class Rejection {
  DoesNotDivide,    // tp, pp, dp, micro_batch or the stages do not split the model or batch
  ContextParallel,  // a seq that 2 x cp does not divide, or an order without cp for cp > 1
  SequenceParallel, // sequence parallelism without tp > 1 or a seq / cp that tp does not divide
  ScheduleRule,     // a pipeline schedule without pp > 1, chunks that do not split, M % pp
  ZeroWithoutDP,    // zero > 0 with dp = 1 shards nothing
  StepLimit,        // more microbatches or simulated passes per step than Limits.h allows
  OutOfMemory,
};
constexpr size_t kRejections = 7;
const char *toString(Rejection reason);

/// One mapping the search evaluated.
struct Candidate {
  ParallelSpec parallel; // every field concrete
  Mapping mapping;
  double maxRankBytes = 0;
  double lowerBound = 0; // stepLowerBound
  bool simulated = false;
  CostEstimate cost; // when simulated
  StageMemory worstStage; // the stage that needs the most memory

  double step() const { return simulated ? cost.stepSeconds : lowerBound; }
};

/// The three one-axis families of the DP vs TP vs PP question.
enum class PureFamily { DataParallel, TensorParallel, PipelineParallel };
constexpr size_t kPureFamilies = 3;
const char *toString(PureFamily family);

struct SearchResult {
  int64_t candidates = 0, feasible = 0;
  std::array<int64_t, kRejections> rejected{};
  double elapsedSeconds = 0;
  /// The best feasible mappings, fastest first, simulated; ties go to less memory, then to
  /// fewer groups crossing nodes.
  std::vector<Candidate> top;
  /// The best of each family, when one fits; otherwise the reason none does.
  std::array<std::optional<Candidate>, kPureFamilies> pure;
  std::array<std::string, kPureFamilies> pureProblem;
  /// When nothing fits: the candidates that miss gpu.memory by the least.
  std::vector<Candidate> closest;
  /// Work spent (SearchOptions::maxWork). Over the budget the search stops: the space is too
  /// large to search, and nothing else in the result means anything.
  int64_t work = 0;
  bool overBudget = false;
};

struct SearchOptions {
  size_t top = 10;
  unsigned threads = 2;
  /// Each memory estimate and each step bound of a candidate costs one unit per transformer
  /// block, each simulated step one per forward and backward pass; the search gives up beyond
  /// this many.
  int64_t maxWork = limits::MaxSearchWork;
  /// Called about every 100 ms with the share of the space enumerated, when set.
  std::function<void(double)> progress;
};

SearchResult searchMappings(const Program &program, const SearchOptions &options);

/// `program` with the parallel fields of `chosen` and nothing left to search.
Program withMapping(const Program &program, const ParallelSpec &chosen);

} // namespace parc

#endif
