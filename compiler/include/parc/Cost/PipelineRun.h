//===- PipelineRun.h - The timing run of a pipeline schedule ---*- C++ -*-===//
//
// The lowering's pipeline schedule (Schedule.h) run with per-virtual-stage times: each stage
// executes its program in order, a send posts its message and goes on (NCCL queues it), a
// receive waits until the message has arrived, `transfer` after its send was posted. The
// lowering's verifier proves the programs consistent (ScheduleVerifier.h); this is the fast
// timing of the same programs that the report, the diagram and the trace share.
//
// Which instruction may run before which depends only on the programs, never on the times, so
// a schedule is compiled once per shape (stages, microbatches, chunks, kind) into one flat
// list of steps in an order every dependency respects, and each mapping's run is one pass over
// it with no blocking, no wake-ups and no allocation: the search runs thousands of mappings of
// a few shapes. The times are the same, bit for bit, as running the programs instruction by
// instruction.
//
// StepTimeline.cpp runs it; the unit tests hold it to the instruction-by-instruction run.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_PIPELINERUN_H
#define PARC_COST_PIPELINERUN_H

#include "parc/Lower/Schedule.h"
#include "parc/Lower/ScheduleVerifier.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace parc {

struct PipelineRun {
  std::vector<std::vector<OpTiming>> timings; // [stage][instruction], only when asked for
  std::vector<double> stageEnd;               // when each stage's last instruction ends
  std::vector<double> lastBackwardStart;      // by virtual stage
  double makespan = 0;
};

class CompiledSchedule {
public:
  explicit CompiledSchedule(const PipelineConfig &config);

  const PipelineConfig &config() const { return shape; }
  const std::vector<StageProgram> &programs() const { return stagePrograms; }

  /// One run with `forward` and `backward` seconds per virtual stage; `keepTimings` also gives
  /// every instruction's interval. An error means the programs deadlock (an internal error).
  /// Uses this object's scratch space: one run at a time (the cache below is per thread).
  llvm::Expected<PipelineRun> run(llvm::ArrayRef<double> forward, llvm::ArrayRef<double> backward,
                                  double transfer, bool keepTimings);

private:
  /// A run of instructions fused into one step that needs no branch: up to two receives, a
  /// compute and up to two sends, any of them absent, in that order (which the timings,
  /// instruction by instruction, read back). A stage waits for `wait` (slot 0 holds
  /// 0 for an absent receive), computes for `duration` (slot 0 is 0 s for an absent compute)
  /// and posts `send` (to the sink slot 1 for an absent send). Megatron's steady state posts
  /// two receives before a compute and two sends after one, so a step is about a compute.
  struct Step {
    uint32_t wait[2] = {0, 0};
    uint32_t duration = 0;
    uint32_t send[2] = {1, 1};
  };
  /// Steps [first, first + count) of the flat list run on `stage`, back to back.
  struct Segment {
    uint32_t stage = 0, count = 0;
  };
  enum : uint32_t { ZeroSlot = 0, SinkSlot = 1 };

  class Messages;
  void compile();
  /// Fuses the instructions of `stage` from `next[stage]` on into steps, up to its end or to
  /// a receive whose send has not run yet (by `next`); returns where it stopped and the stage
  /// it waits for, or -1.
  std::pair<size_t, int64_t> addSegment(const Messages &message,
                                        const std::vector<size_t> &next, size_t stage);
  template <bool KeepTimings> PipelineRun runSteps(double transfer);

  PipelineConfig shape;
  std::vector<StageProgram> stagePrograms;
  std::vector<Step> steps;
  std::vector<Segment> segments;
  /// Per stage, the arrival slot of its last send (SinkSlot when it sends nothing): its end is
  /// that arrival or its clock, whichever is later.
  std::vector<uint32_t> lastSend;
  size_t slots = 2;
  bool deadlocks = false;
  /// The run's scratch: the durations (0, forwards, backwards), when each duration's last use
  /// began (which gives the backwards' starts), the arrivals, the stages' clocks.
  std::vector<double> durations, starts, arrival, clock;
};

/// The compiled schedule of `config`, built once per thread for the shapes in use.
CompiledSchedule &compiledSchedule(const PipelineConfig &config);

} // namespace parc

#endif
