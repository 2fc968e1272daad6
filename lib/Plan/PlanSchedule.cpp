//===- PlanSchedule.cpp - The step schedule of one rank plan --------------===//
//
// The schedule is checked per rank: every (chunk, microbatch) runs forward and backward once
// and in that order, transfers go to the neighbouring virtual stages, collectives name
// parameters this rank owns. Whether the ranks' transfers pair up without a deadlock is the
// compiler's ScheduleVerifier's concern: it needs all stages at once.
//
//===----------------------------------------------------------------------===//

#include "PlanVerifierInternal.h"
#include "parc/Plan/PlanJSON.h"
#include "parc/Support/CheckedInt.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>

using llvm::StringRef;
using llvm::Twine;

namespace parc::plan::detail {

namespace {

class ScheduleChecker {
public:
  ScheduleChecker(ReadContext &ctx, const RankPlan &plan)
      : ctx(ctx), plan(plan), chunks(int64_t(plan.chunks.size())),
        microbatches(plan.parallel.microbatches), fwdAt(chunks * microbatches, -1),
        bwdAt(chunks * microbatches, -1), loadAt(microbatches, -1) {
    for (const ParamShard &param : plan.params)
      paramNames.insert(param.name);
    for (const Chunk &chunk : plan.chunks)
      needsBatch |= chunk.hasEmbedding || chunk.hasHead;
  }

  void run();

private:
  // Instructions are named by index and their paths built only for a message: a large plan
  // has many thousands of them.
  std::string pathOf(int64_t index) const { return indexPath("schedule", size_t(index)); }
  bool inRange(int64_t index, StringRef key, int64_t value, int64_t end, StringRef what);
  void checkCompute(const Instr &instr, int64_t index);
  void checkTransfer(const Instr &instr, int64_t index);
  void checkParamList(const Instr &instr, int64_t index);
  void checkWithin(const Instr &instr, int64_t index);
  void checkGatherRuns(const Instr &compute, int64_t index);
  void checkGroup(Group group, const std::string &path);
  std::string stepName(const Instr &instr) const {
    return "'" + spelling(instr.op).str() + "' of chunk " + std::to_string(instr.chunk) +
           " microbatch " + std::to_string(instr.microbatch);
  }

