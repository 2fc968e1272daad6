//===- WithinPlacement.cpp - Op positions of the instructions inside a compute ===//

#include "parc/Runtime/WithinPlacement.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"

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
    for (size_t i = first; i < end; ++i)
      if (i != c) {
        hooks[c].push_back(place(schedule[i], ops, i));
        within[i] = true;
      }
  }
}

} // namespace parc::runtime
