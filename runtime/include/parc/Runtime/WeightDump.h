//===- WeightDump.h - parrun --dump-weights -------------------------------===//
//
// After the last step every rank's shards are gathered to rank 0 and assembled, by name and
// slice, into whole tensors, which rank 0 writes with the per-step losses and gradient norms:
//
//   {"format": "parrun-weights/1", "plan_id": "...", "precision": "fp64", "steps": 3,
//    "losses": [...], "grad_norms": [...], "max_replica_difference": 0,
//    "params": {"block.0.ln1.weight": {"shape": [128], "data": [...]}, ...}}
//
// max_replica_difference is the largest difference between two ranks' copies of one element
// (data-parallel replicas, tp-replicated shards, the tied embedding's two copies), which a
// correct run keeps at zero. Numbers are written with 17 significant digits, so doubles read
// back exactly. Every rank
// must call it (it communicates); only rank 0 writes.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_WEIGHTDUMP_H
#define PARC_RUNTIME_WEIGHTDUMP_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/Executor.h"
#include "parc/Runtime/ParamStore.h"

namespace parc::runtime {

/// `precision` names the element type in the file ("fp32", "bf16", ...); values are written
/// as the doubles they convert to.
template <typename D>
void dumpWeights(Communicator &comm, ParamStore<D> &params, const plan::RankPlan &plan,
                 const RankSummary &summary, llvm::StringRef precision, llvm::StringRef path);

} // namespace parc::runtime

#endif
