//===- Report.cpp - The plan at a glance: layout, memory, FLOPs, traffic --===//
#include "parc/Cost/Report.h"
#include "parc/Cost/CostModel.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Support/TextTable.h"
#include "parc/Support/Units.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace parc {

namespace {

using GroupFn = std::function<std::vector<int64_t>(int64_t)>;

/// Every group of one kind once, in the order of its lowest rank: each is built from the
/// rank whose index in it is 0, so the whole list costs O(world). Expert groups are those of
/// the expert grid (Megatron-Core's expert rank generator).
std::vector<std::vector<int64_t>> allGroups(const RankLayout &layout, AxisSet axes,
                                            const GroupFn &groupOf, bool expert = false) {
  const RankGrid &grid = expert ? layout.expertGrid : layout.grid;
  std::vector<std::vector<int64_t>> out;
  for (int64_t rank = 0, n = layout.world(); rank < n; ++rank) {
    if (grid.indexIn(rank, axes) != 0)
      continue;
    std::vector<int64_t> g = groupOf(rank);
    if (!g.empty() && g.front() == rank)
      out.push_back(std::move(g));
  }
  return out;
}

struct GroupKind {
  const char *name;
  AxisSet axes; // the coordinates that vary within a group
  GroupFn groupOf;
  bool expert = false; // a group of the expert grid
};

/// The text report lists context parallelism's groups only when cp > 1; the JSON always.
std::vector<GroupKind> groupKinds(const Program &program, const Mapping &mapping,
                                  bool withContext) {
  const RankLayout &layout = mapping.layout;
  std::vector<GroupKind> kinds = {
      {"tp", {Axis::TP}, [&layout](int64_t r) { return layout.tpGroup(r); }},
      {"dp", {Axis::DP}, [&layout](int64_t r) { return layout.dpGroup(r); }},
      {"pp", {Axis::PP}, [&layout](int64_t r) { return layout.ppGroup(r); }},
  };
  if (withContext) {
    kinds.push_back({"cp", {Axis::CP}, [&layout](int64_t r) { return layout.cpGroup(r); }});
    kinds.push_back({"dp_cp", RankLayout::kGradientAxes,
                     [&layout](int64_t r) { return layout.dpCpGroup(r); }});
  }
  if (program.model.tiedHead() && mapping.pp > 1)
    kinds.push_back({"embedding", {Axis::PP},
                     [&layout](int64_t r) { return layout.embeddingGroup(r, true); }});
  if (program.model.hasExperts()) {
    kinds.push_back({"ep", {Axis::EP}, [&layout](int64_t r) { return layout.epGroup(r); }, true});
    kinds.push_back({"expert_dp", {Axis::DP},
                     [&layout](int64_t r) { return layout.expertDataGroup(r); }, true});
  }
  return kinds;
}

bool kindCrossesNodes(const RankLayout &layout, const std::vector<std::vector<int64_t>> &groups) {
  for (const std::vector<int64_t> &g : groups)
    if (layout.crossesNodes(g))
      return true;
  return false;
}

std::string linkText(const ClusterSpec &cluster, int64_t ranks, bool inter) {
  if (ranks < 2)
    return "- (one rank, no traffic)";
  const LinkSpec &link = inter ? cluster.interNode : cluster.intraNode;
  return std::string(inter ? "inter_node" : "intra_node") + " (" +
         formatQuantity(link.bandwidth, Dimension::bandwidth()) + ", " +
         formatQuantity(link.latency, Dimension::time()) + ")";
}

std::string ranksText(const std::vector<int64_t> &group) {
  std::string out;
  auto add = [&](int64_t r) { out += (out.empty() ? "" : " ") + std::to_string(r); };
  if (group.size() <= 8) {
    for (int64_t r : group)
      add(r);
    return out;
  }
  for (size_t i = 0; i < 4; ++i)
    add(group[i]);
  out += " ..";
  add(group.back());
  return out;
}


/// Decimal units, as the ZeRO paper reports model states.
std::string decimalBytes(double bytes) {
  if (bytes >= 1e9)
    return formatNumber("%.1f GB", bytes / 1e9);
  if (bytes >= 1e6)
    return formatNumber("%.1f MB", bytes / 1e6);
  return formatNumber("%.1f kB", bytes / 1e3);
}

std::string paramCount(double n) {
  if (n >= 1e9)
    return formatNumber("%.2f B", n / 1e9);
  if (n >= 1e6)
    return formatNumber("%.2f M", n / 1e6);
  return formatNumber("%.0f", n);
}
std::string flops(double f) { return formatNumber("%.3e", f); }



std::string duration(double seconds) {
  if (seconds >= 2 * 86400)
    return formatNumber("%.1f days", seconds / 86400);
  if (seconds >= 2 * 3600)
    return formatNumber("%.1f hours", seconds / 3600);
  return formatQuantity(seconds, Dimension::time());
}

/// The parts of the breakdown with their names, in the order the report prints them; ring
/// attention's part only where there is context parallelism (the JSON always has it).
std::vector<std::pair<const char *, double>> breakdownParts(const StepBreakdown &b,
                                                            bool withContext = true) {
  std::vector<std::pair<const char *, double>> parts = {
      {"compute", b.compute}, {"recompute", b.recompute}, {"bubble", b.bubble},
      {"tp", b.tp},           {"pp", b.pp},               {"dp", b.dp}};
  if (withContext)
    parts.push_back({"cp", b.cp});
  if (b.ep > 0)
    parts.push_back({"ep", b.ep});
  parts.push_back({"optimizer", b.optimizer});
  return parts;
}

/// What one MoE block holds and moves on one rank per microbatch, for the report.
struct ExpertSummary {
  const LayerGroup *block = nullptr; // the first MoE group
  int64_t moeBlocks = 0, expertsPerRank = 0;
  int64_t fewestExperts = 0, mostExperts = 0; // over the MoE groups
  ExpertRows rows;
  double worstExtra = 0; // on the stage where it is largest
};

ExpertSummary expertSummary(const Program &program, const Mapping &mapping,
                            const MemoryEstimate &memory) {
  ExpertSummary s;
  for (const LayerGroup &g : program.model.layers)
    if (g.kind == LayerGroup::Transformer && g.moe.enabled()) {
      s.block = s.block ? s.block : &g;
      s.moeBlocks += g.count;
      s.fewestExperts = s.fewestExperts ? std::min(s.fewestExperts, g.moe.experts) : g.moe.experts;
      s.mostExperts = std::max(s.mostExperts, g.moe.experts);
    }
  if (!s.block)
    return s;
  s.expertsPerRank = s.block->moe.experts / mapping.ep;
  // A cp rank routes the tokens of its seq / cp positions.
  s.rows = expertRows(s.block->moe,
                      double(program.model.seq / mapping.cp) * double(mapping.microBatch),
                      mapping.ep);
  for (const StageMemory &m : memory.stages)
    s.worstExtra = std::max(s.worstExtra, m.expertWorstCase);
  return s;
}

void printExperts(const Program &program, const Mapping &mapping, const MemoryEstimate &memory,
                  llvm::raw_ostream &os) {
  ExpertSummary s = expertSummary(program, mapping, memory);
  if (!s.block)
    return;
  const MoESpec &moe = s.block->moe;
  const double active = double(activeParams(program.model, mapping.paddedVocab));
  os << "experts: " << s.moeBlocks << " MoE blocks; " << paramCount(active)
     << " parameters active per token; ep " << mapping.ep << ", expert dp " << mapping.expertDp()
     << "\n";
  const bool mixed = s.mostExperts != s.fewestExperts;
  os << "  " << (mixed ? "layer '" + s.block->name + "': " : "") << moe.experts << " experts, top_k "
     << moe.topK << ", " << s.expertsPerRank << (s.expertsPerRank == 1 ? " expert" : " experts")
     << " per rank\n";
  os << "  expert tokens per rank, MoE block and microbatch: "
     << formatNumber("%.0f", s.rows.expected) << " rows balanced, at most "
     << formatNumber("%.0f", s.rows.bound) << " "
     << (moe.dropless() ? "dropless" : "with capacity " + formatNumber("%g", moe.capacity))
     << "; that worst case adds " << formatBytes(s.worstExtra) << " of activations to a rank";
  if (moe.dropless() && s.worstExtra > 0)
    os << " (a capacity factor bounds it)";
  os << "\n";
}

void printStepTime(const CostEstimate &cost, const Program &program, llvm::raw_ostream &os) {
  os << "\nstep time (simulated schedule, stage " << cost.criticalStage
     << " finishes last; communication counted where no compute hides it):\n";
  std::vector<std::vector<std::string>> rows = {{"part", "time", "share"}};
  for (auto [name, seconds] : breakdownParts(cost.breakdown, program.parallel.cp > 1))
    rows.push_back({name, formatQuantity(seconds, Dimension::time()),
                    formatNumber("%.1f%%", cost.stepSeconds > 0 ? 100 * seconds / cost.stepSeconds : 0)});
  rows.push_back({"step", formatQuantity(cost.stepSeconds, Dimension::time()), "100.0%"});
  printTable(os, rows, "lrr");
  os << "  MFU " << formatNumber("%.1f%%", 100 * cost.mfu) << ", HFU " << formatNumber("%.1f%%", 100 * cost.hfu)
     << " (with recompute), " << formatNumber("%.0f", cost.tokensPerSecond) << " tokens/s";
  if (cost.trainSeconds > 0)
    os << ", " << formatNumber("%.3g", program.train.tokens) << " tokens in "
       << duration(cost.trainSeconds);
  os << "\n";
}

} // namespace

