//===- SearchReport.cpp - The ranked table of `parc --search` -------------===//
#include "parc/Search/SearchReport.h"
#include "parc/Cost/Report.h"
#include "parc/Support/TextTable.h"
#include "parc/Support/Units.h"

#include "llvm/Support/Format.h"

#include <cmath>

namespace parc {

namespace {


std::string seconds(double s) { return formatQuantity(s, Dimension::time()); }

double exposedComm(const StepBreakdown &b) { return b.tp + b.pp + b.dp + b.cp; }

/// Whether the table has a cp column: only when the search may choose cp > 1.
bool withContext(const Program &program) {
  return program.parallel.space.cp.open || program.parallel.cp > 1;
}


/// Where `loser` spends the most time beyond `best`: "bubble 40.1 s vs 1.4 s".
std::string whyItLoses(const Candidate &loser, const Candidate &best) {
  const StepBreakdown &l = loser.cost.breakdown, &b = best.cost.breakdown;
  const std::pair<const char *, std::pair<double, double>> parts[] = {
      {"compute", {l.compute, b.compute}},          {"recompute", {l.recompute, b.recompute}},
      {"the bubble", {l.bubble, b.bubble}},         {"tp communication", {l.tp, b.tp}},
      {"pp communication", {l.pp, b.pp}},           {"dp communication", {l.dp, b.dp}},
      {"cp communication", {l.cp, b.cp}},           {"the optimizer", {l.optimizer, b.optimizer}}};
  const char *worst = nullptr;
  double gap = 0, mine = 0, theirs = 0;
  for (const auto &[name, pair] : parts)
    if (pair.first - pair.second > gap) {
      gap = pair.first - pair.second;
      worst = name;
      mine = pair.first;
      theirs = pair.second;
    }
  double ratio = best.step() > 0 ? loser.step() / best.step() : 1;
  if (!worst || ratio <= 1)
    return "as fast as the best";
  return formatNumber("%.2fx slower, mostly ", ratio) + worst + ": " + seconds(mine) + " against " +
         seconds(theirs);
}

/// What a mapping that does not fit would need: a GPU with its memory, enough GPUs to shard
/// its model states, or smaller activations.
std::string whatItNeeds(const Candidate &c, const Program &program) {
  const StageMemory &m = c.worstStage;
  double memory = double(program.cluster.gpuMemory);
  std::string out = "needs " + formatBytes(c.maxRankBytes) + " per GPU, " +
                    formatBytes(c.maxRankBytes - memory) + " more than gpu.memory";
  double states = m.modelStates() + m.gathered, room = memory - m.activations - m.reserve;
  if (room > 0 && states > room) {
    // Model states shrink with the GPUs they are split over, at this ratio of tp, pp and dp.
    int64_t world = program.cluster.world(), perNode = program.cluster.gpusPerNode;
    double gpus = std::ceil(double(world) * states / room);
    int64_t nodes = int64_t(std::ceil(gpus / double(perNode)));
    out += "; its model states (" + formatBytes(states) + ") would fit on about " +
           std::to_string(nodes * perNode) + " GPUs (" + std::to_string(nodes) + " nodes)";
  } else {
    out += "; its activations (" + formatBytes(m.activations) +
           ") need a smaller micro_batch or more recompute";
  }
  return out;
}

std::vector<std::string> row(size_t rank, const Candidate &c, const Program &program) {
  const ParallelSpec &p = c.parallel;
  const CostEstimate &cost = c.cost;
  double memory = double(program.cluster.gpuMemory);
  std::vector<std::string> cells = {std::to_string(rank), std::to_string(p.tp),
                                    std::to_string(p.pp), std::to_string(p.dp)};
  if (withContext(program))
    cells.push_back(std::to_string(p.cp));
  if (program.model.hasExperts())
    cells.push_back(std::to_string(p.ep));
  std::vector<std::string> rest = {
          std::to_string(p.microBatch),
          p.scheduleText(),
          std::to_string(p.zero),
          toString(p.recompute),
          p.sequenceParallel ? "yes" : "no",
          p.orderText(),
          seconds(c.step()),
          formatNumber("%.0f", cost.tokensPerSecond),
          formatNumber("%.1f%%", 100 * cost.mfu),
          formatBytes(c.maxRankBytes),
          formatNumber("%.0f%%", 100 * c.maxRankBytes / memory),
          seconds(cost.breakdown.bubble),
          seconds(exposedComm(cost.breakdown))};
  cells.insert(cells.end(), rest.begin(), rest.end());
  return cells;
}

const char *familyAxes(PureFamily f) {
  switch (f) {
  case PureFamily::DataParallel:
    return "tp 1, pp 1";
  case PureFamily::TensorParallel:
    return "pp 1, dp 1";
  case PureFamily::PipelineParallel:
    return "tp 1, dp 1";
  }
  return "";
}

llvm::json::Object candidateJSON(const Candidate &c) {
  const ParallelSpec &p = c.parallel;
  const StepBreakdown &b = c.cost.breakdown;
  return llvm::json::Object{
      {"tp", p.tp},
      {"pp", p.pp},
      {"dp", p.dp},
      {"cp", p.cp},
      {"ep", p.ep},
      {"micro_batch", p.microBatch},
      {"schedule", p.scheduleText()},
      {"zero", p.zero},
      {"recompute", toString(p.recompute)},
      {"sequence_parallel", p.sequenceParallel},
      {"order", p.orderText()},
      {"step_time_estimate_s", c.step()},
      {"max_rank_bytes", int64_t(std::llround(c.maxRankBytes))},
      {"mfu_estimate", c.cost.mfu},
      {"tokens_per_second", c.cost.tokensPerSecond},
      {"bubble_s", b.bubble},
      {"exposed_communication_s", exposedComm(b)},
      {"step_time_breakdown", breakdownToJSON(b)},
  };
}

} // namespace

std::string mappingText(const ParallelSpec &p) {
  std::string s = "tp " + std::to_string(p.tp) + ", pp " + std::to_string(p.pp) + ", dp " +
                  std::to_string(p.dp) + (p.cp > 1 ? ", cp " + std::to_string(p.cp) : "") +
                  (p.ep > 1 ? ", ep " + std::to_string(p.ep) : "") +
                  ", micro_batch " + std::to_string(p.microBatch) +
                  ", " + p.scheduleText() + ", zero " + std::to_string(p.zero) +
                  ", recompute " + toString(p.recompute);
  if (p.sequenceParallel)
    s += ", sequence parallel";
  return s + ", order " + p.orderText();
}

void printSearch(const SearchResult &r, const Program &program, llvm::raw_ostream &os) {
  os << "search for " << program.model.name << " on " << program.cluster.name << " ("
     << program.cluster.world() << " GPUs): " << r.candidates << " candidates, " << r.feasible
     << " feasible, in " << formatNumber("%.3f s", r.elapsedSeconds);
  if (r.candidates > 0)
    os << formatNumber(" (%.2f us a candidate)", 1e6 * r.elapsedSeconds / double(r.candidates));
  os << "\n  rejected:";
  bool any = false;
  for (size_t i = 0; i < kRejections; ++i)
    if (r.rejected[i]) {
      os << (any ? "," : "") << " " << r.rejected[i] << " " << toString(Rejection(i));
      any = true;
    }
  os << (any ? "\n" : " none\n");

  if (r.top.empty() && r.closest.empty()) {
    os << "\nno candidate of the space passes the mapping rules (the rejections above)\n";
    return;
  }
  if (r.top.empty()) {
    os << "\nno mapping fits in gpu.memory = "
       << formatBytes(double(program.cluster.gpuMemory)) << "; the closest:\n";
    for (const Candidate &c : r.closest)
      os << "  " << mappingText(c.parallel) << ": " << whatItNeeds(c, program) << "\n";
    return;
  }
  os << "\n";
  std::vector<std::string> header = {"#", "tp", "pp", "dp"};
  std::string align = "rrrr";
  if (withContext(program)) {
    header.push_back("cp");
    align += "r";
  }
  // A model with experts has an ep column after dp (and cp).
  if (program.model.hasExperts()) {
    header.push_back("ep");
    align += "r";
  }
  for (const char *h : {"mb", "schedule", "zero", "recompute", "sp", "order", "step", "tokens/s",
                        "MFU", "memory", "of GPU", "bubble", "exposed comm"})
    header.push_back(h);
  align += "rlrlllrrrrrrr";
  std::vector<std::vector<std::string>> rows = {header};
  for (size_t i = 0; i < r.top.size(); ++i)
    rows.push_back(row(i + 1, r.top[i], program));
  printTable(os, rows, align);

  os << "\nDP vs TP vs PP, the best mapping of each single axis:\n";
  for (size_t f = 0; f < kPureFamilies; ++f) {
    os << "  " << toString(PureFamily(f)) << " (" << familyAxes(PureFamily(f)) << "): ";
    if (!r.pure[f]) {
      os << r.pureProblem[f] << "\n";
      continue;
    }
    const Candidate &c = *r.pure[f];
    os << mappingText(c.parallel) << ", step " << seconds(c.step()) << "; "
       << whyItLoses(c, r.top.front()) << "\n";
  }
}

llvm::json::Value searchToJSON(const SearchResult &r, const Program &program) {
  llvm::json::Object rejected;
  for (size_t i = 0; i < kRejections; ++i)
    rejected[toString(Rejection(i))] = r.rejected[i];
  llvm::json::Array top, closest;
  for (const Candidate &c : r.top)
    top.push_back(candidateJSON(c));
  for (const Candidate &c : r.closest) {
    llvm::json::Object o = candidateJSON(c);
    o.erase("step_time_estimate_s");
    o["max_rank_bytes"] = int64_t(std::llround(c.maxRankBytes));
    closest.push_back(std::move(o));
  }
  llvm::json::Object pure;
  for (size_t f = 0; f < kPureFamilies; ++f) {
    if (r.pure[f]) {
      llvm::json::Object o = candidateJSON(*r.pure[f]);
      if (!r.top.empty())
        o["loses_by"] = whyItLoses(*r.pure[f], r.top.front());
      pure[toString(PureFamily(f))] = std::move(o);
    } else {
      pure[toString(PureFamily(f))] = llvm::json::Object{{"problem", r.pureProblem[f]}};
    }
  }
  return llvm::json::Object{
      {"model", program.model.name},
      {"cluster", program.cluster.name},
      {"world", program.cluster.world()},
      {"candidates", r.candidates},
      {"feasible", r.feasible},
      {"rejected", std::move(rejected)},
      {"elapsed_s", r.elapsedSeconds},
      {"top", std::move(top)},
      {"pure", std::move(pure)},
      {"closest", std::move(closest)},
  };
}

} // namespace parc
