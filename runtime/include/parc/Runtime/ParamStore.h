//===- ParamStore.h - A rank's parameter shards, gradients and ZeRO state -===//
//
// One entry per `params` shard of the rank plan: its values (initialised with Init.h from
// seed, name and global index), its gradient (accumulated by the backward lists, cleared by
// the optimizer step) and its optimizer state.
//
// ZeRO partitions come from the schedule: the params list of a reduce_scatter_grads,
// all_gather_params or release_params instruction is flattened in list order, zero-padded to a
// multiple of the group size g, and member i of the group owns elements [i*n'/g, (i+1)*n'/g).
// A partition's whole weights live in one padded buffer in that order, so its all_gather_params
// runs in place. A partition named by a release_params (ZeRO-3) keeps only its owned elements,
// in a buffer of their own; the whole buffer exists from an all_gather_params to the next
// release_params. A partitioned shard's optimizer state covers only its owned range.
//
// Gradients of shards outside every partition are one contiguous buffer (Megatron's contiguous
// grad buffer), in plan order, so that the data-parallel all-reduce of adjacent shards runs in
// place; they are held whole for the whole run, accumulate over the microbatches and are
// cleared by the optimizer step. A partition's whole gradient is allocated by the first op of
// a step that writes one of its shards and released by its reduce_scatter_grads, which reduces
// it in place and adds this member's part to the partition's owned gradient; that exists from
// the first reduce_scatter_grads of a step to the optimizer step. So the schedule decides what
// is held: one reduce-scatter after the last backward (ZeRO-1) keeps whole gradients through
// the step, one after every backward (ZeRO-2) only the buckets being written.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_PARAMSTORE_H
#define PARC_RUNTIME_PARAMSTORE_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/CpuDevice.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <vector>

namespace parc::runtime {

/// D is the rank's device (CpuDevice.h), which holds every buffer and moves every value.
template <typename D> class ParamStore {
public:
  using T = typename D::Value;
  using Grad = typename D::Grad; // T, or wider under mixed precision
  using OptState = typename D::OptState;

  struct Param {
    const plan::ParamShard *shard = nullptr;
    std::vector<int64_t> localShape;
    int64_t numel = 0;
    /// The whole shard: in `storage`, or in its partition's buffer; null while ZeRO-3 has
    /// released it.
    T *value = nullptr;
    /// The whole shard's gradient: in the contiguous buffer, or in its partition's while that
    /// is allocated (null otherwise).
    Grad *grad = nullptr;
    Buffer<T> storage;      // an unpartitioned shard's values
    int64_t partition = -1; // index into partitions(), -1 when not partitioned
    int64_t flatOffset = 0; // first element of this shard in the partition's flat vector
    /// The local elements this rank updates: all of them unless partitioned.
    int64_t ownedBegin = 0, ownedEnd = 0;
    Buffer<OptState> moment1, moment2; // Adam's m and v, or SGD's momentum in moment1
    Buffer<OptState> master;           // the owned weights in OptState, if D keeps them

    bool released() const { return value == nullptr; }
    int64_t ownedCount() const { return ownedEnd - ownedBegin; }
  };

  struct Partition {
    std::vector<size_t> params; // indices into all(), in list order
    std::vector<int64_t> group;
    int64_t position = 0;  // this rank's index in `group`
    int64_t elements = 0;  // n, before padding
    int64_t perMember = 0; // n' / g
    bool zero3 = false;    // some release_params names it
    Buffer<T> weights;     // the n' gathered values; ZeRO-3 frees it outside its computes
    Buffer<T> owned;       // ZeRO-3: this member's perMember values, always held
    Buffer<Grad> grads;    // the n' whole gradients, from their first write to the reduction
    Buffer<Grad> ownedGrads; // this member's reduced perMember gradients, until the update

    int64_t ownedLo() const { return position * perMember; }
    int64_t ownedHi() const { return ownedLo() + perMember; }
    int64_t padded() const { return perMember * int64_t(group.size()); }
  };

  ParamStore(const plan::RankPlan &plan, D &device);

  /// Derives the ZeRO partitions from the schedule; fails when two instructions partition a
  /// parameter differently.
  llvm::Error buildPartitions();
  /// Fills every shard from (seed, name, global index) and allocates the unpartitioned
  /// gradients. ZeRO-3 partitions start released, as they are between steps.
  void initialize(uint64_t seed);

  std::vector<Param> &all() { return params; }
  const std::vector<Param> &all() const { return params; }
  const std::vector<Partition> &partitions() const { return parts; }
  std::vector<Partition> &partitions() { return parts; }
  Param *find(llvm::StringRef name);
  /// The parameter whose gradient is called `gradName` ("x.grad" -> x), or null.
  Param *gradOwner(llvm::StringRef gradName);
  /// Where an op writes `param`'s whole gradient: allocates its partition's on first use.
  Grad *writableGrad(Param &param);

  // The schedule's parameter and gradient collectives.
  void allReduceGrads(Communicator &comm, const plan::Instr &instr);
  void reduceScatterGrads(Communicator &comm, const plan::Instr &instr);
  void allGatherParams(Communicator &comm, const plan::Instr &instr);
  void releaseParams(const plan::Instr &instr);
  /// Gathers every released partition so that every shard is whole (before dumping weights).
  void gatherAll(Communicator &comm);
  /// After the update (or a skipped step): zero the held gradients, release the owned ones.
  void clearGrads();

  /// Where the optimizer updates the owned range: in the shard, or in the owned buffer of a
  /// released partition.
  T *ownedWeights(Param &param);
  /// The gradient of the owned range (what the optimizer reads); null when nothing wrote it.
  Grad *ownedGrad(Param &param);
  /// A zeroed buffer counted as optimizer state.
  Buffer<OptState> optimizerBuffer(size_t count) {
    return Buffer<OptState>(memory, MemoryCategory::Optimizer, count);
  }
  D &device() { return dev; }

private:
  /// Init.h's values of `param`'s shard, with the vocabulary's padding rows zero.
  void initShard(T *values, uint64_t seed, const Param &param);
  std::vector<size_t> resolve(const plan::Instr &instr) const;
  Partition &partitionOf(const plan::Instr &instr);
  void gather(Communicator &comm, Partition &partition);
  void release(Partition &partition);
  void pointInto(Partition &partition);
  void pointGradsInto(Partition &partition);
  /// The part of `param`'s gradient this rank holds now: the whole shard before its
  /// partition's reduce-scatter, the owned range after it.
  std::pair<Grad *, int64_t> heldGrad(Param &param);

  const plan::RankPlan &plan;
  D &dev;
  MemoryTracker &memory;
  std::vector<Param> params;
  llvm::StringMap<size_t> byName;
  std::vector<Partition> parts;
  Buffer<Grad> gradStorage; // the unpartitioned shards' gradients
};

extern template class ParamStore<CpuDevice<float>>;
extern template class ParamStore<CpuDevice<double>>;

} // namespace parc::runtime

#endif