void printReport(const Program &program, const Mapping &mapping, llvm::raw_ostream &os) {
  const ModelSpec &model = program.model;
  const ClusterSpec &cluster = program.cluster;
  const ParallelSpec &par = program.parallel;
  const RankLayout &layout = mapping.layout;
  const MemoryEstimate memory = estimateMemory(program, mapping);
  const CostEstimate cost = estimateCost(program, mapping);

  os << "report for " << model.name << " on " << cluster.name << "\n\n";

  os << "layout: " << layout.world() << " ranks = tp " << mapping.tp << " x pp " << mapping.pp
     << " x dp " << mapping.dp;
  if (mapping.cp > 1)
    os << " x cp " << mapping.cp;
  os << ", order " << layout.orderText() << ", " << cluster.gpusPerNode << " GPUs per node\n";
  std::vector<std::vector<std::string>> rows = {
      {"group", "ranks", "groups", "rank 0's group", "link"}};
  for (const GroupKind &kind : groupKinds(program, mapping, mapping.cp > 1)) {
    auto groups = allGroups(layout, kind.axes, kind.groupOf, kind.expert);
    std::vector<int64_t> own = kind.groupOf(0);
    rows.push_back({kind.name, std::to_string(own.size()), std::to_string(groups.size()),
                    ranksText(own),
                    linkText(cluster, int64_t(own.size()), kindCrossesNodes(layout, groups))});
  }
  printTable(os, rows, "lrrll");

  // Megatron counts the padded vocabulary; the real model is the unpadded count.
  os << "\nmodel: " << paramCount(double(totalParams(model, mapping.paddedVocab)))
     << " parameters, " << paramCount(double(totalParams(model, model.vocab)))
     << " without the padding (vocab " << model.vocab << " padded to " << mapping.paddedVocab
     << "), "
     << mapping.globalBatch << " sequences of " << model.seq << " tokens per step\n";
  printExperts(program, mapping, memory, os);
  os << "pipeline: " << mapping.microbatches << " microbatches of " << mapping.microBatch
     << " per step, schedule " << par.scheduleText() << ", bubble fraction "
     << formatNumber("%.4f", cost.bubbleFraction) << "\n";

  os << "\nmemory per rank (gpu.memory "
     << formatQuantity(double(memory.gpuMemory), Dimension::size()) << ", zero " << par.zero
     << ", recompute " << toString(par.recompute)
     << (par.sequenceParallel ? ", sequence parallel" : "") << "):\n";
  // The transient columns appear where some stage has them (ZeroPolicy.h, MemoryModel.h).
  bool zero3 = zeroPolicy(par, mapping.gradientRanks()).shardsWeights();
  bool gradBuffers = llvm::any_of(memory.stages, [](const StageMemory &m) {
    return m.gradBuffers > 0;
  });
  std::vector<std::string> header = {"stage", "blocks", "weights", "grads", "optimizer"};
  if (zero3)
    header.push_back("gathered");
  if (gradBuffers)
    header.push_back("grad buffers");
  for (const char *h : {"activations", "reserve", "total", "of GPU", "model states"})
    header.push_back(h);
  rows = {header};
  for (const StageMemory &m : memory.stages) {
    std::vector<std::string> row = {std::to_string(m.stage), std::to_string(m.blocks),
                                    formatBytes(m.weights), formatBytes(m.grads),
                                    formatBytes(m.optimizer)};
    if (zero3)
      row.push_back(formatBytes(m.gathered));
    if (gradBuffers)
      row.push_back(formatBytes(m.gradBuffers));
    row.push_back(formatBytes(m.activations));
    row.push_back(formatBytes(m.reserve));
    row.push_back(formatBytes(m.total()));
    row.push_back(formatNumber("%.1f%%", 100 * m.total() / double(memory.gpuMemory)));
    row.push_back(decimalBytes(m.modelStates()));
    rows.push_back(row);
  }
  printTable(os, rows, std::string(header.size(), 'r'));
  const StageMemory &worst = memory.worst();
  os << "  largest rank: stage " << worst.stage << ", " << formatBytes(worst.total()) << " of "
     << formatQuantity(double(memory.gpuMemory), Dimension::size())
     << (memory.fits() ? "" : " (does not fit)")
     << "; model states = weights + grads + optimizer, in decimal units (1 GB = 1e9 B)\n";

  os << "\nFLOPs per step: model " << flops(cost.modelFlops) << ", with recompute "
     << flops(cost.hardwareFlops) << " (" << formatNumber("%.0f", cost.tokensPerStep) << " tokens)\n";

  os << "\ncommunication per rank per step (busiest stage):\n";
  rows = {{"group", "bytes", "time", "link", "operations"}};
  for (const GroupTraffic &g : cost.traffic)
    rows.push_back({g.kind, formatBytes(g.bytesPerRank),
                    formatQuantity(g.seconds, Dimension::time()),
                    g.ranks < 2   ? "-"
                    : g.interNode ? "inter_node"
                                  : "intra_node",
                    g.operations});
  printTable(os, rows, "lrrll");

  printStepTime(cost, program, os);
}

