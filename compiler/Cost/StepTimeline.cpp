//===- StepTimeline.cpp - The simulated training step, one timeline -------===//
#include "parc/Cost/StepTimeline.h"
#include "parc/Lower/ScheduleVerifier.h"

#include "llvm/ADT/ArrayRef.h"

#include <algorithm>

namespace parc {

namespace {

/// The schedule run with per-virtual-stage times: each stage executes its program in order, a
/// send posts its message and goes on (NCCL queues it), a receive waits until the message has
/// arrived, `transfer` after its send was posted. The lowering's verifier proves the programs
/// consistent (ScheduleVerifier.h); this is the fast timing of the same programs, linear in
/// their length, that the report, the diagram and the trace share.
struct PipelineRun {
  std::vector<std::vector<OpTiming>> timings; // only when asked for
  std::vector<double> stageEnd;               // when each stage's last instruction ends
  std::vector<std::vector<double>> lastBackwardStart; // [stage][chunk]
  double makespan = 0;
};

llvm::Expected<PipelineRun> runPipeline(const PipelineConfig &config,
                                        llvm::ArrayRef<StageProgram> programs,
                                        llvm::ArrayRef<double> forward,
                                        llvm::ArrayRef<double> backward, double transfer,
                                        bool keepTimings) {
  const int64_t stages = config.stages, virtualStages = config.virtualStages();
  const int64_t microbatches = config.microbatches;
  // When the message into virtual stage v for microbatch m arrives: activations [0], gradients
  // [1]; negative until its send is posted.
  std::vector<double> arrival(size_t(2 * virtualStages * microbatches), -1);
  auto slot = [&](bool gradient, int64_t v, int64_t mb) -> double & {
    return arrival[size_t(((gradient ? 1 : 0) * virtualStages + v) * microbatches + mb)];
  };
  PipelineRun run;
  run.stageEnd.assign(size_t(stages), 0);
  run.lastBackwardStart.assign(size_t(stages), std::vector<double>(size_t(config.chunks), 0));
  if (keepTimings) {
    run.timings.resize(size_t(stages));
    for (int64_t s = 0; s < stages; ++s)
      run.timings[size_t(s)].resize(programs[size_t(s)].size());
  }
  std::vector<size_t> next(size_t(stages), 0);
  std::vector<double> clock(size_t(stages), 0);
  size_t remaining = 0;
  for (const StageProgram &p : programs)
    remaining += p.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int64_t s = 0; s < stages; ++s) {
      const StageProgram &program = programs[size_t(s)];
      size_t &i = next[size_t(s)];
      double &now = clock[size_t(s)];
      for (; i < program.size(); ++i) {
        const PipeOp &op = program[i];
        const int64_t v = config.virtualStageOf(s, op.chunk);
        OpTiming t;
        if (op.isCompute()) {
          t.start = now;
          bool isForward = op.kind == PipeOpKind::Forward;
          now += isForward ? forward[size_t(v)] : backward[size_t(v)];
          t.end = now;
          if (!isForward)
            run.lastBackwardStart[size_t(s)][size_t(op.chunk)] = t.start;
        } else if (op.isSend()) {
          bool gradient = op.kind == PipeOpKind::SendGradient;
          slot(gradient, gradient ? v - 1 : v + 1, op.microbatch) = now + transfer;
          t.start = now;
          t.end = now + transfer;
        } else {
          double at = slot(op.kind == PipeOpKind::RecvGradient, v, op.microbatch);
          if (at < 0)
            break; // its send is not posted yet: run the other stages first
          t.start = now;
          now = std::max(now, at);
          t.end = now;
        }
        run.stageEnd[size_t(s)] = std::max(run.stageEnd[size_t(s)], t.end);
        if (keepTimings)
          run.timings[size_t(s)][i] = t;
        --remaining;
        progressed = true;
      }
    }
    if (!progressed)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "internal error: the pipeline schedule deadlocks in its "
                                     "timing run");
  }
  for (double end : run.stageEnd)
    run.makespan = std::max(run.makespan, end);
  return run;
}

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
    std::vector<const VirtualStageWork *> chunks = work.chunksOf(stage);
    for (size_t c = 0; c < chunks.size(); ++c) {
      double share = sw.params > 0 ? chunks[c]->params / sw.params : 1;
      ready.push_back({run.lastBackwardStart[size_t(stage)][c], share * sw.gradSync});
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

/// The schedule of a pipeline shape, built once per thread for the shapes in use: the search
/// simulates many mappings of a few shapes.
const std::vector<StageProgram> &cachedSchedule(const PipelineConfig &config) {
  struct Entry {
    ScheduleKind kind;
    int64_t stages, microbatches, chunks;
    std::vector<StageProgram> programs;
  };
  thread_local std::vector<Entry> cache;
  for (const Entry &e : cache)
    if (e.kind == config.kind && e.stages == config.stages &&
        e.microbatches == config.microbatches && e.chunks == config.chunks)
      return e.programs;
  if (cache.size() >= 8)
    cache.erase(cache.begin());
  cache.push_back({config.kind, config.stages, config.microbatches, config.chunks,
                   buildPipelineSchedule(config)});
  return cache.back().programs;
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

  const std::vector<StageProgram> &programs = cachedSchedule(config);
  llvm::Expected<PipelineRun> verdict =
      runPipeline(config, programs, timeline.forwardSeconds, timeline.backwardSeconds,
                  work.transferSeconds, withOps);
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
