//===- StageWork.h - What each pipeline stage does in one step ------------===//
//
// The one table of per-stage work that the step-time model, the timeline and the search read:
// for every virtual stage, the time of one microbatch's forward, backward and recomputation on
// one rank (GEMMs, attention, memory-bound kernels, the exposed tensor-parallel collectives and
// the per-microbatch ZeRO traffic), its FLOPs and parameters; for every pipeline stage, its
// gradient synchronisation, optimizer step and parameter gather; the pipeline message.
// Built once per mapping from the model's ops in the order the lowering emits them
// (docs/memory-and-cost.md, "Step time", lists them with their shapes).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_STAGEWORK_H
#define PARC_COST_STAGEWORK_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/CommModel.h"
#include "parc/Sema/Program.h"

#include <vector>

namespace parc {

/// One pass (a forward, a backward or a recomputed forward) of one microbatch on one rank.
struct PassTime {
  double gemm = 0, attention = 0, memory = 0; // kernel time by class
  double tp = 0;                              // tensor-parallel collectives not hidden
  double zero = 0; // ZeRO-2/3 traffic of the pass not hidden behind its compute
  double cp = 0;   // ring attention's key/value exchange not hidden behind its blocks
  double ep = 0;   // the expert-parallel all-to-alls (token dispatch and combine)

  double compute() const { return gemm + attention + memory; }
  double total() const { return compute() + tp + zero + cp + ep; }
  PassTime &operator+=(const PassTime &o);
  PassTime scaled(double k) const;
};

struct VirtualStageWork {
  int64_t firstBlock = 0, lastBlock = 0; // [first, last) transformer blocks
  PassTime forward, backward, recompute;
  double params = 0;        // parameters one rank holds, before ZeRO sharding
  double expertParams = 0;  // of which experts: synchronised over expert dp, not dp
  double modelFlops = 0;    // one microbatch, one rank: forward + backward, no recompute
  double hardwareFlops = 0; // plus recomputation and the vocab padding

  double forwardSeconds() const { return forward.total(); }
  /// The backward of one microbatch, including the forward it recomputes first.
  double backwardSeconds() const { return recompute.total() + backward.total(); }
};

/// Per step, on every rank of one pipeline stage.
struct StageWork {
  double params = 0;      // parameters one rank holds, before ZeRO sharding
  double expertParams = 0; // of which experts
  double gradSync = 0;    // the data-parallel gradient all-reduce or reduce-scatter
  double paramGather = 0; // the all-gather of updated parameters (ZeRO-1 and 2)
  double embeddingSync = 0; // the tied embedding's gradient all-reduce (first and last stage)
  double optimizer = 0;   // the norm, clipping and update over the rank's shard
};

struct WorkTable {
  std::vector<VirtualStageWork> virtualStages; // indexed chunk * pp + stage
  std::vector<StageWork> stages;               // indexed by pipeline stage
  int64_t stageCount = 1; // pp
  double messageBytes = 0;    // one pipeline send: a microbatch's activations, 1/tp slice
  double transferSeconds = 0; // its time over the pp group's link; 0 when pp = 1
  GroupGeometry tp, dp, pp, cp; // dp: the gradients' group, dp x cp
  GroupGeometry ep, expertDp;   // the expert-parallel and expert-data-parallel groups

  /// The virtual stages of pipeline stage `s`, one per chunk.
  std::vector<const VirtualStageWork *> chunksOf(int64_t stage) const;
  /// Calls `f` with each of them, without building the list.
  template <typename F> void forEachChunk(int64_t stage, F f) const {
    for (size_t v = size_t(stage); v < virtualStages.size(); v += size_t(stageCount))
      f(virtualStages[v]);
  }
};

/// The work of every stage of `program` under `mapping` (as built by checkMapping).
WorkTable buildWorkTable(const Program &program, const Mapping &mapping);

/// The data-parallel part of the table: ZeRO-2/3 traffic per microbatch in the passes, and
/// per stage the gradient synchronisation, parameter gather, tied-embedding sync and
/// optimizer step (DataParallelWork.cpp).
void addDataParallelWork(const Program &program, const Mapping &mapping, const CommModel &comm,
                         WorkTable &table);

/// Bytes the optimizer step reads and writes per parameter of the rank's shard: the gradient
/// norm, its clipping, the update of master weights and moments, the copy to the model dtype.
double optimizerBytesPerParam(const Program &program);

} // namespace parc

#endif