namespace {

/// One kind of group in `--report=json`: every group of it and the link its traffic takes.
struct GroupList {
  std::string name;
  std::vector<std::vector<int64_t>> groups;
  const char *link;
};

/// The group kinds by name, the order in which JSON prints an object's keys.
std::vector<GroupList> groupLists(const Program &program, const Mapping &mapping) {
  const RankLayout &layout = mapping.layout;
  std::vector<GroupList> lists;
  for (const GroupKind &kind : groupKinds(program, mapping, /*withContext=*/true)) {
    auto all = allGroups(layout, kind.axes, kind.groupOf, kind.expert);
    const char *link = kind.groupOf(0).size() < 2
                           ? "none"
                           : (kindCrossesNodes(layout, all) ? "inter_node" : "intra_node");
    lists.push_back({kind.name, std::move(all), link});
  }
  std::sort(lists.begin(), lists.end(),
            [](const GroupList &a, const GroupList &b) { return a.name < b.name; });
  return lists;
}

/// The report but its "groups", which take O(world) and are added or streamed by the callers.
llvm::json::Object reportWithoutGroups(const Program &program, const Mapping &mapping,
                                       const std::vector<GroupList> &lists) {
  const RankLayout &layout = mapping.layout;
  const MemoryEstimate memory = estimateMemory(program, mapping);
  const CostEstimate cost = estimateCost(program, mapping);
  auto bytes = [](double b) { return int64_t(std::llround(b)); };

  llvm::json::Object links;
  for (const GroupList &list : lists)
    links[list.name] = list.link;

  llvm::json::Array stages;
  for (const StageMemory &m : memory.stages)
    stages.push_back(llvm::json::Object{
        {"stage", m.stage},
        {"blocks", m.blocks},
        {"params_per_rank", m.paramsPerRank},
        {"in_flight_forwards", m.inFlight},
        {"weights", bytes(m.weights)},
        {"grads", bytes(m.grads)},
        {"optimizer", bytes(m.optimizer)},
        {"gathered", bytes(m.gathered)},
        {"grad_buffers", bytes(m.gradBuffers)},
        {"activations", bytes(m.activations)},
        {"reserve", bytes(m.reserve)},
        {"model_states", bytes(m.modelStates())},
        {"total", bytes(m.total())},
    });

  llvm::json::Array traffic;
  for (const GroupTraffic &g : cost.traffic)
    traffic.push_back(llvm::json::Object{{"group", g.kind},
                                         {"ranks", g.ranks},
                                         {"groups", g.groups},
                                         {"inter_node", g.interNode},
                                         {"bytes_per_rank", bytes(g.bytesPerRank)},
                                         {"seconds", g.seconds},
                                         {"operations", g.operations}});

  llvm::json::Object breakdown = breakdownToJSON(cost.breakdown);
  breakdown["critical_stage"] = cost.criticalStage;

  const ParallelSpec &par = program.parallel;
  llvm::json::Object out{
      {"model", program.model.name},
      {"cluster", program.cluster.name},
      {"world", layout.world()},
      {"tp", mapping.tp},
      {"pp", mapping.pp},
      {"dp", mapping.dp},
      {"cp", mapping.cp},
      {"order", layout.orderText()},
      {"schedule", par.scheduleText()},
      {"zero", par.zero},
      {"recompute", toString(par.recompute)},
      {"sequence_parallel", par.sequenceParallel},
      {"micro_batch", mapping.microBatch},
      {"global_batch", mapping.globalBatch},
      {"microbatches", mapping.microbatches},
      {"bubble_fraction", cost.bubbleFraction},
      {"params", totalParams(program.model, mapping.paddedVocab)},
      {"params_unpadded", totalParams(program.model, program.model.vocab)},
      {"padded_vocab", mapping.paddedVocab},
      {"links", std::move(links)},
      {"gpu_memory", program.cluster.gpuMemory},
      {"stages", std::move(stages)},
      {"max_rank_bytes", bytes(memory.maxRankBytes())},
      {"fits", memory.fits()},
      {"tokens_per_step", cost.tokensPerStep},
      {"step_flops", cost.modelFlops},
      {"step_flops_with_recompute", cost.hardwareFlops},
      {"communication", std::move(traffic)},
      {"compute_time_estimate_s", cost.breakdown.compute + cost.breakdown.recompute},
      {"step_time_estimate_s", cost.stepSeconds},
      {"step_time_breakdown", std::move(breakdown)},
      {"mfu_estimate", cost.mfu},
      {"hfu_estimate", cost.hfu},
      {"tokens_per_second", cost.tokensPerSecond},
      {"train_time_s", cost.trainSeconds > 0 ? llvm::json::Value(cost.trainSeconds) : nullptr},
  };
  if (ExpertSummary e = expertSummary(program, mapping, memory); e.block) {
    out["ep"] = mapping.ep;
    out["experts"] = llvm::json::Object{
        {"moe_blocks", e.moeBlocks},
        {"experts", e.block->moe.experts},
        {"top_k", e.block->moe.topK},
        {"experts_per_rank", e.expertsPerRank},
        {"expert_dp", mapping.expertDp()},
        {"active_params", activeParams(program.model, mapping.paddedVocab)},
        {"rows_balanced", e.rows.expected},
        {"rows_bound", e.rows.bound},
        {"dropless", e.block->moe.dropless()},
        {"worst_case_extra_bytes", bytes(e.worstExtra)},
    };
  }
  return out;
}

} // namespace

