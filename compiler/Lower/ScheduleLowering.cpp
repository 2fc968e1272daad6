//===- ScheduleLowering.cpp - One rank's instruction list of a step -------===//
//
// The stage's pipeline program (Schedule.cpp) becomes the rank's schedule: computes and
// transfers keep their order, so the transfers stay batched as Megatron batches them, and a
// transfer's peer becomes the global rank of that stage in this rank's pp group. Around them:
// load_batch before the forward that reads the batch, ZeRO-3's parameter gathers around each
// compute, and after the last backward the gradient reductions and the optimizer step.
//
// The reductions run tp, then embedding, then dp. Summing the tied embedding's two copies
// must precede the dp reduce-scatter: after it a rank holds only its partition of each
// gradient, and the partitions of the first and last stage cover different parts of the
// embedding.
//
//===----------------------------------------------------------------------===//
#include "LowerInternal.h"

namespace parc::lower {

namespace {

plan::InstrKind transferKind(PipeOpKind kind) {
  switch (kind) {
  case PipeOpKind::SendActivation:
    return plan::InstrKind::SendAct;
  case PipeOpKind::RecvActivation:
    return plan::InstrKind::RecvAct;
  case PipeOpKind::SendGradient:
    return plan::InstrKind::SendGrad;
  case PipeOpKind::RecvGradient:
    return plan::InstrKind::RecvGrad;
  case PipeOpKind::Forward:
  case PipeOpKind::Backward:
    break;
  }
  return plan::InstrKind::Forward;
}

} // namespace

std::vector<plan::Instr> lowerSchedule(const ScheduleInputs &in) {
  const Job &job = *in.job;
  int zero = job.program.parallel.zero;
  // ZeRO with a single data-parallel rank has nothing to partition.
  bool partitioned = zero >= 1 && job.dp > 1;
  bool gatherAroundComputes = partitioned && zero == 3;
  std::vector<plan::Instr> out;
  out.reserve(in.program->size() * (gatherAroundComputes ? 3 : 1) +
              size_t(job.pipeline.microbatches) + 4 * in.chunkParams.size() + 4);

  for (const PipeOp &op : *in.program) {
    if (!op.isCompute()) {
      out.push_back(plan::Instr::transfer(transferKind(op.kind), (*in.ppGroup)[op.peer], op.chunk,
                                          op.microbatch));
      continue;
    }
    bool forward = op.kind == PipeOpKind::Forward;
    if (forward && op.chunk == in.batchChunk)
      out.push_back(plan::Instr::loadBatch(op.microbatch));
    const std::vector<std::string> &params = in.chunkParams[op.chunk];
    bool gather = gatherAroundComputes && !params.empty();
    if (gather)
      out.push_back(plan::Instr::allGatherParams(plan::Group::DP, params));
    out.push_back(plan::Instr::compute(
        forward ? plan::InstrKind::Forward : plan::InstrKind::Backward, op.chunk, op.microbatch));
    if (gather)
      out.push_back(plan::Instr::releaseParams(params));
  }

  if (!in.tpPartialGrads.empty())
    out.push_back(plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads, plan::Group::TP,
                                              /*average=*/false, in.tpPartialGrads));
  if (in.inEmbeddingGroup)
    out.push_back(plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads,
                                              plan::Group::Embedding, /*average=*/false,
                                              {WordEmbedding.str()}));
  if (job.dp > 1 && !partitioned) {
    std::vector<std::string> all;
    for (const std::vector<std::string> &params : in.chunkParams)
      all.insert(all.end(), params.begin(), params.end());
    out.push_back(plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads, plan::Group::DP,
                                              /*average=*/true, std::move(all)));
  }
  // Each chunk's parameters form one ZeRO partition, the unit ZeRO-3 gathers per compute.
  if (partitioned)
    for (const std::vector<std::string> &params : in.chunkParams)
      if (!params.empty())
        out.push_back(plan::Instr::gradCollective(plan::InstrKind::ReduceScatterGrads,
                                                  plan::Group::DP, /*average=*/true, params));
  out.push_back(partitioned ? plan::Instr::optimizerStep({plan::Group::Model, plan::Group::DP})
                            : plan::Instr::optimizerStep({plan::Group::Model}));
  if (partitioned && zero < 3)
    for (const std::vector<std::string> &params : in.chunkParams)
      if (!params.empty())
        out.push_back(plan::Instr::allGatherParams(plan::Group::DP, params));
  return out;
}

} // namespace parc::lower
