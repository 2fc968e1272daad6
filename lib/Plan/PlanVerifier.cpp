//===- PlanVerifier.cpp - The semantic checks of rank plans and manifests -===//
//
// What the reader cannot see field by field: values in range, a rank layout that agrees with
// the coordinates and groups, slices inside their tensors, schedules that run every microbatch
// through every chunk once. Op data flow is checked in PlanDataflow.cpp. Checks run in phases
// and stop at the first failure, so later phases may rely on what earlier ones established
// (sizes positive, indices in range).
//
//===----------------------------------------------------------------------===//

#include "parc/Plan/JSONReader.h"
#include "PlanVerifierInternal.h"
#include "parc/Plan/PlanJSON.h"
#include "parc/Support/CheckedInt.h"
#include "parc/Support/Limits.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>
#include <map>
#include <set>
#include <tuple>

using llvm::Twine;

namespace parc::plan {

using namespace detail;

namespace {

std::string listText(const std::vector<int64_t> &values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

std::string coordsText(const Coords &c) {
  return "(tp " + std::to_string(c.tp) + ", pp " + std::to_string(c.pp) + ", dp " +
         std::to_string(c.dp) + ", cp " + std::to_string(c.cp) + ")";
}

void atLeast(ReadContext &ctx, llvm::StringRef path, int64_t value, int64_t min) {
  if (value < min)
    ctx.fail(path, "must be at least " + Twine(min) + ", got " + Twine(value));
}

/// A size of the job no larger than the compiler's limit for it (parc/Support/Limits.h).
void atMost(ReadContext &ctx, llvm::StringRef path, int64_t value, int64_t max) {
  if (value > max)
    ctx.fail(path, Twine(value) + " is more than the limit of " + Twine(max));
}

void inRange(ReadContext &ctx, llvm::StringRef path, int64_t value, int64_t end,
             llvm::StringRef what) {
  if (value < 0 || value >= end)
    ctx.fail(path, Twine(value) + " is outside the " + Twine(end) + " " + what + " (0 to " +
                       Twine(end - 1) + ")");
}

void numberAtLeast(ReadContext &ctx, llvm::StringRef path, double value, double min,
                   bool inclusive) {
  if (!(inclusive ? value >= min : value > min))
    ctx.fail(path, "must be " + Twine(inclusive ? "at least " : "greater than ") + numberText(min) +
                       ", got " + numberText(value));
}

void checkModel(ReadContext &ctx, const std::string &path, const ModelSummary &m,
                const ParallelSummary &p) {
  if (m.dtype == DType::Int64)
    ctx.fail(fieldPath(path, "dtype"), "int64 is not a training dtype; use fp32, bf16 or fp16");
  for (auto [key, value] : {std::pair{"vocab", m.vocab},
                            {"seq", m.seq},
                            {"hidden", m.hidden},
                            {"heads", m.heads},
                            {"kv_heads", m.kvHeads},
                            {"head_dim", m.headDim},
                            {"ffn", m.ffn},
                            {"layers", m.layers}})
    atLeast(ctx, fieldPath(path, key), value, 1);
  for (auto [key, value, max] : {std::tuple{"vocab", m.vocab, limits::MaxVocab},
                                 {"padded_vocab", m.paddedVocab, limits::MaxVocab + 128 * limits::MaxWorld},
                                 {"seq", m.seq, limits::MaxSeq},
                                 {"hidden", m.hidden, limits::MaxHidden},
                                 {"heads", m.heads, limits::MaxHeads},
                                 {"kv_heads", m.kvHeads, limits::MaxHeads},
                                 {"head_dim", m.headDim, limits::MaxHidden},
                                 {"ffn", m.ffn, limits::MaxFFN},
                                 {"layers", m.layers, limits::MaxBlocks}})
    atMost(ctx, fieldPath(path, key), value, max);
  if (ctx.failed())
    return;
  if (m.heads % m.kvHeads != 0)
    ctx.fail(fieldPath(path, "kv_heads"),
             "kv_heads = " + Twine(m.kvHeads) + " does not divide heads = " + Twine(m.heads));
  if (m.paddedVocab < m.vocab || m.paddedVocab % p.tp != 0)
    ctx.fail(fieldPath(path, "padded_vocab"), "padded_vocab = " + Twine(m.paddedVocab) +
                                                  " must be at least vocab = " + Twine(m.vocab) +
                                                  " and a multiple of tp = " + Twine(p.tp));
}

void checkTrain(ReadContext &ctx, const std::string &path, const TrainSettings &t) {
  numberAtLeast(ctx, fieldPath(path, "lr"), t.lr, 0, true);
  for (size_t i = 0; i < 2; ++i)
    if (!(t.betas[i] >= 0 && t.betas[i] < 1))
      ctx.fail(indexPath(fieldPath(path, "betas"), i),
               "must be in [0, 1), got " + numberText(t.betas[i]));
  numberAtLeast(ctx, fieldPath(path, "eps"), t.eps, 0, false);
  if (!(t.momentum >= 0 && t.momentum < 1))
    ctx.fail(fieldPath(path, "momentum"), "must be in [0, 1), got " + numberText(t.momentum));
  numberAtLeast(ctx, fieldPath(path, "weight_decay"), t.weightDecay, 0, true);
  numberAtLeast(ctx, fieldPath(path, "grad_clip"), t.gradClip, 0, true);
  atLeast(ctx, fieldPath(path, "steps"), t.steps, 0);
  atLeast(ctx, fieldPath(path, "seed"), t.seed, 0);
  atLeast(ctx, fieldPath(path, "warmup_steps"), t.warmupSteps, 0);
  if (t.gradDtype == DType::Int64)
    ctx.fail(fieldPath(path, "grad_dtype"), "int64 cannot hold gradients; use fp32");
}

} // namespace

namespace detail {

namespace {
std::optional<Axis> axisOf(Group group) {
  switch (group) {
  case Group::TP:
    return Axis::TP;
  case Group::CP:
    return Axis::CP;
  case Group::DP:
    return Axis::DP;
  case Group::PP:
    return Axis::PP;
  default:
    return std::nullopt;
  }
}

/// The axes a group spans, for the groups that are one RankGrid group.
std::optional<AxisSet> axesOf(Group group) {
  if (group == Group::DPCP)
    return AxisSet{Axis::DP, Axis::CP};
  if (group == Group::Model)
    return AxisSet{Axis::TP, Axis::PP};
  if (std::optional<Axis> axis = axisOf(group))
    return AxisSet{*axis};
  return std::nullopt;
}
} // namespace

RankGrid gridOf(const ParallelSummary &p) {
  std::vector<Axis> order;
  for (Group g : p.order)
    order.push_back(*axisOf(g));
  return RankGrid(axisSizes(p.tp, p.cp, 1, p.dp, p.pp), RankOrder(order));
}

Coords coordsOf(const ParallelSummary &p, int64_t rank) {
  RankGrid grid = gridOf(p);
  return Coords{grid.coord(rank, Axis::TP), grid.coord(rank, Axis::PP),
                grid.coord(rank, Axis::DP), grid.coord(rank, Axis::CP)};
}

static RankGrid expertGridOf(const ParallelSummary &p) {
  std::vector<Axis> order;
  for (Group g : p.order)
    order.push_back(*axisOf(g));
  return expertGrid(p.tp, p.cp, p.ep, p.dp, p.pp, RankOrder(order));
}

/// The size of `kind`'s groups: the embedding group's is the plan's own (2 or none).
static int64_t expectedGroupSize(const ParallelSummary &p, Group kind, int64_t listed) {
  if (kind == Group::EP)
    return p.ep;
  if (kind == Group::ExpertDP)
    return p.dp * p.cp / p.ep;
  return kind == Group::Embedding ? listed : gridOf(p).groupSize(*axesOf(kind));
}

Groups expectedGroups(const ParallelSummary &p, const ModelSummary &m, int64_t rank) {
  RankGrid grid = gridOf(p), experts = expertGridOf(p);
  Groups groups;
  for (Group kind : kAllGroups)
    if (std::optional<AxisSet> axes = axesOf(kind))
      groups.get(kind) = grid.group(rank, *axes);
  groups.ep = experts.group(rank, {Axis::EP});
  groups.expertDp = experts.group(rank, {Axis::DP});
  llvm::sort(groups.model);
  int64_t stage = grid.coord(rank, Axis::PP);
  if (m.tiedEmbeddings && p.pp > 1 && (stage == 0 || stage == p.pp - 1))
    groups.embedding = {groups.pp.front(), groups.pp.back()};
  return groups;
}

bool checkJob(ReadContext &ctx, int64_t world, const ModelSummary &model,
              const ClusterSummary &cluster, const ParallelSummary &p, const TrainSettings &train) {
  atLeast(ctx, "world", world, 1);
  atLeast(ctx, "cluster.nodes", cluster.nodes, 1);
  atLeast(ctx, "cluster.gpus_per_node", cluster.gpusPerNode, 1);
  for (auto [key, value] : {std::pair{"parallel.tp", p.tp},
                            {"parallel.pp", p.pp},
                            {"parallel.dp", p.dp},
                            {"parallel.cp", p.cp},
                            {"parallel.chunks", p.chunks},
                            {"parallel.micro_batch", p.microBatch},
                            {"parallel.microbatches", p.microbatches}})
    atLeast(ctx, key, value, 1);
  for (auto [key, value, max] : {std::tuple{"world", world, limits::MaxWorld},
                                 {"cluster.nodes", cluster.nodes, limits::MaxNodes},
                                 {"cluster.gpus_per_node", cluster.gpusPerNode,
                                  limits::MaxGpusPerNode},
                                 {"parallel.chunks", p.chunks, limits::MaxBlocks},
                                 {"parallel.micro_batch", p.microBatch, limits::MaxMicroBatch},
                                 {"parallel.microbatches", p.microbatches,
                                  limits::MaxMicrobatches}})
    atMost(ctx, key, value, max);
  if (ctx.failed())
    return false;
  std::optional<int64_t> gpus = checkedMul(cluster.nodes, cluster.gpusPerNode);
  if (!gpus || world > *gpus)
    return ctx.fail("world", Twine(world) + " ranks do not fit on " + Twine(cluster.nodes) + " x " +
                                 Twine(cluster.gpusPerNode) + " GPUs");
  std::optional<int64_t> product = checkedMul(p.tp, p.pp);
  for (int64_t size : {p.dp, p.cp})
    product = product ? checkedMul(*product, size) : std::nullopt;
  if (!product || *product != world)
    return ctx.fail("world", Twine(world) + " ranks but tp x pp x dp x cp = " + Twine(p.tp) +
                                 " x " + Twine(p.pp) + " x " + Twine(p.dp) + " x " + Twine(p.cp));
  if (p.ep < 1 || (p.dp * p.cp) % p.ep != 0)
    return ctx.fail("parallel.ep", "ep = " + Twine(p.ep) + " must be at least 1 and divide dp x " +
                                       "cp = " + Twine(p.dp * p.cp) + ", which it is carved from");
  std::optional<int64_t> perReplica = checkedMul(p.microBatch, p.microbatches);
  std::optional<int64_t> batch = perReplica ? checkedMul(*perReplica, p.dp) : std::nullopt;
  if (!batch || *batch != p.globalBatch)
    ctx.fail("parallel.global_batch", "global_batch = " + Twine(p.globalBatch) +
                                          " is not micro_batch x microbatches " +
                                          "x dp = " + Twine(p.microBatch) + " x " +
                                          Twine(p.microbatches) + " x " + Twine(p.dp));
  for (Group axis : p.order)
    if (!axisOf(axis))
      ctx.fail("parallel.order", "'" + spelling(axis) +
                                     "' is not an axis; order lists tp, cp, "
                                     "dp and pp, fastest-varying first");
  if (!ctx.failed())
    for (Group axis : {Group::TP, Group::CP, Group::DP, Group::PP})
      if (llvm::count(p.order, axis) != 1) {
        ctx.fail("parallel.order", "must list each of tp, cp, dp and pp exactly once");
        break;
      }
  if (p.zero < 0 || p.zero > 3)
    ctx.fail("parallel.zero", "ZeRO stage " + Twine(p.zero) + " does not exist; use 0 to 3");
  if (p.bucketSize < 1)
    ctx.fail("parallel.bucket_size", "must be at least 1, got " + Twine(p.bucketSize));
  if (p.chunks > 1 && p.schedule != Schedule::Interleaved)
    ctx.fail("parallel.chunks", Twine(p.chunks) + " chunks per stage need the interleaved "
                                                  "schedule");
  if (!ctx.failed())
    checkModel(ctx, "model", model, p);
  checkTrain(ctx, "train", train);
  return !ctx.failed();
}

bool checkPlanId(ReadContext &ctx, const std::string &planId) {
  if (planId.empty() || !llvm::all_of(planId, [](char c) { return llvm::isHexDigit(c); }))
    return ctx.fail("plan_id", "expected the hexadecimal plan hash, got \"" + planId + "\"");
  return true;
}

bool checkPlacement(ReadContext &ctx, const std::string &path, int64_t rank, int64_t node,
                    int64_t localRank, const Coords &coords, int64_t world,
                    const ClusterSummary &cluster, const ParallelSummary &p) {
  inRange(ctx, fieldPath(path, "rank"), rank, world, "ranks of the world");
  inRange(ctx, fieldPath(path, "node"), node, cluster.nodes, "nodes of the cluster");
  inRange(ctx, fieldPath(path, "local_rank"), localRank, cluster.gpusPerNode, "GPUs of a node");
  if (!ctx.failed() && node * cluster.gpusPerNode + localRank != rank)
    ctx.fail(fieldPath(path, "node"), "rank " + Twine(rank) + " runs on node " +
                                          Twine(rank / cluster.gpusPerNode) + " as local rank " +
                                          Twine(rank % cluster.gpusPerNode) + ", not node " +
                                          Twine(node) + " local rank " + Twine(localRank));
  inRange(ctx, fieldPath(path, "coords.tp"), coords.tp, p.tp, "tp ranks");
  inRange(ctx, fieldPath(path, "coords.pp"), coords.pp, p.pp, "pipeline stages");
  inRange(ctx, fieldPath(path, "coords.dp"), coords.dp, p.dp, "dp ranks");
  inRange(ctx, fieldPath(path, "coords.cp"), coords.cp, p.cp, "cp ranks");
  if (ctx.failed())
    return false;
  Coords expected = coordsOf(p, rank);
  if (expected.tp != coords.tp || expected.pp != coords.pp || expected.dp != coords.dp ||
      expected.cp != coords.cp)
    return ctx.fail(fieldPath(path, "coords"),
                    coordsText(coords) + " do not match rank " + Twine(rank) +
                        ", which the parallel.order layout puts at " + coordsText(expected));
  return true;
}

} // namespace detail

namespace {

void checkGroups(ReadContext &ctx, const RankPlan &plan) {
  const ParallelSummary &p = plan.parallel;
  for (Group kind : kAllGroups) {
    std::string path = fieldPath("groups", spelling(kind));
    const std::vector<int64_t> &group = plan.groups.get(kind);
    std::set<int64_t> seen;
    for (size_t i = 0; i < group.size() && !ctx.failed(); ++i) {
      inRange(ctx, indexPath(path, i), group[i], plan.world, "ranks of the world");
      if (!seen.insert(group[i]).second)
        ctx.fail(indexPath(path, i), "rank " + Twine(group[i]) + " is listed twice");
    }
    if (!group.empty() && !seen.count(plan.rank))
      ctx.fail(path, listText(group) + " does not contain this rank (" + Twine(plan.rank) +
                         "); a rank's group lists must include the rank itself");
    // Sizes first, so that the layout's lists below are no longer than the plan's own.
    int64_t size = expectedGroupSize(p, kind, int64_t(group.size()));
    if (int64_t(group.size()) != size)
      ctx.fail(path, "has " + Twine(group.size()) + " ranks but the layout gives " + Twine(size));
  }
  if (ctx.failed())
    return;
  Groups expected = expectedGroups(p, plan.model, plan.rank);
  for (Group kind : kAllGroups)
    if (!ctx.failed() && plan.groups.get(kind) != expected.get(kind))
      ctx.fail(fieldPath("groups", spelling(kind)), "expected " + listText(expected.get(kind)) +
                                                        " from the rank layout, got " +
                                                        listText(plan.groups.get(kind)));
}

void checkParams(ReadContext &ctx, const RankPlan &plan) {
  llvm::StringSet<> names;
  for (size_t i = 0; i < plan.params.size() && !ctx.failed(); ++i) {
    const ParamShard &param = plan.params[i];
    // Built only for a message: a large plan has many parameters.
    auto path = [&] { return indexPath("params", i); };
    if (param.name.empty())
      ctx.fail(fieldPath(path(), "name"), "a parameter needs a name");
    else if (llvm::StringRef(param.name).endswith(".grad"))
      ctx.fail(fieldPath(path(), "name"), "'" + param.name + "' ends in \".grad\", which " +
                                              "names gradients in op lists; rename it");
    else if (!names.insert(param.name).second)
      ctx.fail(fieldPath(path(), "name"), "parameter '" + param.name + "' is listed twice");
    if (param.dtype != plan.model.dtype)
      ctx.fail(fieldPath(path(), "dtype"), spelling(param.dtype) + " is not the model dtype, " +
                                               spelling(plan.model.dtype));
    if (param.shape.empty())
      ctx.fail(fieldPath(path(), "shape"), "a parameter has at least one dimension");
    for (size_t d = 0; d < param.shape.size(); ++d)
      if (param.shape[d] < 1)
        atLeast(ctx, indexPath(fieldPath(path(), "shape"), d), param.shape[d], 1);
    if (param.slice.size() != param.shape.size())
      ctx.fail(fieldPath(path(), "slice"), "has " + Twine(param.slice.size()) +
                                               " entries but the shape has " +
                                               Twine(param.shape.size()) + " dimensions");
    if (!ctx.failed() && !elementCount(param.shape))
      ctx.fail(fieldPath(path(), "shape"), shapeText(param.shape) + " holds more than 2^48 " +
                                               "elements, the most a tensor may hold");
    if (!ctx.failed() && param.kind == ShardKind::Vocab &&
        (param.shape.size() != 2 || param.shape[0] != plan.model.paddedVocab ||
         param.shape[1] != plan.model.hidden))
      ctx.fail(fieldPath(path(), "shape"),
               "a vocab parameter is the table [padded_vocab, hidden] = [" +
                   Twine(plan.model.paddedVocab) + ", " + Twine(plan.model.hidden) + "], got " +
                   shapeText(param.shape));
    if (ctx.failed())
      return;
    size_t rank = param.shape.size();
    for (size_t d = 0; d < rank; ++d) {
      const Slice &s = param.slice[d];
      auto slicePath = [&] { return indexPath(fieldPath(path(), "slice"), d); };
      std::optional<int64_t> end = checkedAdd(s.offset, s.size);
      if (s.offset < 0 || s.size < 1 || !end || *end > param.shape[d])
        ctx.fail(slicePath(), "slice [" + Twine(s.offset) + ", " + Twine(s.offset) + " + " +
                                  Twine(s.size) + ") lies outside dimension " + Twine(d) +
                                  " of size " + Twine(param.shape[d]));
      bool split = s.size != param.shape[d];
      // Column splits the output features: dim 0 of a matrix or bias, dim 1 of stacked
      // experts [experts, out, in].
      size_t columnDim = rank == 3 ? 1 : 0;
      bool mayBeSplit = param.kind == ShardKind::Column  ? d == columnDim
                        : param.kind == ShardKind::Vocab ? d == 0
                                                         : param.kind == ShardKind::Row && d == rank - 1;
      // Expert parallelism: each ep rank holds experts / ep of the stacked experts.
      bool expertSplit = rank == 3 && d == 0 && param.kind != ShardKind::Vocab &&
                         param.kind != ShardKind::Replicated;
      if (split && expertSplit && s.size * plan.parallel.ep != param.shape[0])
        ctx.fail(slicePath(), "stacked experts are split over ep = " + Twine(plan.parallel.ep) +
                                  ": expected " + Twine(param.shape[0] / plan.parallel.ep) +
                                  " experts, got " + Twine(s.size));
      else if (split && !mayBeSplit && !expertSplit)
        ctx.fail(slicePath(), "a " + spelling(param.kind) + " parameter is not split along " +
                                  "dimension " + Twine(d) + "; column splits dim 0 (dim 1 of " +
                                  "stacked experts), vocab dim 0, row the last, ep dim 0 of " +
                                  "stacked experts, replicated none");
    }
    if (param.init.kind == InitKind::Normal &&
        !(param.init.std > 0 && std::isfinite(param.init.std)))
      ctx.fail(fieldPath(path(), "init.std"),
               "must be positive, got " + numberText(param.init.std));
    // Only the vocabulary's padding starts at zero: rows other than the model's vocabulary
    // would train another model with exit 0.
    bool padded = param.kind == ShardKind::Vocab && plan.model.vocab < plan.model.paddedVocab;
    int64_t rows = padded ? plan.model.vocab : 0;
    if (param.init.kind == InitKind::Normal && param.init.rows != rows)
      ctx.fail(fieldPath(path(), "init.rows"),
               padded ? "expected " + Twine(rows) + ", the model's vocabulary (model.vocab) within " +
                            "the padded " + Twine(plan.model.paddedVocab) + ", got " +
                            Twine(param.init.rows)
                      : "expected 0 (every row drawn): only a padded vocabulary table starts " +
                            Twine("rows at zero, got ") + Twine(param.init.rows));
  }
}

void checkChunkLayout(ReadContext &ctx, const RankPlan &plan) {
  const ParallelSummary &p = plan.parallel;
  if (int64_t(plan.chunks.size()) != p.chunks)
    ctx.fail("chunks", "has " + Twine(plan.chunks.size()) +
                           " entries but parallel.chunks = " + Twine(p.chunks));
  int64_t lastVirtual = p.pp * p.chunks - 1;
  for (size_t i = 0; i < plan.chunks.size() && !ctx.failed(); ++i) {
    const Chunk &c = plan.chunks[i];
    std::string path = indexPath("chunks", i);
    int64_t stage = int64_t(i) * p.pp + plan.coords.pp;
    if (c.index != int64_t(i))
      ctx.fail(fieldPath(path, "index"), "chunk " + Twine(i) + " says index " + Twine(c.index));
    if (c.virtualStage != stage)
      ctx.fail(fieldPath(path, "virtual_stage"), "chunk " + Twine(i) + " of pipeline stage " +
                                                     Twine(plan.coords.pp) + " is virtual stage " +
                                                     Twine(stage) + " (chunk x pp + stage), got " +
                                                     Twine(c.virtualStage));
    if (c.hasEmbedding != (stage == 0))
      ctx.fail(fieldPath(path, "has_embedding"),
               "the embedding belongs to virtual stage 0 " + Twine("and no other"));
    if (c.hasHead != (stage == lastVirtual))
      ctx.fail(fieldPath(path, "has_head"), "the head belongs to the last virtual stage (" +
                                                Twine(lastVirtual) + ") and no other");
    if (c.firstBlock < 0 || c.lastBlock < c.firstBlock - 1 || c.lastBlock >= plan.model.layers)
      ctx.fail(fieldPath(path, "last_block"),
               "blocks " + Twine(c.firstBlock) + " to " + Twine(c.lastBlock) +
                   " are not a range of the model's " + Twine(plan.model.layers) +
                   " blocks; an empty chunk has last_block = first_block - 1");
    if (c.input.empty() != (stage == 0))
      ctx.fail(fieldPath(path, "input"), stage == 0 ? "virtual stage 0 receives no activation"
                                                    : "names the activation this chunk "
                                                      "receives; it must not be empty");
    if (c.output.empty() != c.hasHead)
      ctx.fail(fieldPath(path, "output"), c.hasHead ? "the last virtual stage sends no "
                                                      "activation; it produces \"loss\""
                                                    : "names the activation this chunk "
                                                      "sends; it must not be empty");
  }
}

/// Ops and instructions within MaxPlanEntries, before any check walks them.
bool checkPlanSize(ReadContext &ctx, const RankPlan &plan) {
  int64_t entries = int64_t(plan.schedule.size());
  for (const Chunk &chunk : plan.chunks)
    entries += int64_t(chunk.forward.size() + chunk.backward.size());
  if (entries <= limits::MaxPlanEntries)
    return true;
  return ctx.fail("", "holds " + Twine(entries) + " ops and instructions, more than the limit " +
                          "of " + Twine(limits::MaxPlanEntries) + " per rank plan");
}

} // namespace

llvm::Error verifyRankPlan(const RankPlan &plan) {
  ReadContext ctx("rank plan");
  if (checkPlanId(ctx, plan.planId) && checkPlanSize(ctx, plan) &&
      checkJob(ctx, plan.world, plan.model, plan.cluster, plan.parallel, plan.train) &&
      checkPlacement(ctx, "", plan.rank, plan.node, plan.localRank, plan.coords, plan.world,
                     plan.cluster, plan.parallel)) {
    checkGroups(ctx, plan);
    if (!ctx.failed())
      checkParams(ctx, plan);
    if (!ctx.failed())
      checkChunkLayout(ctx, plan);
    if (!ctx.failed())
      checkDataflow(ctx, plan);
    if (!ctx.failed())
      checkSchedule(ctx, plan);
  }
  return ctx.takeError();
}

llvm::Error verifyManifest(const Manifest &manifest) {
  ReadContext ctx("plan manifest");
  if (!checkPlanId(ctx, manifest.planId) ||
      !checkJob(ctx, manifest.world, manifest.model, manifest.cluster, manifest.parallel,
                manifest.train))
    return ctx.takeError();
  if (int64_t(manifest.ranks.size()) != manifest.world)
    ctx.fail("ranks", "lists " + Twine(manifest.ranks.size()) +
                          " ranks but world = " + Twine(manifest.world));
  llvm::StringSet<> files;
  for (size_t i = 0; i < manifest.ranks.size() && !ctx.failed(); ++i) {
    const RankEntry &entry = manifest.ranks[i];
    std::string path = indexPath("ranks", i);
    if (entry.rank != int64_t(i))
      ctx.fail(fieldPath(path, "rank"), "entry " + Twine(i) + " must describe rank " + Twine(i) +
                                            ", got " + Twine(entry.rank));
    checkPlacement(ctx, path, entry.rank, entry.node, entry.localRank, entry.coords, manifest.world,
                   manifest.cluster, manifest.parallel);
    llvm::StringRef file = entry.file;
    if (file.empty() || file.startswith("/") || file.contains('\\') || file == ".." ||
        file.startswith("../") || file.contains("/../") || file.endswith("/.."))
      ctx.fail(fieldPath(path, "file"), "\"" + entry.file + "\" is not a path relative to " +
                                            "the manifest's directory and inside it");
    else if (!files.insert(file).second)
      ctx.fail(fieldPath(path, "file"), "\"" + entry.file + "\" is listed for two ranks");
  }
  return ctx.takeError();
}

} // namespace parc::plan