llvm::json::Value reportToJSON(const Program &program, const Mapping &mapping) {
  std::vector<GroupList> lists = groupLists(program, mapping);
  llvm::json::Object out = reportWithoutGroups(program, mapping, lists);
  llvm::json::Object groups;
  for (GroupList &list : lists) {
    llvm::json::Array all;
    for (const std::vector<int64_t> &g : list.groups)
      all.push_back(llvm::json::Array(g));
    groups[list.name] = std::move(all);
  }
  out["groups"] = std::move(groups);
  return out;
}

void writeReportJSON(const Program &program, const Mapping &mapping, llvm::raw_ostream &os) {
  const std::vector<GroupList> lists = groupLists(program, mapping);
  llvm::json::Object out = reportWithoutGroups(program, mapping, lists);
  out["groups"] = nullptr; // where the streamed groups go in the sorted keys
  std::vector<const llvm::json::Object::value_type *> fields;
  for (const llvm::json::Object::value_type &field : out)
    fields.push_back(&field);
  llvm::sort(fields, [](const auto *a, const auto *b) { return a->first < b->first; });
  llvm::json::OStream json(os, 2);
  json.object([&] {
    for (const llvm::json::Object::value_type *field : fields) {
      if (field->first != "groups") {
        json.attribute(field->first, field->second);
        continue;
      }
      json.attributeObject("groups", [&] {
        for (const GroupList &list : lists)
          json.attributeArray(list.name, [&] {
            // One line per group: the groups are most of a large job's report, and a
            // line per rank made them most of its time too.
            for (const std::vector<int64_t> &g : list.groups)
              json.rawValue([&g](llvm::raw_ostream &out) {
                out << '[';
                llvm::ListSeparator separator(", ");
                for (int64_t rank : g)
                  out << separator << rank;
                out << ']';
              });
          });
      });
    }
  });
  os << "\n";
}

