//===- ScheduleVerifier.h - Prove per-stage pipeline schedules consistent -===//
//
// Runs every stage's program against the others and proves that they fit together: every send
// meets exactly one matching receive, no stage waits forever, and each stage runs the forward
// and the backward of every (chunk, microbatch) once, each after its input arrived. The same
// run, with a cost per compute and per transfer, gives the makespan of the step and when each
// instruction ran (what --emit=trace and --emit=svg draw).
//
// Transfers rendezvous: neither side completes before the other has posted it. A run of
// adjacent transfers is posted together (Megatron's batch_isend_irecv). Posting them one at a
// time would deadlock even Megatron's 1F1B: with pp 2, stage 0 sends the activation of its
// second forward while stage 1 sends the gradient of its first backward, and each waits for
// the other's receive, which comes next in its list.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_SCHEDULEVERIFIER_H
#define PARC_LOWER_SCHEDULEVERIFIER_H

#include "parc/Lower/Schedule.h"

#include "llvm/ADT/ArrayRef.h"

#include <string>
#include <vector>

namespace parc {

struct ScheduleCosts {
  /// Forward and backward of all of one stage's layers for one microbatch; a chunk does
  /// 1 / chunks of it.
  double forward = 1;
  double backward = 2;
  /// From the moment both sides posted a transfer to its completion.
  double transfer = 0;
  /// Post each run of adjacent transfers together (what the lowering emits). False posts one
  /// transfer at a time, each blocking until its peer posted the match.
  bool batchAdjacentTransfers = true;
  /// One microbatch's forward and backward of each virtual stage, for when they differ (the
  /// first and last virtual stages carry the embedding and the head). Empty: forward / chunks
  /// and backward / chunks on every virtual stage.
  std::vector<double> virtualStageForward, virtualStageBackward;
};

/// When one instruction ran. A compute occupies its stage from start to end. A transfer spans
/// from the moment its stage posted it, together with the rest of its batch, to its
/// completion, so it includes the wait for the peer; the transfers of one batch share a start.
struct OpTiming {
  double start = 0, end = 0;
};

struct ScheduleVerdict {
  /// Empty when the schedule is consistent; otherwise names the stage and the instruction.
  std::string error;
  /// Time at which the last stage finished, valid when error is empty.
  double makespan = 0;
  /// Indexed [stage][instruction], valid when error is empty.
  std::vector<std::vector<OpTiming>> timings = {};

  bool ok() const { return error.empty(); }
};

ScheduleVerdict verifySchedule(const PipelineConfig &config, llvm::ArrayRef<StageProgram> programs,
                               const ScheduleCosts &costs = {});

/// Each stage's work, M * (forward + backward), plus the pipeline bubble: (pp - 1) forwards
/// and backwards of one chunk, i.e. a bubble fraction of (pp - 1) / (chunks * M) (Narayanan et
/// al. 2021, section 2.2). Ignores transfer costs.
double idealMakespan(const PipelineConfig &config, const ScheduleCosts &costs = {});

} // namespace parc

#endif
