//===- StepTimeline.cpp - When each pipeline instruction of a step runs ---===//
//
// The compute costs follow the cost model (docs/memory-and-cost.md): a block's forward FLOPs
// per token, backward twice the forward plus what recomputation repeats, the logits of the
// padded vocabulary on the last virtual stage, all split over tp and run at peak. A pipeline
// message is one rank's 1/tp slice of a microbatch's activations (sequence parallel, or
// Megatron's scatter/gather), as in the cost model's pp traffic.
//
//===----------------------------------------------------------------------===//
#include "parc/Emit/StepTimeline.h"
#include "parc/Cost/CommModel.h"
#include "parc/Cost/CostModel.h"
#include "parc/Lower/ScheduleVerifier.h"

#include <algorithm>

namespace parc {

void computeVirtualStageSeconds(const Program &program, const Mapping &mapping,
                                std::vector<double> &forward, std::vector<double> &backward) {
  const ModelSpec &model = program.model;
  const Recompute recompute = program.parallel.recompute;
  const int64_t virtualStages = mapping.pp * mapping.chunks;
  const double tokens = double(mapping.microBatch) * double(model.seq);
  const double flopsToSeconds = tokens / double(mapping.tp) / program.cluster.gpuFlops;
  forward.assign(size_t(virtualStages), 0);
  backward.assign(size_t(virtualStages), 0);
  for (int64_t v = 0; v < virtualStages; ++v) {
    auto [first, last] = mapping.partition.blocks[size_t(v)];
    double forwardFlops = 0, recomputedFlops = 0;
    for (int64_t i = first; i < last; ++i) {
      const LayerGroup &block = model.blockGroup(i);
      forwardFlops += blockForwardFlopsPerToken(model, block);
      if (recompute == Recompute::Full)
        recomputedFlops += blockForwardFlopsPerToken(model, block);
      else if (recompute == Recompute::Selective)
        recomputedFlops += attentionCoreFlopsPerToken(model, block);
    }
    if (v == virtualStages - 1)
      forwardFlops += 2 * double(model.hidden) * double(mapping.paddedVocab);
    forward[size_t(v)] = forwardFlops * flopsToSeconds;
    backward[size_t(v)] = (2 * forwardFlops + recomputedFlops) * flopsToSeconds;
  }
}

llvm::Expected<StepTimeline> simulateStep(const Program &program, const Mapping &mapping) {
  StepTimeline timeline;
  PipelineConfig &config = timeline.config;
  config.kind = program.parallel.schedule;
  config.stages = mapping.pp;
  config.microbatches = mapping.microbatches;
  config.chunks = mapping.chunks;

  ScheduleCosts costs;
  computeVirtualStageSeconds(program, mapping, costs.virtualStageForward,
                             costs.virtualStageBackward);
  if (mapping.pp > 1) {
    const ModelSpec &model = program.model;
    timeline.messageBytes = double(bytesPerElement(model.dtype)) * double(mapping.microBatch) *
                            double(model.seq) * double(model.hidden) / double(mapping.tp);
    const LinkSpec &link = mapping.layout.anyGroupCrossesNodes(Axis::PP)
                               ? program.cluster.interNode
                               : program.cluster.intraNode;
    costs.transfer = sendTime(timeline.messageBytes, link);
  }

  std::vector<StageProgram> programs = buildPipelineSchedule(config);
  ScheduleVerdict verdict = verifySchedule(config, programs, costs);
  if (!verdict.ok())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "internal error: the pipeline schedule does not verify: %s",
                                   verdict.error.c_str());

  timeline.stages.resize(programs.size());
  for (size_t stage = 0; stage < programs.size(); ++stage) {
    std::vector<TimedOp> &ops = timeline.stages[stage];
    ops.reserve(programs[stage].size());
    for (size_t index = 0; index < programs[stage].size(); ++index) {
      const OpTiming &timing = verdict.timings[stage][index];
      ops.push_back({programs[stage][index], timing.start, timing.end});
    }
  }
  timeline.makespan = verdict.makespan;
  timeline.forwardSeconds = std::move(costs.virtualStageForward);
  timeline.backwardSeconds = std::move(costs.virtualStageBackward);
  timeline.transferSeconds = costs.transfer;
  timeline.idealBubble = bubbleFraction(mapping, config.kind);
  return timeline;
}

double StepTimeline::busySeconds(int64_t stage) const {
  double busy = 0;
  for (const TimedOp &timed : stages[size_t(stage)])
    if (timed.op.isCompute())
      busy += timed.end - timed.start;
  return busy;
}

double StepTimeline::simulatedBubble() const {
  double busiest = 0;
  for (int64_t stage = 0; stage < int64_t(stages.size()); ++stage)
    busiest = std::max(busiest, busySeconds(stage));
  return busiest > 0 ? makespan / busiest - 1 : 0;
}

} // namespace parc
