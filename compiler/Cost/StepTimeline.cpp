//===- StepTimeline.cpp - The simulated training step, one timeline -------===//
#include "parc/Cost/StepTimeline.h"
#include "parc/Cost/PipelineRun.h"

#include <algorithm>

namespace parc {

namespace {

/// The data-parallel stream of one stage after (or, overlapped, during) its last backwards:
/// each chunk's gradients can be reduced once its last backward has begun producing them.
void simulateTail(const Program &program, const WorkTable &work, int64_t stage,
                  const PipelineRun &run, StageTail &tail) {
  const ParallelSpec &par = program.parallel;
  const StageWork &sw = work.stages[size_t(stage)];
  tail.pipelineEnd = run.stageEnd[size_t(stage)];

  double stream = tail.pipelineEnd;
  tail.gradSyncStart = stream;
  if (sw.gradSync > 0 && par.overlapGradReduce) {
    // Megatron's buckets: a chunk's reduction starts with its last backward and runs beside
    // the compute that follows.
    std::vector<std::pair<double, double>> ready; // (start of last backward, its share)
    for (size_t v = size_t(stage); v < work.virtualStages.size(); v += size_t(work.stageCount)) {
      double share = sw.params > 0 ? work.virtualStages[v].params / sw.params : 1;
      ready.push_back({run.lastBackwardStart[v], share * sw.gradSync});
    }
    std::sort(ready.begin(), ready.end());
    stream = tail.gradSyncStart = ready.front().first;
    for (auto [at, seconds] : ready)
      stream = std::max(stream, at) + seconds;
    // The part that ran beside the backward slowed it (CommModel::kOverlapSlowdown).
    double overlapped = std::max(0.0, std::min(stream, tail.pipelineEnd) - tail.gradSyncStart);
    stream = std::max(stream, tail.pipelineEnd) + CommModel::kOverlapSlowdown * overlapped;
  } else {
    stream += sw.gradSync;
  }
  tail.gradSyncEnd = stream;
  tail.embeddingSyncStart = stream;
  tail.embeddingSyncEnd = stream + sw.embeddingSync;
  tail.optimizerStart = tail.embeddingSyncEnd;
  tail.optimizerEnd = tail.optimizerStart + sw.optimizer;
  double gather = sw.paramGather;
  if (par.overlapParamGather) {
    // Gathered bucket by bucket ahead of the next step's first forward through the chunks.
    double firstForward = 0;
    for (const VirtualStageWork *w : work.chunksOf(stage))
      firstForward += w->forwardSeconds();
    gather = std::max(0.0, gather - firstForward);
  }
  tail.paramGatherStart = tail.optimizerEnd;
  tail.paramGatherEnd = tail.optimizerEnd + gather;
  tail.end = tail.paramGatherEnd;
}

/// stepLowerBound's pipeline part: stage 0 cannot end before the last microbatch's gradient
/// came back from any stage s, nor any stage before its own passes after the first forward.
double pipelineBound(const Mapping &mapping, const WorkTable &work, double transfer) {
  const double M = double(mapping.microbatches);
  double ramp = 0, back = 0, bound = 0;
  for (int64_t s = 0; s < mapping.pp; ++s) {
    double busy = 0;
    work.forEachChunk(s, [&](const VirtualStageWork &w) {
      busy += M * (w.forwardSeconds() + w.backwardSeconds());
    });
    bound = std::max(bound, ramp + busy + back);
    const VirtualStageWork &first = work.virtualStages[size_t(s)];
    ramp += first.forwardSeconds() + transfer;
    back += first.backwardSeconds() + transfer;
  }
  return bound;
}

} // namespace

llvm::Expected<StepTimeline> simulateStep(const Program &program, const Mapping &mapping,
                                          const WorkTable &work, bool withOps) {
  StepTimeline timeline;
  PipelineConfig &config = timeline.config;
  config.kind = program.parallel.schedule;
  config.stages = mapping.pp;
  config.microbatches = mapping.microbatches;
  config.chunks = mapping.chunks;
  for (const VirtualStageWork &w : work.virtualStages) {
    timeline.forwardSeconds.push_back(w.forwardSeconds());
    timeline.backwardSeconds.push_back(w.backwardSeconds());
  }
  timeline.messageBytes = work.messageBytes;
  timeline.transferSeconds = work.transferSeconds;

  CompiledSchedule &schedule = compiledSchedule(config);
  const std::vector<StageProgram> &programs = schedule.programs();
  llvm::Expected<PipelineRun> verdict = schedule.run(
      timeline.forwardSeconds, timeline.backwardSeconds, work.transferSeconds, withOps);
  if (!verdict)
    return verdict.takeError();
  // The same pipeline with free transfers, by its bound (exact for equal stages and within a
  // percent otherwise; the difference is the breakdown's pp part).
  timeline.pipelineWithoutTransfers =
      std::min(verdict->makespan, pipelineBound(mapping, work, /*transfer=*/0));

  timeline.tails.resize(programs.size());
  for (size_t stage = 0; stage < programs.size(); ++stage)
    simulateTail(program, work, int64_t(stage), *verdict, timeline.tails[stage]);
  if (withOps) {
    timeline.stages.resize(programs.size());
    for (size_t stage = 0; stage < programs.size(); ++stage) {
      std::vector<TimedOp> &ops = timeline.stages[stage];
      ops.reserve(programs[stage].size());
      for (size_t index = 0; index < programs[stage].size(); ++index) {
        const PipeOp &op = programs[stage][index];
        const OpTiming &timing = verdict->timings[stage][index];
        TimedOp timed{op, timing.start, timing.end};
        if (op.isCompute()) {
          const VirtualStageWork &w =
              work.virtualStages[size_t(config.virtualStageOf(int64_t(stage), op.chunk))];
          bool forward = op.kind == PipeOpKind::Forward;
          timed.tpSeconds = forward ? w.forward.tp : w.backward.tp + w.recompute.tp;
          timed.zeroSeconds = forward ? w.forward.zero : w.backward.zero + w.recompute.zero;
        }
        ops.push_back(timed);
      }
    }
  }
  timeline.pipelineMakespan = verdict->makespan;
  for (const StageTail &tail : timeline.tails)
    timeline.makespan = std::max(timeline.makespan, tail.end);
  timeline.idealBubble = bubbleFraction(mapping, config.kind);
  return timeline;
}

llvm::Expected<StepTimeline> simulateStep(const Program &program, const Mapping &mapping) {
  return simulateStep(program, mapping, buildWorkTable(program, mapping), true);
}

double stepLowerBound(const Program &program, const Mapping &mapping, const WorkTable &work) {
  const ParallelSpec &par = program.parallel;
  const int64_t pp = mapping.pp;
  const double M = double(mapping.microbatches), c = work.transferSeconds;
  // Chunk 0's virtual stage s sits on stage s: the first forward reaches stage s, and the last
  // backward leaves it, through virtual stages 0 .. s - 1.
  double ramp = 0, back = 0, bound = 0;
  double pipelineEnd0 = 0; // stage 0 cannot finish before the last gradient came back
  std::vector<double> stageEnd(size_t(pp), 0);
  for (int64_t s = 0; s < pp; ++s) {
    double busy = 0;
    work.forEachChunk(s, [&](const VirtualStageWork &w) {
      busy += M * (w.forwardSeconds() + w.backwardSeconds());
    });
    stageEnd[size_t(s)] = ramp + busy;
    pipelineEnd0 = std::max(pipelineEnd0, ramp + busy + back);
    const VirtualStageWork &first = work.virtualStages[size_t(s)];
    ramp += first.forwardSeconds() + c;
    back += first.backwardSeconds() + c;
  }
  stageEnd[0] = std::max(stageEnd[0], pipelineEnd0);
  for (int64_t s = 0; s < pp; ++s) {
    const StageWork &sw = work.stages[size_t(s)];
    double gather = sw.paramGather;
    if (par.overlapParamGather) {
      double firstForward = 0;
      work.forEachChunk(s, [&](const VirtualStageWork &w) { firstForward += w.forwardSeconds(); });
      gather = std::max(0.0, gather - firstForward);
    }
    double tail = (par.overlapGradReduce ? 0 : sw.gradSync) + sw.embeddingSync + sw.optimizer +
                  gather;
    bound = std::max(bound, stageEnd[size_t(s)] + tail);
  }
  return bound;
}

double StepTimeline::busySeconds(int64_t stage) const {
  // Every (chunk, microbatch) runs one forward and one backward on its stage.
  double busy = 0;
  for (size_t v = size_t(stage); v < forwardSeconds.size(); v += size_t(config.stages))
    busy += double(config.microbatches) * (forwardSeconds[v] + backwardSeconds[v]);
  return busy;
}

double StepTimeline::simulatedBubble() const {
  double busiest = 0;
  for (int64_t stage = 0; stage < int64_t(stages.size()); ++stage)
    busiest = std::max(busiest, busySeconds(stage));
  return busiest > 0 ? pipelineMakespan / busiest - 1 : 0;
}

int64_t StepTimeline::criticalStage() const {
  int64_t best = 0;
  for (int64_t s = 0; s < int64_t(tails.size()); ++s)
    if (tails[size_t(s)].end > tails[size_t(best)].end)
      best = s;
  return best;
}

} // namespace parc
