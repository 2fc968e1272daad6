//===- ProgramBuilder.cpp - Resolved blocks -> typed Program --------------===//
#include "parc/Sema/GPUKinds.h"
#include "parc/Sema/Sema.h"

#include "llvm/Support/Format.h"

#include <algorithm>

namespace parc {

const char *toString(DType d) {
  return d == DType::FP32 ? "fp32" : d == DType::BF16 ? "bf16" : "fp16";
}
const char *toString(Norm n) { return n == Norm::LayerNorm ? "layernorm" : "rmsnorm"; }
llvm::ArrayRef<llvm::StringRef> mlpKindWords() {
  static const llvm::StringRef words[] = {"gelu", "swiglu", "geglu"};
  return words;
}
const char *toString(MLPKind m) { return mlpKindWords()[size_t(m)].data(); }
const char *toString(GELUForm g) { return g == GELUForm::Exact ? "none" : "tanh"; }
const char *toString(Position p) { return p == Position::Learned ? "learned" : "rope"; }
const char *toString(LinearBias b) {
  return b == LinearBias::All ? "all" : b == LinearBias::QKV ? "qkv" : "none";
}
const char *toString(Residual r) { return r == Residual::Sequential ? "sequential" : "parallel"; }
MLPKind mlpKindOf(llvm::StringRef word) {
  llvm::ArrayRef<llvm::StringRef> words = mlpKindWords();
  auto it = std::find(words.begin(), words.end(), word);
  return it == words.end() ? MLPKind::GELU : MLPKind(it - words.begin());
}
const char *toString(ScheduleKind s) {
  return s == ScheduleKind::GPipe ? "gpipe" : s == ScheduleKind::OneFOneB ? "1f1b" : "interleaved";
}
const char *toString(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}
const char *toString(Optimizer o) { return o == Optimizer::Adam ? "adam" : "sgd"; }
const char *toString(Attention a) { return a == Attention::Flash ? "flash" : "standard"; }
const char *toString(GPUKind k) {
  const GPUDatasheet *row = datasheetOf(k);
  return row ? row->spelling.data() : "generic";
}
const char *toString(IntraNodeKind k) { return k == IntraNodeKind::NVLink ? "nvlink" : "pcie"; }
int64_t bytesPerElement(DType d) { return d == DType::FP32 ? 4 : 2; }

bool Choices::allows(int64_t v) const {
  return v >= lo && v <= hi && (values.empty() || llvm::is_contained(values, v));
}

namespace {
/// The fields `auto` may open, as a parallel block spells them; chunks are written inside
/// `interleaved(...)`.
constexpr std::pair<const char *, Choices SearchSpace::*> kSearchFields[] = {
    {"tp", &SearchSpace::tp},
    {"pp", &SearchSpace::pp},
    {"dp", &SearchSpace::dp},
    {"cp", &SearchSpace::cp},
    {"ep", &SearchSpace::ep},
    {"micro_batch", &SearchSpace::microBatch},
    {"zero", &SearchSpace::zero},
    {"recompute", &SearchSpace::recompute},
    {"sequence_parallel", &SearchSpace::sequenceParallel},
    {"order", &SearchSpace::order},
    {"schedule", &SearchSpace::schedule},
};
} // namespace

bool SearchSpace::searches() const { return !openFields().empty(); }

std::vector<std::string> SearchSpace::openFields() const {
  std::vector<std::string> out;
  for (auto [name, member] : kSearchFields)
    if ((this->*member).open && member != &SearchSpace::dp)
      out.push_back(name);
  if (chunks.open && !schedule.open)
    out.push_back("chunks");
  return out;
}

const std::vector<RankOrder> &allOrders() {
  static const std::vector<RankOrder> orders = [] {
    std::vector<RankOrder> out;
    for (std::vector<Axis> axes : {std::vector<Axis>{Axis::TP, Axis::CP, Axis::DP, Axis::PP},
                                   std::vector<Axis>{Axis::TP, Axis::DP, Axis::PP}}) {
      std::vector<Axis> permutation = axes;
      std::sort(permutation.begin(), permutation.end());
      do
        out.push_back(RankOrder(permutation));
      while (std::next_permutation(permutation.begin(), permutation.end()));
    }
    return out;
  }();
  return orders;
}

std::string ParallelSpec::scheduleText() const {
  std::string s = toString(schedule);
  if (schedule == ScheduleKind::Interleaved)
    s += "(chunks = " + std::to_string(chunks) + ")";
  return s;
}

int64_t orderCode(const RankOrder &order) {
  std::vector<Axis> named;
  for (Axis a : order.namedAxes())
    if (a != Axis::EP)
      named.push_back(a);
  const std::vector<RankOrder> &orders = allOrders();
  return std::find(orders.begin(), orders.end(), RankOrder(named)) - orders.begin();
}

int64_t ModelSpec::numBlocks() const {
  int64_t n = 0;
  for (const LayerGroup &g : layers)
    if (g.kind == LayerGroup::Transformer)
      n += g.count;
  return n;
}

bool ModelSpec::hasExperts() const {
  return llvm::any_of(layers, [](const LayerGroup &g) {
    return g.kind == LayerGroup::Transformer && g.moe.enabled();
  });
}

std::string MoESpec::fieldsText() const {
  if (!enabled())
    return "";
  std::string out;
  llvm::raw_string_ostream os(out);
  os << ", experts = " << experts << ", top_k = " << topK << ", moe_ffn = " << ffn;
  if (sharedExperts)
    os << ", shared_experts = " << sharedExperts;
  os << ", normalize_top_k = " << (normalizeTopK ? "true" : "false")
     << ", aux_loss = " << llvm::format("%g", auxLoss) << ", capacity = ";
  if (dropless())
    os << "dropless";
  else
    os << llvm::format("%g", capacity);
  return os.str();
}

bool ModelSpec::tiedHead() const { return !layers.empty() && !layers.back().tiedTo.empty(); }

const LayerGroup &ModelSpec::blockGroup(int64_t i) const {
  for (const LayerGroup &g : layers) {
    if (g.kind != LayerGroup::Transformer)
      continue;
    if (i < g.count)
      return g;
    i -= g.count;
  }
  return layers.back();
}

std::string Value::str() const {
  std::string out;
  llvm::raw_string_ostream os(out);
  switch (kind) {
  case Number:
    if (isInt)
      os << i;
    else
      os << llvm::format("%.15g", r);
    if (!dim.isNone())
      os << " " << dim.baseUnit();
    break;
  case Word:
  case Order:
    os << word;
    break;
  case Schedule:
    os << word;
    if (word == "interleaved" && chunks > 0)
      os << "(chunks = " << chunks << ")";
    else if (word == "interleaved" && !elems.empty())
      os << "(chunks = " << elems.front().str() << ")";
    break;
  case List:
    os << "[";
    for (size_t k = 0; k < elems.size(); ++k)
      os << (k ? ", " : "") << elems[k].str();
    os << "]";
    break;
  case Auto: {
    std::vector<std::string> parts;
    for (const Value &e : elems)
      parts.push_back(e.str());
    if (hasLo)
      parts.push_back(">= " + std::to_string(lo));
    if (hasHi)
      parts.push_back("<= " + std::to_string(hi));
    os << "auto";
    if (!parts.empty()) {
      os << "(";
      for (size_t k = 0; k < parts.size(); ++k)
        os << (k ? ", " : "") << parts[k];
      os << ")";
    }
    break;
  }
  }
  return os.str();
}

namespace {

struct FieldReader {
  const ResolvedBlock &block;
  int64_t integer(llvm::StringRef name) const {
    const ResolvedField *f = block.field(name);
    return f && f->value.kind == Value::Number ? f->value.i : 0;
  }
  double real(llvm::StringRef name) const {
    const ResolvedField *f = block.field(name);
    return f && f->value.kind == Value::Number ? f->value.asDouble() : 0;
  }
  std::string word(llvm::StringRef name) const {
    const ResolvedField *f = block.field(name);
    return f ? f->value.word : "";
  }
  DType dtype(llvm::StringRef name) const {
    std::string w = word(name);
    return w == "fp32" ? DType::FP32 : w == "fp16" ? DType::FP16 : DType::BF16;
  }
  bool flag(llvm::StringRef name) const { return word(name) == "true"; }
  const Value *autoValue(llvm::StringRef name) const {
    const ResolvedField *f = block.field(name);
    return f && f->value.isAuto() ? &f->value : nullptr;
  }
  LinkSpec link(llvm::StringRef name) const {
    const ResolvedBlock *b = block.nestedBlock(name);
    if (!b)
      return {};
    FieldReader r{*b};
    return {r.real("bandwidth"), r.real("latency")};
  }
};

} // namespace

namespace {

ScheduleKind scheduleKindOf(llvm::StringRef word) {
  return word == "gpipe" ? ScheduleKind::GPipe
         : word == "1f1b" ? ScheduleKind::OneFOneB
                          : ScheduleKind::Interleaved;
}

Recompute recomputeOf(llvm::StringRef word) {
  return word == "full" ? Recompute::Full : word == "selective" ? Recompute::Selective
                                                                : Recompute::None;
}

/// The code a listed value of field `name` stands for in its Choices.
int64_t choiceCode(llvm::StringRef name, const Value &v) {
  if (name == "recompute")
    return int64_t(recomputeOf(v.word));
  if (name == "sequence_parallel")
    return v.word == "true";
  if (name == "schedule")
    return int64_t(scheduleKindOf(v.word));
  if (name == "order")
    return orderCode(v.order);
  return v.i;
}

Choices choicesOf(llvm::StringRef name, const Value &v) {
  Choices c;
  c.open = true;
  for (const Value &e : v.elems)
    c.values.push_back(choiceCode(name, e));
  if (v.hasLo)
    c.lo = v.lo;
  if (v.hasHi)
    c.hi = v.hi;
  return c;
}

/// The choices of every `auto` field of a parallel block.
void fillSearchSpace(const ResolvedBlock &block, SearchSpace &space) {
  for (auto [name, member] : kSearchFields)
    if (const ResolvedField *f = block.field(name); f && f->value.isAuto())
      space.*member = choicesOf(name, f->value);
  // interleaved(chunks = auto ...), written alone or listed in schedule = auto(...).
  const ResolvedField *schedule = block.field("schedule");
  if (!schedule)
    return;
  std::vector<const Value *> interleaved;
  if (schedule->value.kind == Value::Schedule)
    interleaved.push_back(&schedule->value);
  for (const Value &e : schedule->value.elems)
    if (e.kind == Value::Schedule)
      interleaved.push_back(&e);
  for (const Value *v : interleaved) {
    if (v->word != "interleaved")
      continue;
    if (v->chunks == 0 && !v->elems.empty()) {
      space.chunks = choicesOf("chunks", v->elems.front());
    } else if (space.schedule.open) {
      space.chunks.open = true;
      space.chunks.values.push_back(v->chunks);
    }
  }
  if (schedule->value.kind == Value::Schedule && schedule->value.chunks == 0) {
    space.schedule.open = true;
    space.schedule.values = {int64_t(ScheduleKind::Interleaved)};
  }
  if (space.schedule.open && !space.chunks.open)
    space.chunks.open = true; // `schedule = auto`: any chunk count
}

} // namespace

void fillModel(const ResolvedBlock &modelBlock, ModelSpec &model) {
  FieldReader m{modelBlock};
  model.name = modelBlock.name;
  model.nameRange = modelBlock.headerRange;
  model.dtype = m.dtype("dtype");
  model.vocab = m.integer("vocab");
  model.seq = m.integer("seq");
  model.hidden = m.integer("hidden");
  model.heads = m.integer("heads");
  model.kvHeads = m.integer("kv_heads");
  model.ffn = m.integer("ffn");
  model.norm = m.word("norm") == "rmsnorm" ? Norm::RMSNorm : Norm::LayerNorm;
  model.mlp = mlpKindOf(m.word("mlp"));
  model.position = m.word("position") == "rope" ? Position::RoPE : Position::Learned;
  model.attention = m.word("attention") == "standard" ? Attention::Standard : Attention::Flash;
  model.dropout = m.real("dropout");
  model.headDim = m.integer("head_dim");
  // GPT-2's LayerNorm models have biases everywhere, Llama's RMSNorm models none.
  std::string bias = m.word("bias");
  model.bias = bias == "qkv"    ? LinearBias::QKV
               : bias == "none" ? LinearBias::None
               : bias == "all" || model.norm == Norm::LayerNorm ? LinearBias::All
                                                                : LinearBias::None;
  model.gelu = m.word("gelu_approx") == "tanh" ? GELUForm::Tanh : GELUForm::Exact;
  model.residual = m.word("residual") == "parallel" ? Residual::Parallel : Residual::Sequential;
  model.normEps = m.real("norm_eps");
  model.ropeTheta = m.real("rope_theta");
  model.rotaryFraction = m.real("rotary_fraction");
  model.maxPositions = m.integer("max_positions");
  model.scaleEmbedding = m.flag("scale_embedding");
  model.layers = modelBlock.layers;
}

void checkModelValues(const ModelSpec &model, const ResolvedBlock &block,
                      DiagnosticEngine &diags) {
  auto at = [&](llvm::StringRef name) {
    const ResolvedField *f = block.field(name);
    return f && !f->defaulted ? f->range : block.headerRange;
  };
  auto real = [](double v) { return Value::real(v).str(); };
  if (model.dropout >= 1)
    diags.error(at("dropout"), "'dropout' is a probability below 1; got " + real(model.dropout));
  for (auto [name, value] : {std::pair{"norm_eps", model.normEps}, {"rope_theta", model.ropeTheta}})
    if (value <= 0)
      diags.error(at(name), "'" + std::string(name) + "' must be above 0; got " + real(value));
  if (model.rotaryFraction <= 0 || model.rotaryFraction > 1)
    diags.error(at("rotary_fraction"), "'rotary_fraction' is the share of each head that "
                                       "rotates, above 0 and at most 1; got " +
                                           real(model.rotaryFraction));
  if (model.positions() < model.seq)
    diags.error(at("max_positions"),
                "max_positions = " + std::to_string(model.positions()) + " is below seq = " +
                    std::to_string(model.seq) +
                    ": the model must have a position for every token of a sequence");
  if (model.position != Position::RoPE || model.heads <= 0 || diags.hasErrors())
    return;
  // Rotary embeddings turn pairs of dimensions: the rotated part of a head must be even.
  int64_t width = model.headDim ? model.headDim : model.hidden / model.heads;
  double rotated = double(width) * model.rotaryFraction;
  if (rotated != double(int64_t(rotated)) || int64_t(rotated) % 2 != 0)
    diags.error(at(model.rotaryFraction != 1 ? "rotary_fraction" : "head_dim"),
                "rotary embeddings turn pairs of dimensions, but " + real(rotated) +
                    " of each head's " + std::to_string(width) +
                    " dimensions would rotate; use an even head width");
}

void fillProgram(const ResolvedBlock &modelBlock, const ResolvedBlock &clusterBlock,
                 const ResolvedBlock &parallelBlock, const ResolvedBlock *trainBlock,
                 Program &program) {
  fillModel(modelBlock, program.model);
  const ModelSpec &model = program.model;

  FieldReader c{clusterBlock};
  ClusterSpec &cluster = program.cluster;
  cluster.name = clusterBlock.name;
  cluster.nameRange = clusterBlock.headerRange;
  cluster.nodes = c.integer("nodes");
  cluster.gpusPerNode = c.integer("gpus_per_node");
  if (const ResolvedBlock *gpu = clusterBlock.nestedBlock("gpu")) {
    FieldReader g{*gpu};
    if (const GPUDatasheet *row = datasheetOf(g.word("kind")))
      cluster.gpuKind = row->kind;
    cluster.gpuMemory = g.integer("memory");
    cluster.gpuPeak = {g.real("flops_bf16"), g.real("flops_fp16"), g.real("flops_fp32"),
                       g.real("flops_tf32")};
    // `flops` is the peak for the model's dtype: it wins over the per-dtype fields.
    cluster.gpuFlops = gpu->field("flops") ? g.real("flops") : cluster.gpuPeak.of(model.dtype);
    cluster.gpuMemoryBandwidth = g.real("memory_bandwidth");
    cluster.gpuSMs = g.integer("sms");
    cluster.gpuReserve = g.integer("reserve");
  }
  cluster.intraNode = c.link("intra_node");
  if (const ResolvedBlock *intra = clusterBlock.nestedBlock("intra_node"))
    cluster.intraNodeKind =
        FieldReader{*intra}.word("kind") == "pcie" ? IntraNodeKind::PCIe : IntraNodeKind::NVLink;
  cluster.hasInterNode = clusterBlock.nestedBlock("inter_node") != nullptr;
  cluster.interNode = cluster.hasInterNode ? c.link("inter_node") : cluster.intraNode;
  cluster.nicsPerNode = cluster.gpusPerNode;
  if (const ResolvedBlock *inter = clusterBlock.nestedBlock("inter_node"))
    if (int64_t nics = FieldReader{*inter}.integer("nics"))
      cluster.nicsPerNode = nics;

  FieldReader p{parallelBlock};
  ParallelSpec &par = program.parallel;
  par.name = parallelBlock.name;
  par.tp = std::max<int64_t>(p.integer("tp"), 1);
  par.pp = std::max<int64_t>(p.integer("pp"), 1);
  par.cp = std::max<int64_t>(p.integer("cp"), 1);
  par.dpAuto = p.autoValue("dp") != nullptr;
  par.dp = par.dpAuto ? 0 : p.integer("dp");
  par.ep = std::max<int64_t>(p.integer("ep"), 1);
  if (const ResolvedField *order = parallelBlock.field("order"); order && !order->value.isAuto())
    par.order = order->value.order;
  par.microBatch = std::max<int64_t>(p.integer("micro_batch"), 1);
  par.globalBatch = p.integer("global_batch");
  if (const ResolvedField *s = parallelBlock.field("schedule"); s && !s->value.isAuto()) {
    par.schedule = scheduleKindOf(s->value.word);
    par.chunks = std::max<int64_t>(s->value.chunks, 1);
  }
  par.zero = p.autoValue("zero") ? 0 : int(p.integer("zero"));
  par.recompute = recomputeOf(p.word("recompute"));
  par.sequenceParallel = p.word("sequence_parallel") == "true";
  fillSearchSpace(parallelBlock, par.space);
  if (const ResolvedField *sl = parallelBlock.field("stage_layers"))
    for (const Value &e : sl->value.elems)
      par.stageLayers.push_back(e.i);
  par.overlapGradReduce = p.flag("overlap_grad_reduce");
  par.overlapParamGather = p.flag("overlap_param_gather");
  par.tpCommOverlap = p.flag("tp_comm_overlap");
  par.bucketSize = p.integer("bucket_size");

  if (!trainBlock)
    return;
  FieldReader t{*trainBlock};
  TrainSpec &train = program.train;
  train.declared = trainBlock->declared;
  train.optimizer = t.word("optimizer") == "sgd" ? Optimizer::SGD : Optimizer::Adam;
  train.lr = t.real("lr");
  train.steps = t.integer("steps");
  train.seed = t.integer("seed");
  train.weightDecay = t.real("weight_decay");
  train.gradClip = t.real("grad_clip");
  train.beta1 = t.real("beta1");
  train.beta2 = t.real("beta2");
  train.eps = t.real("eps");
  train.momentum = t.real("momentum");
  train.warmupSteps = t.integer("warmup_steps");
  train.gradDtype = t.dtype("grad_dtype");
  train.tokens = t.real("tokens");
}

} // namespace parc
