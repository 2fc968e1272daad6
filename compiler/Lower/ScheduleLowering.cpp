//===- ScheduleLowering.cpp - One rank's instruction list of a step -------===//
//
// The stage's pipeline program (Schedule.cpp) becomes the rank's schedule: computes and
// transfers keep their order, so the transfers stay batched as Megatron batches them, and a
// transfer's peer becomes the global rank of that stage in this rank's pp group. Around them:
// load_batch before the forward that reads the batch, ZeRO's collectives as the policy
// (ZeroPolicy.h) places them, and after the last backward the gradient reductions and the
// optimizer step.
//
// ZeRO works on buckets of whole sub-layers. Zero 3 gathers each bucket of a chunk within its
// computes once per run of their ops that read it (plan::readRuns), just before the run, and
// releases it after the run; zero 2 and 3 reduce-scatter each bucket within every backward,
// after the last op that writes its gradients; zero 1 reduce-scatters every bucket once, after
// the last backward.
//
// The step-end reductions run tp, then embedding, then dp. The tied embedding is a bucket of
// its own on the first and the last stage, so both copies are partitioned alike: its two
// owned shards are summed whether the dp reduction came first (zero 2, 3) or comes after.
//
//===----------------------------------------------------------------------===//
#include "LowerInternal.h"

#include "llvm/ADT/STLExtras.h"

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

namespace {
/// MemoryModel's two state families: the dense parameters, reduced and ZeRO-sharded over the
/// gradient group, and the experts, over the expert-data-parallel group (the same group
/// without expert parallelism). An averaging reduction over expert_dp divides by dp x cp
/// (plan::averagingDivisor): each expert's gradient already sums its ep group's tokens.
struct StateFamilies {
  ZeroPolicy policy[2];
  plan::Group group[2];

  explicit StateFamilies(const Job &job)
      : policy{zeroPolicy(job.program.parallel, job.gradRanks),
               zeroPolicy(job.program.parallel, job.mapping.expertDp())},
        group{job.gradGroup, job.ep > 1 ? plan::Group::ExpertDP : job.gradGroup} {}
};

/// One ZeRO bucket: its parameters and the group it is partitioned over.
struct BucketList {
  std::vector<std::string> params;
  plan::Group group;
};

/// The parameter lists of a chunk's ZeRO buckets, in the order the backward finishes them:
/// the dense units' buckets, then the experts' (each family bucketed on its own).
std::vector<BucketList> bucketLists(const StateFamilies &families,
                                    const std::vector<LoweredUnit> &units) {
  std::vector<BucketList> lists;
  for (bool experts : {false, true}) {
    std::vector<const LoweredUnit *> family;
    std::vector<ParamUnit> counts;
    for (const LoweredUnit &unit : units)
      if ((unit.unit.kind == ParamUnitKind::Experts) == experts) {
        family.push_back(&unit);
        counts.push_back(unit.unit);
      }
    for (const ZeroBucket &bucket : families.policy[experts].buckets(counts)) {
      BucketList &list = lists.emplace_back(BucketList{{}, families.group[experts]});
      for (size_t u = bucket.first; u < bucket.end; ++u)
        list.params.insert(list.params.end(), family[u]->params.begin(), family[u]->params.end());
    }
  }
  return lists;
}

/// With expert parallelism the experts' gradients, whole on every rank of a family that ZeRO
/// does not partition, are all-reduced over expert_dp and divided by dp x cp, even over an
/// expert_dp of one rank: the other ranks' tokens reached them through the all-to-all.
std::vector<plan::Instr> expertReductions(const Job &job, const StateFamilies &families,
                                          const std::vector<std::vector<std::string>> &params) {
  if (job.ep == 1 || families.policy[1].partitioned())
    return {};
  std::vector<std::string> experts;
  for (const std::vector<std::string> &chunk : params)
    for (const std::string &name : chunk)
      if (isExpertParam(name))
        experts.push_back(name);
  if (experts.empty())
    return {};
  return {plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads, plan::Group::ExpertDP,
                                      /*average=*/true, std::move(experts))};
}

} // namespace

