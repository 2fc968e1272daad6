//===- DataParallelWork.cpp - Gradient sync, ZeRO traffic, optimizer ------===//
//
// What each ZeRO stage sends over the data-parallel group (Rajbhandari et al. 2020, section
// 7; DeepSpeed's and Megatron's implementations):
//   zero 0  all-reduce of the gradients once per step;
//   zero 1  reduce-scatter of the gradients once per step, all-gather of the updated weights
//           (Megatron's distributed optimizer);
//   zero 2  reduce-scatter of each microbatch's gradients in its backward (the gradients are
//           kept sharded), all-gather of the updated weights once per step;
//   zero 3  all-gather of each bucket for every run of a pass's ops that read it (before the
//           forward's and the backward's use, and again for a full recompute's where another
//           bucket's use comes between; ZeroPolicy.h), reduce-scatter of each microbatch's
//           gradients; prefetched one layer ahead, so only what the pass's compute cannot
//           cover shows, plus the first layer's gather.
// Gradients travel in train.grad_dtype, weights in the model's dtype.
//
// ZeRO 3's traffic is charged at each GPU's own adapter share, not at the rings over all the
// adapters a node's GPUs own together that a single large collective reaches (CommModel.h).
// This is measured, not derived: DeepSpeed's ZeRO-3 runs of Narayanan et al. 2021 (Table 2)
// take the same step time when the GPUs double at a fixed global batch (66.75 s on 768 and
// 1536 A100s for 175B, 180 s and 184 s on 1120 and 2240 for 530B), so their step is bound by a
// per-GPU byte volume that does not shrink with the world. Counted as parc's plan moves them
// (a full recompute regathers each attention half, the gradients reduce-scatter in bf16 as
// DeepSpeed's stage 3 does), 175B sends 1.05 TB per GPU per step, which in 66.75 s is 16 GB/s
// and 530B's 3.2 TB in 184 s is 18 GB/s: about 70 % of one HDR adapter's 25 GB/s, where
// NCCL's rings over a DGX A100's 8 adapters reach about 180 GB/s. The same runs show what the
// overlap costs: at the same traffic per GPU (one microbatch a step), 175B's step grows by
// 14.8 s from micro-batch 1 on 1536 GPUs to micro-batch 4 on 384, for 39.7 s more compute, so
// 37 % of the compute beside the gathers shows (530B: 71.8 s for 115 s, 62 %), where parc's
// other overlaps charge 15 % (CommModel::kOverlapSlowdown). With that share
// (kGatherOverlapSlowdown) the rate that fits the rows is 80 % of the adapter
// (kOwnRailEfficiency). Whatever serialises the gathers (one module's parameters at a time over
// a communicator of every GPU), these are what those runs show (docs/memory-and-cost.md).
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/GPUModel.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Cost/StageWork.h"
#include "parc/Cost/ZeroPolicy.h"

#include <algorithm>

