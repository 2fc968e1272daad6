//===- ParWriter.cpp - A program as .par source ---------------------------===//
#include "parc/Emit/ParWriter.h"

namespace parc {

namespace {

/// A resolved value as .par source: base units, the rate unit spelled as the lexer reads it.
std::string source(const Value &v) {
  std::string text = v.str();
  if (v.kind == Value::Number && v.dim == Dimension::flopRate()) {
    size_t unit = text.rfind(" FLOP/s");
    if (unit != std::string::npos)
      text = text.substr(0, unit) + " FLOPS";
  }
  return text;
}

void writeFields(const ResolvedBlock &block, const std::string &indent, llvm::raw_ostream &os) {
  for (const ResolvedField &f : block.fields)
    if (!f.defaulted)
      os << indent << f.name << " = " << source(f.value) << "\n";
  for (const ResolvedBlock &inner : block.nested) {
    if (!inner.declared)
      continue;
    os << indent << inner.name << " {\n";
    writeFields(inner, indent + "  ", os);
    os << indent << "}\n";
  }
}

void writeLayers(const ResolvedBlock &model, llvm::raw_ostream &os) {
  // Every layer states its MLP: a dense one beside MoE blocks overrides the model's experts.
  const bool hasExperts = llvm::any_of(model.layers, [](const LayerGroup &g) {
    return g.kind == LayerGroup::Transformer && g.moe.enabled();
  });
  for (const LayerGroup &g : model.layers) {
    os << "  layer " << g.name << " : ";
    if (g.kind == LayerGroup::Embedding)
      os << "embedding";
    else if (g.kind == LayerGroup::LMHead)
      os << "lm_head" << (g.tiedTo.empty() ? "" : " tied(" + g.tiedTo + ")");
    else
      os << "transformer(heads = " << g.heads << ", kv_heads = " << g.kvHeads
         << ", ffn = " << g.ffn << ", mlp = " << toString(g.mlp)
         << (g.moe.enabled() ? g.moe.fieldsText() : hasExperts ? ", experts = 0" : "") << ") x "
         << g.count;
    os << "\n";
  }
}

const ResolvedBlock *find(const ResolvedModule &m, ast::Block::Kind kind, llvm::StringRef name) {
  for (const ResolvedBlock &b : m.blocks)
    if (b.kind == kind && (name.empty() || b.name == name))
      return &b;
  return nullptr;
}

void writeParallel(const Program &program, llvm::raw_ostream &os) {
  const ParallelSpec &p = program.parallel;
  os << "parallel " << (p.name.empty() ? "" : p.name + " ") << "for " << program.model.name
     << " on " << program.cluster.name << " {\n";
  os << "  tp = " << p.tp << "\n  pp = " << p.pp << "\n  dp = " << p.dp << "\n";
  os << "  cp = " << p.cp << "\n";
  if (program.model.hasExperts())
    os << "  ep = " << p.ep << "\n";
  os << "  order = " << p.orderText() << "\n";
  os << "  micro_batch = " << p.microBatch << "\n  global_batch = " << p.globalBatch << "\n";
  os << "  schedule = " << p.scheduleText();
  os << "\n  zero = " << p.zero << "\n  recompute = " << toString(p.recompute) << "\n";
  os << "  sequence_parallel = " << (p.sequenceParallel ? "true" : "false") << "\n";
  if (!p.stageLayers.empty()) {
    os << "  stage_layers = [";
    for (size_t i = 0; i < p.stageLayers.size(); ++i)
      os << (i ? ", " : "") << p.stageLayers[i];
    os << "]\n";
  }
  auto flag = [&](const char *name, bool on) {
    os << "  " << name << " = " << (on ? "true" : "false") << "\n";
  };
  flag("overlap_grad_reduce", p.overlapGradReduce);
  flag("overlap_param_gather", p.overlapParamGather);
  flag("tp_comm_overlap", p.tpCommOverlap);
  os << "}\n";
}

} // namespace

void writeParSource(const ResolvedModule &resolved, const Program &program,
                    llvm::raw_ostream &os) {
  os << "# Written by parc --search --emit=par: the best mapping, every field concrete.\n";
  if (const ResolvedBlock *model = find(resolved, ast::Block::Model, program.model.name)) {
    os << "model " << model->name << " {\n";
    writeFields(*model, "  ", os);
    writeLayers(*model, os);
    os << "}\n";
  }
  if (const ResolvedBlock *cluster =
          find(resolved, ast::Block::Cluster, program.cluster.name)) {
    os << "cluster " << cluster->name << " {\n";
    writeFields(*cluster, "  ", os);
    os << "}\n";
  }
  writeParallel(program, os);
  if (const ResolvedBlock *train = find(resolved, ast::Block::Train, "");
      train && train->declared) {
    os << "train {\n";
    writeFields(*train, "  ", os);
    os << "}\n";
  }
}

} // namespace parc