std::vector<plan::Instr> lowerSchedule(const ScheduleInputs &in) {
  const Job &job = *in.job;
  const StateFamilies families(job);
  const ZeroPolicy &policy = families.policy[0];
  std::vector<std::vector<BucketList>> buckets;
  for (const std::vector<LoweredUnit> *units : in.chunkUnits)
    buckets.push_back(bucketLists(families, *units));
  const bool aroundUse = policy.gathersWeightsAroundUse();
  const bool perMicrobatch = policy.gradReduction() == GradReduction::ReduceScatterPerMicrobatch;
  std::vector<plan::Instr> out;
  out.reserve(in.program->size() * (aroundUse ? 3 : perMicrobatch ? 2 : 1) +
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
    const std::vector<BucketList> &chunkBuckets = buckets[size_t(op.chunk)];
    const plan::Chunk &chunk = *in.chunks[size_t(op.chunk)];
    // ZeRO-3 gathers a bucket once per run of the compute's ops that read it (the embedding's
    // backward, say, reads no weight).
    std::vector<std::vector<plan::OpRun>> runs(chunkBuckets.size());
    if (aroundUse) {
      std::vector<plan::GatheredList> lists;
      for (const BucketList &bucket : chunkBuckets)
        lists.push_back({&bucket.params, bucket.group});
      runs = plan::readRuns(forward ? chunk.forward : chunk.backward, lists);
    }
    for (size_t b = 0; b < chunkBuckets.size(); ++b)
      for (size_t r = 0; r < runs[b].size(); ++r)
        out.push_back(plan::Instr::allGatherParams(chunkBuckets[b].group, chunkBuckets[b].params,
                                                   /*within=*/true));
    out.push_back(plan::Instr::compute(
        forward ? plan::InstrKind::Forward : plan::InstrKind::Backward, op.chunk, op.microbatch));
    for (size_t b = 0; b < chunkBuckets.size(); ++b) {
      const BucketList &bucket = chunkBuckets[b];
      for (size_t r = 0; r < runs[b].size(); ++r)
        out.push_back(plan::Instr::releaseParams(bucket.params, /*within=*/true));
      if (perMicrobatch && !forward)
        out.push_back(plan::Instr::gradCollective(plan::InstrKind::ReduceScatterGrads,
                                                  bucket.group, /*average=*/true, bucket.params,
                                                  /*within=*/true));
    }
  }

  // After the per-microbatch reduce-scatters (zero 2, 3) these sum the owned shards.
  if (!in.tpPartialGrads.empty())
    out.push_back(plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads, plan::Group::TP,
                                              /*average=*/false, in.tpPartialGrads));
  if (in.inEmbeddingGroup)
    out.push_back(plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads,
                                              plan::Group::Embedding, /*average=*/false,
                                              {WordEmbedding.str()}));
  if (policy.gradReduction() == GradReduction::AllReducePerStep) {
    std::vector<std::string> all;
    for (const std::vector<std::string> &params : in.chunkParams)
      for (const std::string &name : params)
        if (job.ep == 1 || !isExpertParam(name))
          all.push_back(name);
    out.push_back(plan::Instr::gradCollective(plan::InstrKind::AllReduceGrads, job.gradGroup,
                                              /*average=*/true, std::move(all)));
  }
  if (policy.gradReduction() == GradReduction::ReduceScatterPerStep)
    for (const std::vector<BucketList> &chunkBuckets : buckets)
      for (const BucketList &bucket : chunkBuckets)
        out.push_back(plan::Instr::gradCollective(plan::InstrKind::ReduceScatterGrads,
                                                  bucket.group, /*average=*/true, bucket.params));
  for (plan::Instr &instr : expertReductions(job, families, in.chunkParams))
    out.push_back(std::move(instr));
  // The squared gradient norm: partitioned, the owned shards summed over the gradient group
  // (which holds the ep and expert_dp groups); whole, the model replica's shards, and with
  // expert parallelism the other ep members' experts (their dense shards count on ep rank 0,
  // placeOnExpertRank).
  out.push_back(policy.partitioned()
                    ? plan::Instr::optimizerStep({plan::Group::Model, job.gradGroup})
                : job.ep > 1 ? plan::Instr::optimizerStep({plan::Group::Model, plan::Group::EP})
                             : plan::Instr::optimizerStep({plan::Group::Model}));
  if (policy.gathersWeightsAfterStep())
    for (const std::vector<BucketList> &chunkBuckets : buckets)
      for (const BucketList &bucket : chunkBuckets)
        out.push_back(plan::Instr::allGatherParams(bucket.group, bucket.params));
  return out;
}

} // namespace parc::lower
