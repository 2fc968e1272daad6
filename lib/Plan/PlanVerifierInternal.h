//===- PlanVerifierInternal.h - Checks shared by the plan verifier files --===//
//
// Internal to lib/Plan. Every check records its first failure in a ReadContext, naming the
// field by its JSON path, so that verifier messages read like reader messages.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LIB_PLAN_PLANVERIFIERINTERNAL_H
#define PARC_LIB_PLAN_PLANVERIFIERINTERNAL_H

#include "parc/Plan/JSONReader.h"
#include "parc/Plan/Plan.h"
#include "parc/Support/RankGrid.h"

#include "llvm/ADT/STLFunctionalExtras.h"

namespace parc::plan::detail {

/// The rank layout of parallel.order (fastest-varying axis first), Megatron-Core's: with
/// tp-cp-dp-pp, rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
RankGrid gridOf(const ParallelSummary &p);
Coords coordsOf(const ParallelSummary &p, int64_t rank);
/// The groups `rank` has under that layout; the embedding group is empty unless the rank is a
/// member (first or last stage with a tied head and pp > 1).
Groups expectedGroups(const ParallelSummary &p, const ModelSummary &m, int64_t rank);

bool checkPlanId(ReadContext &ctx, const std::string &planId);
/// Summaries shared by rank plans and manifests. On success the layout functions above are
/// safe to call (sizes positive, order a permutation of tp, dp, pp).
bool checkJob(ReadContext &ctx, int64_t world, const ModelSummary &model,
              const ClusterSummary &cluster, const ParallelSummary &p, const TrainSettings &train);
/// rank, node, local_rank and coords of one rank; `path` prefixes the field names.
bool checkPlacement(ReadContext &ctx, const std::string &path, int64_t rank, int64_t node,
                    int64_t localRank, const Coords &coords, int64_t world,
                    const ClusterSummary &cluster, const ParallelSummary &p);

/// Operand counts and attributes of `op` against opInfo(op.kind): what the reader ensures for
/// plans it read, checked again for plans built in memory.
bool checkOpSignature(ReadContext &ctx, const Op &op, llvm::function_ref<std::string()> opPath);

/// The most elements a tensor or parameter shard may hold: 2^48, so that its size in bytes
/// at any element type fits 64 bits with room to spare.
inline constexpr int64_t MaxTensorElements = int64_t(1) << 48;
/// "[64, 2, 128]".
std::string shapeText(llvm::ArrayRef<int64_t> shape);
/// The number of elements of `shape`; nothing when a dimension is negative or the count
/// exceeds MaxTensorElements.
std::optional<int64_t> elementCount(llvm::ArrayRef<int64_t> shape);

/// An operand as the shape rules see it: its name and its shape (a parameter's or a
/// parameter gradient's is the shard's local shape).
struct OperandShape {
  llvm::StringRef name;
  llvm::ArrayRef<int64_t> shape;
};
/// The shapes `op`'s kind requires of its operands (PlanShapes.cpp). Needs the signature
/// and the attributes checked.
void checkOpShapes(ReadContext &ctx, const RankPlan &plan, const Op &op,
                   llvm::ArrayRef<OperandShape> inputs, llvm::ArrayRef<OperandShape> outputs,
                   llvm::function_ref<std::string()> opPath);

/// The tensor tables and op lists of every chunk (PlanDataflow.cpp). Needs valid params and
/// chunk layout.
void checkDataflow(ReadContext &ctx, const RankPlan &plan);
/// The step schedule (PlanSchedule.cpp). Needs valid params, chunks and groups.
void checkSchedule(ReadContext &ctx, const RankPlan &plan);

} // namespace parc::plan::detail

#endif