  ReadContext &ctx;
  const RankPlan &plan;
  int64_t chunks, microbatches;
  std::vector<int64_t> fwdAt, bwdAt, loadAt; // schedule index, -1 until seen
  int64_t optimizerAt = -1;
  bool needsBatch = false;
  llvm::StringSet<> paramNames;
  /// The ZeRO partition a parameter belongs to: the schedule index of the first collective
  /// that named it in a partition list.
  llvm::StringMap<int64_t> partitionOf;
};

bool ScheduleChecker::inRange(int64_t index, StringRef key, int64_t value, int64_t end,
                              StringRef what) {
  if (value >= 0 && value < end)
    return true;
  return ctx.fail(fieldPath(pathOf(index), key), Twine(value) + " is outside the " + Twine(end) +
                                                     " " + what + " (0 to " + Twine(end - 1) + ")");
}

/// The gathers within a compute of one list are placed one per run of its reads (Instr::within):
/// at most as many as its runs (one when nothing reads it), each released once.
void ScheduleChecker::checkGatherRuns(const Instr &compute, int64_t index) {
  const std::vector<Instr> &schedule = plan.schedule;
  WithinGathers within = gatheredWithin(schedule, size_t(index));
  if (within.lists.empty())
    return;
  std::vector<int64_t> releases(within.lists.size(), 0);
  for (size_t i = size_t(index) + 1; i < schedule.size() && schedule[i].within &&
                                     schedule[i].op != InstrKind::AllGatherParams;
       ++i)
    if (schedule[i].op == InstrKind::ReleaseParams)
      if (int64_t l = within.indexOf(schedule[i].params); l >= 0)
        ++releases[size_t(l)];
  const Chunk &chunk = plan.chunks[size_t(compute.chunk)];
  std::vector<std::vector<OpRun>> runs = readRuns(
      compute.op == InstrKind::Forward ? chunk.forward : chunk.backward, within.lists);
  for (size_t l = 0; l < within.lists.size() && !ctx.failed(); ++l) {
    const int64_t gathers = within.gathers[l];
    const int64_t most = std::max<int64_t>(1, int64_t(runs[l].size()));
    const std::string what = Twine(gathers).str() + " all_gather_params within " +
                             stepName(compute) + " gather '" + within.lists[l].params->front() +
                             "' and its list";
    if (gathers > most)
      ctx.fail(pathOf(index), what + ", which its ops read in " + Twine(most) +
                                  (most == 1 ? " run" : " runs") +
                                  "; a list is gathered at most once per run");
    else if (releases[l] != gathers)
      ctx.fail(pathOf(index), what + " but " + Twine(releases[l]) +
                                  " release_params within it release them; each gather needs "
                                  "its release");
  }
}

void ScheduleChecker::checkCompute(const Instr &instr, int64_t index) {
  int64_t slot = instr.chunk * microbatches + instr.microbatch;
  const Chunk &chunk = plan.chunks[instr.chunk];
  checkGatherRuns(instr, index);
  if (instr.op == InstrKind::Forward) {
    if (fwdAt[slot] >= 0)
      ctx.fail(pathOf(index), "second " + stepName(instr) + " (the first is schedule[" +
                                  Twine(fwdAt[slot]) + "])");
    else if ((chunk.hasEmbedding || chunk.hasHead) && loadAt[instr.microbatch] < 0)
      ctx.fail(pathOf(index), stepName(instr) + " runs before load_batch of its microbatch");
    fwdAt[slot] = index;
    return;
  }
  if (bwdAt[slot] >= 0)
    ctx.fail(pathOf(index),
             "second " + stepName(instr) + " (the first is schedule[" + Twine(bwdAt[slot]) + "])");
  else if (fwdAt[slot] < 0)
    ctx.fail(pathOf(index), stepName(instr) + " comes before its 'fwd'");
  bwdAt[slot] = index;
}

void ScheduleChecker::checkTransfer(const Instr &instr, int64_t index) {
  const Chunk &chunk = plan.chunks[instr.chunk];
  int64_t slot = instr.chunk * microbatches + instr.microbatch;
  bool towardsNext = instr.op == InstrKind::SendAct || instr.op == InstrKind::RecvGrad;
  if (plan.parallel.pp == 1)
    ctx.fail(fieldPath(pathOf(index), "op"),
             "with one pipeline stage consecutive chunks hand tensors "
             "over locally; remove the transfer");
  else if (towardsNext && chunk.output.empty())
    ctx.fail(fieldPath(pathOf(index), "chunk"),
             "chunk " + Twine(instr.chunk) + " is the last " + "virtual stage; nothing follows it");
  else if (!towardsNext && chunk.input.empty())
    ctx.fail(fieldPath(pathOf(index), "chunk"),
             "chunk " + Twine(instr.chunk) + " is virtual stage 0; " + "nothing precedes it");
  if (ctx.failed())
    return;
  int64_t pp = plan.parallel.pp;
  int64_t stage = (plan.coords.pp + (towardsNext ? 1 : pp - 1)) % pp;
  int64_t expectedPeer = plan.groups.pp[stage];
  if (instr.peer != expectedPeer)
    ctx.fail(fieldPath(pathOf(index), "peer"), "the " + Twine(towardsNext ? "next" : "previous") +
                                                   " virtual stage of chunk " + Twine(instr.chunk) +
                                                   " is on rank " + Twine(expectedPeer) + ", not " +
                                                   Twine(instr.peer));
  switch (instr.op) {
  case InstrKind::SendAct:
    if (fwdAt[slot] < 0)
      ctx.fail(pathOf(index), stepName(instr) + " comes before the 'fwd' that computes it");
    break;
  case InstrKind::RecvAct:
    if (fwdAt[slot] >= 0)
      ctx.fail(pathOf(index), stepName(instr) + " comes after the 'fwd' that needs it");
    break;
  case InstrKind::SendGrad:
    if (bwdAt[slot] < 0)
      ctx.fail(pathOf(index), stepName(instr) + " comes before the 'bwd' that computes it");
    break;
  case InstrKind::RecvGrad:
    if (bwdAt[slot] >= 0)
      ctx.fail(pathOf(index), stepName(instr) + " comes after the 'bwd' that needs it");
    break;
  default:
    break;
  }
}

void ScheduleChecker::checkGroup(Group group, const std::string &path) {
  if (plan.groups.get(group).empty())
    ctx.fail(path, "this rank is in no '" + spelling(group) + "' group");
}

void ScheduleChecker::checkParamList(const Instr &instr, int64_t index) {
  std::string listPath = fieldPath(pathOf(index), "params");
  if (instr.params.empty())
    ctx.fail(listPath, "names no parameter");
  llvm::StringSet<> seen;
  for (size_t j = 0; j < instr.params.size() && !ctx.failed(); ++j) {
    const std::string &name = instr.params[j];
    if (!paramNames.count(name))
      ctx.fail(indexPath(listPath, j), "'" + name + "' is not a parameter of this rank");
    else if (!seen.insert(name).second)
      ctx.fail(indexPath(listPath, j), "'" + name + "' is listed twice");
  }
  if (ctx.failed() || instr.op == InstrKind::AllReduceGrads)
    return;
  // ZeRO partitions a flattened parameter list over the group, so a parameter's list must be
  // the same (same names, same order) in every collective and release that touches it.
  for (const std::string &name : instr.params) {
    auto [it, inserted] = partitionOf.try_emplace(name, index);
    if (!inserted && plan.schedule[it->second].params != instr.params) {
      ctx.fail(listPath, "'" + name + "' is in a different list at schedule[" + Twine(it->second) +
                             "]; a ZeRO partition is defined by its " +
                             "list, so every collective of a parameter must use the same list");
      return;
    }
  }
}

/// A gather that runs within a compute must lead up to it, a release or reduce-scatter follow
/// it (a reduce-scatter a backward, the only compute that writes gradients).
void ScheduleChecker::checkWithin(const Instr &instr, int64_t index) {
  const std::vector<Instr> &schedule = plan.schedule;
  bool before = instr.op == InstrKind::AllGatherParams;
  int64_t at = index;
  auto sameSide = [&](const Instr &other) {
    return other.within && (other.op == InstrKind::AllGatherParams) == before;
  };
  do
    at += before ? 1 : -1;
  while (at >= 0 && at < int64_t(schedule.size()) && sameSide(schedule[size_t(at)]));
  bool attached = at >= 0 && at < int64_t(schedule.size()) && isCompute(schedule[size_t(at)].op);
  if (attached && instr.op == InstrKind::ReduceScatterGrads)
    attached = schedule[size_t(at)].op == InstrKind::Backward;
  if (!attached)
    ctx.fail(fieldPath(pathOf(index), "within"),
             before ? "an all_gather_params within a compute must come right before a 'fwd' or "
                      "'bwd' (or another such gather)"
             : instr.op == InstrKind::ReduceScatterGrads
                 ? "a reduce_scatter_grads within a compute must come right after a 'bwd' (or "
                   "another instruction within it)"
                 : "a release_params within a compute must come right after a 'fwd' or 'bwd' "
                   "(or another instruction within it)");
}

void ScheduleChecker::run() {
  int64_t lastGradSync = -1;
  for (size_t i = 0; i < plan.schedule.size() && !ctx.failed(); ++i) {
    const Instr &instr = plan.schedule[i];
    int64_t index = int64_t(i);
    switch (instr.op) {
    case InstrKind::LoadBatch:
      if (!inRange(index, "mb", instr.microbatch, microbatches, "microbatches"))
        break;
      if (!needsBatch)
        ctx.fail(fieldPath(pathOf(index), "op"),
                 "this rank holds neither the embedding nor the head, "
                 "so it loads no batch");
      else if (loadAt[instr.microbatch] >= 0)
        ctx.fail(pathOf(index), "second load_batch of microbatch " + Twine(instr.microbatch));
      loadAt[instr.microbatch] = index;
      break;
    case InstrKind::Forward:
    case InstrKind::Backward:
    case InstrKind::SendAct:
    case InstrKind::RecvAct:
    case InstrKind::SendGrad:
    case InstrKind::RecvGrad:
      if (!inRange(index, "chunk", instr.chunk, chunks, "chunks of this rank") ||
          !inRange(index, "mb", instr.microbatch, microbatches, "microbatches"))
        break;
      if (isCompute(instr.op))
        checkCompute(instr, index);
      else
        checkTransfer(instr, index);
      break;
    case InstrKind::AllReduceGrads:
    case InstrKind::ReduceScatterGrads:
      lastGradSync = index;
      [[fallthrough]];
    case InstrKind::AllGatherParams:
      checkGroup(instr.group, fieldPath(pathOf(index), "group"));
      [[fallthrough]];
    case InstrKind::ReleaseParams:
      checkParamList(instr, index);
      if (instr.within && !ctx.failed())
        checkWithin(instr, index);
      break;
    case InstrKind::OptimizerStep:
      if (optimizerAt >= 0)
        ctx.fail(pathOf(index), "second optimizer_step (the first is schedule[" +
                                    Twine(optimizerAt) + "]); a plan describes one step");
      optimizerAt = index;
      for (size_t j = 0; j < instr.normGroups.size(); ++j) {
        std::string groupPath = indexPath(fieldPath(pathOf(index), "norm_groups"), j);
        checkGroup(instr.normGroups[j], groupPath);
        if (llvm::is_contained(llvm::makeArrayRef(instr.normGroups).take_front(j),
                               instr.normGroups[j]))
          ctx.fail(groupPath, "'" + spelling(instr.normGroups[j]) + "' is listed twice");
      }
      break;
    }
  }
  if (ctx.failed())
    return;
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t mb = 0; mb < microbatches; ++mb)
      for (auto [seenAt, name] : {std::pair{&fwdAt, "fwd"}, {&bwdAt, "bwd"}})
        if ((*seenAt)[c * microbatches + mb] < 0)
          ctx.fail("schedule", "has no '" + Twine(name) + "' of chunk " + Twine(c) +
                                   " for microbatch " + Twine(mb) + "; every chunk runs " +
                                   "every microbatch forward and backward once");
  for (int64_t mb = 0; mb < microbatches && needsBatch; ++mb)
    if (loadAt[mb] < 0)
      ctx.fail("schedule", "has no load_batch of microbatch " + Twine(mb));
  if (optimizerAt < 0)
    ctx.fail("schedule", "has no optimizer_step");
  int64_t lastBackward = *std::max_element(bwdAt.begin(), bwdAt.end());
  if (!ctx.failed() && (optimizerAt < lastBackward || optimizerAt < lastGradSync))
    ctx.fail(indexPath("schedule", optimizerAt),
             "optimizer_step must follow every 'bwd' and gradient collective of the step");
}

} // namespace

void checkSchedule(ReadContext &ctx, const RankPlan &plan) {
  // Every (chunk, microbatch) needs its own instructions, so a count beyond the schedule's
  // length is wrong, and refusing it here bounds what the checker allocates.
  std::optional<int64_t> computes =
      checkedMul(int64_t(plan.chunks.size()), plan.parallel.microbatches);
  if (!computes || *computes > int64_t(plan.schedule.size()))
    ctx.fail("schedule", "has " + Twine(plan.schedule.size()) + " instructions, fewer than " +
                             "the chunks x microbatches = " + Twine(plan.chunks.size()) + " x " +
                             Twine(plan.parallel.microbatches) + " forward passes it must run");
  else
    ScheduleChecker(ctx, plan).run();
}

} // namespace parc::plan::detail
