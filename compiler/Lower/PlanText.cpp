//===- PlanText.cpp - A readable listing of one rank plan -----------------===//
//
// Operands are spelled as in the JSON (`fwd chunk=0 mb=3`, `eps=1e-05`), so the listing
// reads as a compact form of the plan file.
//
//===----------------------------------------------------------------------===//
#include "parc/Lower/PlanText.h"

#include "llvm/Support/Format.h"

namespace parc {

namespace {

using llvm::raw_ostream;

void printList(raw_ostream &os, llvm::ArrayRef<int64_t> values) {
  os << "[";
  for (size_t i = 0; i < values.size(); ++i)
    os << (i ? ", " : "") << values[i];
  os << "]";
}

void printNames(raw_ostream &os, llvm::ArrayRef<std::string> names) {
  for (size_t i = 0; i < names.size(); ++i)
    os << (i ? ", " : "") << names[i];
}

void printNumber(raw_ostream &os, double value) { os << llvm::format("%g", value); }

void printAttr(raw_ostream &os, const plan::AttrValue &value) {
  if (const bool *b = std::get_if<bool>(&value))
    os << (*b ? "true" : "false");
  else if (const int64_t *i = std::get_if<int64_t>(&value))
    os << *i;
  else if (const double *d = std::get_if<double>(&value))
    printNumber(os, *d);
  else
    os << std::get<std::string>(value);
}

void printHeader(const plan::RankPlan &plan, raw_ostream &os) {
  const plan::ParallelSummary &p = plan.parallel;
  os << "rank " << plan.rank << " of " << plan.world << ": node " << plan.node << ", local rank "
     << plan.localRank << ", tp " << plan.coords.tp << ", pp " << plan.coords.pp << ", dp "
     << plan.coords.dp;
  // Context parallelism's coordinate and groups only where there is some.
  bool cp = p.cp > 1;
  if (cp)
    os << ", cp " << plan.coords.cp;
  os << "\n";
  os << "plan_id " << plan.planId << "\n";
  os << "job " << plan.model.name << ": tp " << p.tp << ", pp " << p.pp << ", dp " << p.dp
     << (cp ? ", cp " + std::to_string(p.cp) : "")
     << (p.ep > 1 ? ", ep " + std::to_string(p.ep) : "") << ", "
     << plan::spelling(p.schedule) << ", chunks " << p.chunks << ", " << p.microbatches
     << " microbatches of " << p.microBatch << ", zero " << p.zero << ", recompute "
     << plan::spelling(p.recompute) << (p.sequenceParallel ? ", sequence parallel" : "") << "\n";
  os << "groups\n";
  for (plan::Group group : plan::kAllGroups) {
    if (!cp && (group == plan::Group::CP || group == plan::Group::DPCP))
      continue;
    if (p.ep == 1 && (group == plan::Group::EP || group == plan::Group::ExpertDP))
      continue;
    os << "  " << plan::spelling(group) << " ";
    printList(os, plan.groups.get(group));
    os << "\n";
  }
}

void printParams(const plan::RankPlan &plan, raw_ostream &os) {
  os << "params\n";
  for (const plan::ParamShard &param : plan.params) {
    os << "  " << param.name << ": " << plan::spelling(param.kind) << " ";
    printList(os, param.shape);
    os << " slice [";
    for (size_t d = 0; d < param.slice.size(); ++d)
      os << (d ? ", " : "") << param.slice[d].offset << ":"
         << param.slice[d].offset + param.slice[d].size;
    os << "] " << plan::spelling(param.dtype) << " " << plan::spelling(param.init.kind);
    if (param.init.kind == plan::InitKind::Normal) {
      os << "(";
      printNumber(os, param.init.std);
      os << ")";
    }
    if (!param.countsInGradNorm)
      os << ", not in grad norm";
    os << "\n";
  }
}

void printOps(llvm::ArrayRef<plan::Op> ops, raw_ostream &os) {
  for (const plan::Op &op : ops) {
    os << "    ";
    printNames(os, op.outputs);
    os << " = " << plan::spelling(op.kind) << "(";
    printNames(os, op.inputs);
    os << ")";
    for (const auto &[name, value] : op.attrs) {
      os << " " << name << "=";
      printAttr(os, value);
    }
    os << "\n";
  }
}

void printChunk(const plan::Chunk &chunk, raw_ostream &os) {
  os << "chunk " << chunk.index << ": virtual stage " << chunk.virtualStage << ", ";
  if (chunk.numBlocks() > 1)
    os << "blocks " << chunk.firstBlock << "-" << chunk.lastBlock;
  else if (chunk.numBlocks() == 1)
    os << "block " << chunk.firstBlock;
  else
    os << "no blocks";
  os << ", input " << (chunk.input.empty() ? "-" : chunk.input) << ", output "
     << (chunk.output.empty() ? "-" : chunk.output) << (chunk.hasEmbedding ? ", embedding" : "")
     << (chunk.hasHead ? ", head" : "") << "\n";
  os << "  tensors\n";
  for (const auto &[name, type] : chunk.tensors) {
    os << "    " << name << ": ";
    printList(os, type.shape);
    os << " " << plan::spelling(type.dtype) << "\n";
  }
  os << "  forward\n";
  printOps(chunk.forward, os);
  os << "  backward\n";
  printOps(chunk.backward, os);
}

void printInstr(const plan::Instr &instr, raw_ostream &os) {
  os << plan::spelling(instr.op);
  switch (instr.op) {
  case plan::InstrKind::LoadBatch:
    os << " mb=" << instr.microbatch;
    break;
  case plan::InstrKind::Forward:
  case plan::InstrKind::Backward:
    os << " chunk=" << instr.chunk << " mb=" << instr.microbatch;
    break;
  case plan::InstrKind::SendAct:
  case plan::InstrKind::RecvAct:
  case plan::InstrKind::SendGrad:
  case plan::InstrKind::RecvGrad:
    os << " chunk=" << instr.chunk << " mb=" << instr.microbatch << " peer=" << instr.peer;
    break;
  case plan::InstrKind::AllReduceGrads:
  case plan::InstrKind::ReduceScatterGrads:
    os << " group=" << plan::spelling(instr.group)
       << " average=" << (instr.average ? "true" : "false");
    [[fallthrough]];
  case plan::InstrKind::AllGatherParams:
  case plan::InstrKind::ReleaseParams:
    if (instr.op == plan::InstrKind::AllGatherParams)
      os << " group=" << plan::spelling(instr.group);
    if (instr.within)
      os << " within";
    os << " params=[";
    printNames(os, instr.params);
    os << "]";
    break;
  case plan::InstrKind::OptimizerStep:
    os << " norm_groups=[";
    for (size_t i = 0; i < instr.normGroups.size(); ++i)
      os << (i ? ", " : "") << plan::spelling(instr.normGroups[i]);
    os << "]";
    break;
  }
}

} // namespace

void printPlanText(const plan::RankPlan &plan, raw_ostream &os) {
  printHeader(plan, os);
  printParams(plan, os);
  for (const plan::Chunk &chunk : plan.chunks)
    printChunk(chunk, os);
  os << "schedule\n";
  for (size_t i = 0; i < plan.schedule.size(); ++i) {
    os << "  " << i << ": ";
    printInstr(plan.schedule[i], os);
    os << "\n";
  }
}

} // namespace parc