namespace parc {

namespace {
/// The part of a pass's per-layer traffic (`comm` for all its layers) that the pass's
/// `compute` cannot hide when each layer's collectives are prefetched behind the previous
/// layer's compute: the excess, the first layer's, which nothing precedes, and the share
/// `slowdown` of the compute it overlaps.
double prefetched(double comm, double compute, double layers,
                  double slowdown = CommModel::kOverlapSlowdown) {
  if (comm <= 0)
    return 0;
  return CommModel::exposedBeside(comm, compute, slowdown) + comm / std::max(1.0, layers);
}

/// `count` collectives of bytes / count each (one per layer, or per gathered run).
double inCollectives(double (CommModel::*op)(double, const GroupGeometry &) const,
                     const CommModel &comm, double bytes, const GroupGeometry &group,
                     double count) {
  double n = std::max(1.0, count);
  return n * (comm.*op)(bytes / n, group);
}
/// The dense and the expert families' groups, as ZeRO 3 reaches them (each GPU's own rail).
struct FamilyRails {
  GroupGeometry dense, experts;
};

/// ZeRO 3's traffic around use in virtual stage `v`'s passes: the gathers the lowering makes
/// (one per run of reads of a bucket, ZeroPolicy.h) and the backward's reduce-scatters
/// (`scatter` seconds), prefetched behind each pass's compute.
void addGathersAroundUse(const Program &program, const Mapping &mapping, const CommModel &comm,
                         const FamilyRails &rails, int64_t v, double scatter,
                         VirtualStageWork &w) {
  const ParallelSpec &par = program.parallel;
  const ModelSpec &model = program.model;
  const ZeroPolicy policy = zeroPolicy(par, mapping.gradientRanks());
  const ZeroPolicy expertPolicy = zeroPolicy(par, mapping.expertDp());
  const std::vector<ParamUnit> units = virtualStageUnits(model, mapping, v);
  const std::vector<ParamUnit> expertList = expertUnits(model, mapping, v);
  const ChunkGathers chunk = gathersAroundUse(
      model,
      {policy, units, expertPolicy, expertList, mapping.ep == 1,
       headReadsWordEmbedding(model, mapping)},
      par.recompute == Recompute::Full);
  const double weightBytes = double(bytesPerElement(model.dtype));
  auto seconds = [&](const PassGathers &dense, const PassGathers &experts) {
    return inCollectives(&CommModel::allGather, comm, dense.elements * weightBytes, rails.dense,
                         double(dense.collectives)) +
           inCollectives(&CommModel::allGather, comm, experts.elements * weightBytes,
                         rails.experts, double(experts.collectives));
  };
  const double layers = double(w.lastBlock - w.firstBlock);
  w.forward.zero = prefetched(seconds(chunk.dense.forward, chunk.experts.forward),
                              w.forward.compute(), layers, CommModel::kGatherOverlapSlowdown);
  w.backward.zero = prefetched(seconds(chunk.dense.backward, chunk.experts.backward) + scatter,
                               w.backward.compute() + w.recompute.compute(), layers,
                               CommModel::kGatherOverlapSlowdown);
}
} // namespace

void addDataParallelWork(const Program &program, const Mapping &mapping, const CommModel &comm,
                         WorkTable &table) {
  const ParallelSpec &par = program.parallel;
  const ModelSpec &model = program.model;
  const ZeroPolicy policy = zeroPolicy(par, mapping.gradientRanks()); // ZeroPolicy.h decides what moves
  const double weightBytes = double(bytesPerElement(model.dtype));
  const double gradBytes = double(bytesPerElement(program.train.gradDtype));
  // Dense parameters synchronise over dp, experts over the ranks holding the same experts;
  // ZeRO 3's traffic around use over each GPU's own rail (see above).
  GroupGeometry dpRail = table.dp, edpRail = table.expertDp;
  dpRail.ownRailOnly = edpRail.ownRailOnly = true;
  auto both = [&](double (CommModel::*op)(double, const GroupGeometry &) const, double params,
                  double experts, double bytesPer, double layers, bool ownRail = false) {
    return inCollectives(op, comm, (params - experts) * bytesPer, ownRail ? dpRail : table.dp,
                         layers) +
           inCollectives(op, comm, experts * bytesPer, ownRail ? edpRail : table.expertDp,
                         layers);
  };

  for (int64_t v = 0; v < mapping.pp * mapping.chunks; ++v) {
    VirtualStageWork &w = table.virtualStages[size_t(v)];
    const double layers = double(w.lastBlock - w.firstBlock);
    if (policy.gathersWeightsAroundUse()) {
      const double scatter =
          both(&CommModel::reduceScatter, w.params, w.expertParams, gradBytes, layers, true);
      addGathersAroundUse(program, mapping, comm, {dpRail, edpRail}, v, scatter, w);
    } else if (policy.gradReduction() == GradReduction::ReduceScatterPerMicrobatch) {
      const double scatter =
          both(&CommModel::reduceScatter, w.params, w.expertParams, gradBytes, layers);
      w.backward.zero = par.overlapGradReduce
                            ? prefetched(scatter, w.backward.compute(), layers)
                            : scatter;
    }
  }

  const int64_t pp = mapping.pp;
  const GPUModel gpu(program.cluster, model.dtype);
  const double optimizerBytes = optimizerBytesPerParam(program);
  table.stages.assign(size_t(pp), {});
  for (int64_t s = 0; s < pp; ++s) {
    StageWork &stage = table.stages[size_t(s)];
    table.forEachChunk(s, [&](const VirtualStageWork &w) {
      stage.params += w.params;
      stage.expertParams += w.expertParams;
    });
    auto once = [&](double (CommModel::*op)(double, const GroupGeometry &) const,
                    double bytesPer) {
      return both(op, stage.params, stage.expertParams, bytesPer, 1);
    };
    if (policy.gradReduction() == GradReduction::AllReducePerStep)
      stage.gradSync = once(&CommModel::allReduce, gradBytes);
    else if (policy.gradReduction() == GradReduction::ReduceScatterPerStep)
      stage.gradSync = once(&CommModel::reduceScatter, gradBytes);
    if (policy.gathersWeightsAfterStep())
      stage.paramGather = once(&CommModel::allGather, weightBytes);
    const double dense = stage.params - stage.expertParams;
    const double shard = policy.shardsOptimizer()
                             ? dense / double(policy.dp) + stage.expertParams /
                                                               double(mapping.expertDp())
                             : stage.params;
    stage.optimizer = gpu.memorySeconds(optimizerBytes * shard, 4);
    const bool embeddingStage = s == 0 || s == pp - 1;
    if (model.tiedHead() && pp > 1 && embeddingStage) {
      double embedding = double(headParams(model, mapping.paddedVocab).perRank(mapping.tp));
      GroupGeometry pair = geometryOf(2, 1, table.pp.crossesNodes(), 1);
      stage.embeddingSync = comm.allReduce(embedding * gradBytes, pair);
    }
  }
}

} // namespace parc
