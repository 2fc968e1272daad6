//===- GradSyncOverlap.h - The data-parallel gradient sync during the backward -===//
//
// The plan puts each data-parallel all_reduce_grads after the last backward that writes its
// gradients. Waiting until then leaves the network idle during the backward and the GPU idle
// during the sync; Megatron-LM (overlap_grad_reduce) and llm.c start reducing a bucket of
// gradients as soon as the backward has written them for the last time in the step.
//
// Here, for every all_reduce_grads over the dp group whose parameters are adjacent in the
// gradient buffer (ZeRO-0's sync): each parameter's last write in the step is found in the
// plan (the last backward instruction before the sync whose op list writes its gradient, and
// the op there), and a parameter some other instruction between that write and the sync names
// (the tied embedding's own all-reduce) never starts early. After each backward op the runner
// looks for runs of adjacent parameters whose gradients are final and not yet reduced; a run
// of at least `bucketBytes` is all-reduced at once, overlapped with the backward that follows.
// The gradient buffer runs in plan order and the backward visits the model from its end, so
// the runs grow from the end of the list. At the instruction itself the remaining runs are
// all-reduced, the overlapped calls joined and the average applied.
//
// Results are bitwise those of the single all-reduce: a reduction is element-wise (the same
// left fold per element whatever the range), and the average is applied to the whole list
// once, after the join. Every member of a dp group runs the same op lists, so they launch the
// same buckets at the same points, in the same order relative to their other collectives.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_GRADSYNCOVERLAP_H
#define PARC_RUNTIME_GRADSYNCOVERLAP_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/ParamStore.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace parc::runtime {

template <typename D> class GradSyncOverlap {
public:
  /// bucketBytes 0 turns the overlap off: every sync runs at its instruction.
  GradSyncOverlap(const plan::RankPlan &plan, ParamStore<D> &params, int64_t bucketBytes);

  /// A new step: nothing launched yet.
  void beginStep();
  /// After op `op` of the backward at schedule[instr]: starts the buckets that became final.
  void afterBackwardOp(Communicator &comm, size_t instr, size_t op);
  /// At schedule[instr]: when it is a sync this handles, all-reduces what is left, joins and
  /// averages, and returns true; otherwise returns false and the caller runs the instruction.
  bool finishSync(Communicator &comm, size_t instr);

  /// The all-reduces started during the backward in the current step.
  int64_t earlyLaunchesThisStep() const { return earlyLaunches; }

private:
  using Point = std::pair<size_t, size_t>; // (schedule index, op index)

  struct Sync {
    size_t instr = 0;
    const std::vector<int64_t> *group = nullptr;
    bool average = false;
    typename D::Grad *flat = nullptr;  // the first member's gradient
    std::vector<int64_t> offsets;      // of each member in `flat`, and the total last
    std::vector<Point> finalAt;        // per member; the sync's own point when never early
    std::vector<char> launched;        // per member, this step
    std::vector<Point> finalOrder;     // finalAt, sorted
    size_t finalSeen = 0; // of finalOrder, the points at or before the last look this step
  };

  /// All-reduces the runs of adjacent members that are final at `now` and not yet launched:
  /// those of at least `minBytes`, overlapped, or all of them (at the sync).
  void launchRuns(Communicator &comm, Sync &sync, Point now, int64_t minBytes, bool overlapped);

  ParamStore<D> &params;
  std::vector<Sync> syncs;
  int64_t bucketBytes;
  int64_t earlyLaunches = 0;
};

extern template class GradSyncOverlap<CpuDevice<float>>;
extern template class GradSyncOverlap<CpuDevice<double>>;

} // namespace parc::runtime

#endif