llvm::json::Object breakdownToJSON(const StepBreakdown &breakdown) {
  llvm::json::Object out;
  for (auto [name, seconds] : breakdownParts(breakdown))
    out[std::string(name) + "_s"] = seconds;
  return out;
}

void printComparison(const std::vector<std::pair<Program, Mapping>> &jobs,
                     llvm::raw_ostream &os) {
  std::vector<std::vector<std::string>> rows = {{"mapping"}};
  auto add = [&](const char *label, const std::function<std::string(const Program &,
                                                                    const Mapping &,
                                                                    const CostEstimate &,
                                                                    const MemoryEstimate &)> &cell) {
    rows.push_back({label});
    for (const auto &[program, mapping] : jobs) {
      (void)program;
      rows.back().push_back("");
    }
    return std::make_pair(rows.size() - 1, cell);
  };
  std::vector<std::pair<size_t, std::function<std::string(const Program &, const Mapping &,
                                                          const CostEstimate &,
                                                          const MemoryEstimate &)>>>
      fields;
  using P = const Program &;
  using M = const Mapping &;
  using C = const CostEstimate &;
  using E = const MemoryEstimate &;
  fields.push_back(add("tp x pp x dp", [](P, M m, C, E) {
    return std::to_string(m.tp) + " x " + std::to_string(m.pp) + " x " + std::to_string(m.dp) +
           (m.cp > 1 ? " (cp " + std::to_string(m.cp) + ")" : "");
  }));
  fields.push_back(add("micro_batch, M", [](P, M m, C, E) {
    return std::to_string(m.microBatch) + ", " + std::to_string(m.microbatches);
  }));
  fields.push_back(add("schedule", [](P p, M, C, E) { return p.parallel.scheduleText(); }));
  fields.push_back(add("zero, recompute", [](P p, M, C, E) {
    return std::to_string(p.parallel.zero) + ", " + toString(p.parallel.recompute) +
           (p.parallel.sequenceParallel ? ", sp" : "");
  }));
  fields.push_back(add("largest rank", [](P, M, C, E mem) {
    return formatBytes(mem.maxRankBytes()) + (mem.fits() ? "" : " (does not fit)");
  }));
  bool anyContext = std::any_of(jobs.begin(), jobs.end(),
                                [](const auto &job) { return job.second.cp > 1; });
  for (const char *part : {"compute", "recompute", "bubble", "tp", "pp", "dp", "cp", "optimizer"}) {
    if (llvm::StringRef(part) == "cp" && !anyContext)
      continue;
    fields.push_back(add(part, [part](P, M, C c, E) {
      for (auto [name, seconds] : breakdownParts(c.breakdown))
        if (llvm::StringRef(name) == part)
          return formatQuantity(seconds, Dimension::time());
      return std::string();
    }));
  }
  fields.push_back(
      add("step", [](P, M, C c, E) { return formatQuantity(c.stepSeconds, Dimension::time()); }));
  fields.push_back(add("MFU", [](P, M, C c, E) { return formatNumber("%.1f%%", 100 * c.mfu); }));
  fields.push_back(
      add("tokens/s", [](P, M, C c, E) { return formatNumber("%.0f", c.tokensPerSecond); }));
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto &[program, mapping] = jobs[j];
    rows[0].push_back(program.parallel.name.empty() ? "(unnamed)" : program.parallel.name);
    CostEstimate cost = estimateCost(program, mapping);
    MemoryEstimate memory = estimateMemory(program, mapping);
    for (auto &[index, cell] : fields)
      rows[index][j + 1] = cell(program, mapping, cost, memory);
  }
  os << "mappings of " << (jobs.empty() ? "" : jobs.front().first.model.name) << " side by side:\n";
  printTable(os, rows, "l" + std::string(jobs.size(), 'r'));
}

llvm::json::Value comparisonToJSON(const std::vector<std::pair<Program, Mapping>> &jobs) {
  llvm::json::Array list;
  for (const auto &[program, mapping] : jobs) {
    llvm::json::Value report = reportToJSON(program, mapping);
    report.getAsObject()->try_emplace("mapping", program.parallel.name);
    list.push_back(std::move(report));
  }
  return llvm::json::Object{{"mappings", std::move(list)}};
}

} // namespace parc
