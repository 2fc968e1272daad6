//===- WithinPlacement.cpp - Op positions of the instructions inside a compute ===//

#include "parc/Runtime/WithinPlacement.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <optional>

namespace parc::runtime {

namespace {
using plan::InstrKind;

/// The op of `ops` where `instr` runs: the first reading its parameters (a gather), the last
/// reading them (a release) or the last writing their gradients (a reduce-scatter).
WithinPlacement::Hook place(const plan::Instr &instr, llvm::ArrayRef<plan::Op> ops,
                            size_t index) {
  llvm::StringSet<> names;
  bool gradients = instr.op == InstrKind::ReduceScatterGrads;
  for (const std::string &param : instr.params)
    names.insert(gradients ? plan::gradName(param) : param);
  auto touches = [&](const plan::Op &op) {
    const std::vector<std::string> &operands = gradients ? op.outputs : op.inputs;
    return llvm::any_of(operands, [&](const std::string &name) { return names.count(name); });
  };
  WithinPlacement::Hook hook;
  hook.instr = index;
  if (instr.op == InstrKind::AllGatherParams) {
    hook.before = true;
    auto first = llvm::find_if(ops, touches);
    hook.op = first == ops.end() ? 0 : size_t(first - ops.begin());
    return hook;
  }
  hook.op = ops.empty() ? 0 : ops.size() - 1;
  for (size_t i = ops.size(); i-- > 0;)
    if (touches(ops[i])) {
      hook.op = i;
      break;
    }
  return hook;
}
/// The gathers and releases of the lists gathered within one compute, placed by run
/// (plan::readRuns): the k-th gather of a list before the first op of its k-th run, the k-th
/// release after that run's last op, the last of each spanning the runs left.
class GatherRuns {
public:
  GatherRuns(llvm::ArrayRef<plan::Instr> schedule, llvm::ArrayRef<plan::Op> ops, size_t compute)
      : within(plan::gatheredWithin(schedule, compute)), runs(plan::readRuns(ops, within.lists)),
        placedGathers(within.lists.size(), 0), placedReleases(within.lists.size(), 0) {}

  /// Where a gather or release of a gathered list that the compute reads runs; none for
  /// anything else.
  std::optional<WithinPlacement::Hook> hookOf(const plan::Instr &instr, size_t index) {
    bool gather = instr.op == InstrKind::AllGatherParams;
    int64_t list =
        gather || instr.op == InstrKind::ReleaseParams ? within.indexOf(instr.params) : -1;
    if (list < 0 || runs[size_t(list)].empty())
      return std::nullopt;
    const std::vector<plan::OpRun> &listRuns = runs[size_t(list)];
    size_t &placed = (gather ? placedGathers : placedReleases)[size_t(list)];
    size_t run = std::min(placed++, listRuns.size() - 1);
    if (!gather && int64_t(placed) >= within.gathers[size_t(list)])
      run = listRuns.size() - 1;
    WithinPlacement::Hook hook;
    hook.instr = index;
    hook.before = gather;
    hook.op = gather ? listRuns[run].first : listRuns[run].last;
    return hook;
  }

private:
  plan::WithinGathers within;
  std::vector<std::vector<plan::OpRun>> runs;
  std::vector<size_t> placedGathers, placedReleases;
};
} // namespace

WithinPlacement::WithinPlacement(const plan::RankPlan &plan)
    : hooks(plan.schedule.size()), within(plan.schedule.size(), false) {
  const std::vector<plan::Instr> &schedule = plan.schedule;
  for (size_t c = 0; c < schedule.size(); ++c) {
    const plan::Instr &compute = schedule[c];
    if (!plan::isCompute(compute.op) || compute.chunk < 0 ||
        compute.chunk >= int64_t(plan.chunks.size()))
      continue;
    const plan::Chunk &chunk = plan.chunks[size_t(compute.chunk)];
    llvm::ArrayRef<plan::Op> ops =
        compute.op == InstrKind::Forward ? chunk.forward : chunk.backward;
    size_t first = c;
    while (first > 0 && schedule[first - 1].within &&
           schedule[first - 1].op == InstrKind::AllGatherParams)
      --first;
    size_t end = c + 1;
    while (end < schedule.size() && schedule[end].within &&
           schedule[end].op != InstrKind::AllGatherParams)
      ++end;
    GatherRuns gathers(schedule, ops, c);
    for (size_t i = first; i < end; ++i)
      if (i != c) {
        std::optional<Hook> hook = gathers.hookOf(schedule[i], i);
        hooks[c].push_back(hook ? *hook : place(schedule[i], ops, i));
        within[i] = true;
      }
  }
}

} // namespace parc::runtime
