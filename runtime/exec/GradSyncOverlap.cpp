//===- GradSyncOverlap.cpp - Buckets of final gradients, reduced early -----===//

#include "parc/Runtime/GradSyncOverlap.h"

#include "Devices.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>

namespace parc::runtime {

namespace {
/// Keeps a communicator overlapping for one call, also when the call throws.
class OverlappingCall {
public:
  explicit OverlappingCall(Communicator &comm) : comm(comm) { comm.setOverlapping(true); }
  ~OverlappingCall() { comm.setOverlapping(false); }
  OverlappingCall(const OverlappingCall &) = delete;
  OverlappingCall &operator=(const OverlappingCall &) = delete;

private:
  Communicator &comm;
};
} // namespace

template <typename D>
GradSyncOverlap<D>::GradSyncOverlap(const plan::RankPlan &plan, ParamStore<D> &params,
                                    int64_t bucketBytes)
    : params(params), bucketBytes(bucketBytes) {
  if (bucketBytes <= 0)
    return;
  // Per chunk: the last op of its backward list that writes each parameter gradient.
  std::vector<llvm::StringMap<size_t>> lastWrite(plan.chunks.size());
  for (size_t c = 0; c < plan.chunks.size(); ++c)
    for (size_t i = 0; i < plan.chunks[c].backward.size(); ++i)
      for (const std::string &output : plan.chunks[c].backward[i].outputs)
        if (params.gradOwner(output))
          lastWrite[c][output] = i;

  for (size_t s = 0; s < plan.schedule.size(); ++s) {
    const plan::Instr &instr = plan.schedule[s];
    if (instr.op != plan::InstrKind::AllReduceGrads || instr.group != plan::Group::DP ||
        instr.params.empty())
      continue;
    Sync sync;
    sync.instr = s;
    sync.group = &plan.groups.get(instr.group);
    sync.average = instr.average;
    bool adjacent = true;
    sync.offsets.push_back(0);
    for (size_t k = 0; k < instr.params.size() && adjacent; ++k) {
      typename ParamStore<D>::Param *param = params.find(instr.params[k]);
      if (!param) {
        adjacent = false; // the ParamStore reports it when the instruction runs
        break;
      }
      if (k == 0)
        sync.flat = param->grad;
      else if (param->grad != sync.flat + sync.offsets.back())
        adjacent = false;
      sync.offsets.push_back(sync.offsets.back() + param->numel);

      std::string grad = plan::gradName(instr.params[k]);
      Point final{s, 0};
      for (size_t b = s; b-- > 0;) {
        const plan::Instr &writer = plan.schedule[b];
        if (writer.op != plan::InstrKind::Backward || writer.chunk < 0 ||
            size_t(writer.chunk) >= lastWrite.size())
          continue;
        auto op = lastWrite[size_t(writer.chunk)].find(grad);
        if (op == lastWrite[size_t(writer.chunk)].end())
          continue;
        final = {b, op->second};
        // Another instruction touching the parameter before the sync keeps it for the sync.
        for (size_t between = b + 1; between < s; ++between)
          if (llvm::is_contained(plan.schedule[between].params, instr.params[k]))
            final = {s, 0};
        break;
      }
      sync.finalAt.push_back(final);
    }
    if (adjacent && sync.flat) {
      sync.finalOrder = sync.finalAt;
      llvm::sort(sync.finalOrder);
      syncs.push_back(std::move(sync));
    }
  }
  beginStep();
}

template <typename D> void GradSyncOverlap<D>::beginStep() {
  for (Sync &sync : syncs) {
    sync.launched.assign(sync.finalAt.size(), false);
    sync.finalSeen = 0;
  }
  earlyLaunches = 0;
}

template <typename D>
void GradSyncOverlap<D>::launchRuns(Communicator &comm, Sync &sync, Point now, int64_t minBytes,
                                    bool overlapped) {
  size_t end = sync.finalAt.size();
  while (end > 0) {
    auto ready = [&](size_t k) { return !sync.launched[k] && sync.finalAt[k] <= now; };
    if (!ready(end - 1)) {
      --end;
      continue;
    }
    size_t begin = end - 1;
    while (begin > 0 && ready(begin - 1))
      --begin;
    int64_t first = sync.offsets[begin], count = sync.offsets[end] - first;
    if (count * int64_t(sizeof(typename D::Grad)) >= minBytes && count > 0) {
      std::fill(sync.launched.begin() + begin, sync.launched.begin() + end, true);
      if (overlapped) {
        OverlappingCall call(comm);
        comm.allReduce(*sync.group, sync.flat + first, size_t(count));
        ++earlyLaunches;
      } else {
        comm.allReduce(*sync.group, sync.flat + first, size_t(count));
      }
    }
    end = begin;
  }
}

template <typename D>
void GradSyncOverlap<D>::afterBackwardOp(Communicator &comm, size_t instr, size_t op) {
  Point now{instr, op};
  for (Sync &sync : syncs) {
    if (sync.instr <= instr)
      continue;
    // With no gradient final since the last look, no more are ready than then, and that
    // look launched every run of them that filled a bucket: there is nothing to launch.
    size_t seen = sync.finalSeen;
    while (seen < sync.finalOrder.size() && sync.finalOrder[seen] <= now)
      ++seen;
    if (seen == sync.finalSeen)
      continue;
    sync.finalSeen = seen;
    launchRuns(comm, sync, now, bucketBytes, /*overlapped=*/true);
  }
}

template <typename D> bool GradSyncOverlap<D>::finishSync(Communicator &comm, size_t instr) {
  auto sync = llvm::find_if(syncs, [&](const Sync &s) { return s.instr == instr; });
  if (sync == syncs.end())
    return false;
  launchRuns(comm, *sync, {instr, 0}, 0, /*overlapped=*/false);
  comm.joinOverlapped();
  if (sync->average)
    params.device().scale(sync->flat, sync->offsets.back(), 1.0 / double(sync->group->size()));
  return true;
}

#define INSTANTIATE(D) template class GradSyncOverlap<D>;
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
