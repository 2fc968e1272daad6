//===- SemaLayers.cpp - A model's layer list into layer groups -----------===//
#include "Analyzer.h"
#include "parc/Support/Limits.h"
#include "parc/Support/NameSuggest.h"

namespace parc {
using namespace sema;

namespace {
/// Sets the mixture-of-experts field `name` of `moe` to `v`; false when `name` is not one.
bool setMoEField(MoESpec &moe, llvm::StringRef name, const Value &v) {
  if (name == "experts")
    moe.experts = v.i;
  else if (name == "top_k")
    moe.topK = v.i;
  else if (name == "moe_ffn")
    moe.ffn = v.i;
  else if (name == "shared_experts")
    moe.sharedExperts = v.i;
  else if (name == "normalize_top_k")
    moe.normalizeTopK = v.word == "true";
  else if (name == "aux_loss")
    moe.auxLoss = v.asDouble();
  else if (name == "capacity")
    moe.capacity = v.kind == Value::Word ? 0 : v.asDouble();
  else
    return name == "router"; // softmax, the only router so far
  return true;
}

/// The model block's mixture-of-experts fields: every transformer layer's defaults.
MoESpec modelMoE(const ResolvedBlock &model) {
  MoESpec moe;
  for (const FieldSpec &spec : layerOverrideSchema().fields)
    if (const ResolvedField *f = model.field(spec.name))
      setMoEField(moe, spec.name, f->value);
  return moe;
}
} // namespace

std::optional<LayerGroup> Analyzer::resolveLayer(const ast::LayerDecl &decl, const Scope &scope,
                                                 const ResolvedBlock &model) {
  LayerGroup g;
  g.name = decl.name;
  g.range = decl.range;
  if (decl.kind == "embedding")
    g.kind = LayerGroup::Embedding;
  else if (decl.kind == "transformer")
    g.kind = LayerGroup::Transformer;
  else if (decl.kind == "lm_head")
    g.kind = LayerGroup::LMHead;
  else {
    diags.error(decl.kindRange, "unknown layer kind '" + decl.kind +
                                    "'; expected embedding, transformer or lm_head" +
                                    didYouMean(decl.kind, layerKinds()));
    return std::nullopt;
  }
  bool ok = true;
  if (!decl.overrides.empty() && g.kind != LayerGroup::Transformer) {
    diags.error(decl.overrides.front().range, "only transformer layers take overrides");
    ok = false;
  }
  if (decl.repeat && g.kind != LayerGroup::Transformer) {
    diags.error(decl.repeat->range, "only transformer layers repeat ('x COUNT')");
    ok = false;
  }
  if (!decl.tiedTo.empty() && g.kind != LayerGroup::LMHead) {
    diags.error(decl.tiedRange, "only an lm_head can be tied to an embedding");
    ok = false;
  }
  auto intField = [&](llvm::StringRef name) {
    const ResolvedField *f = model.field(name);
    return f && f->value.kind == Value::Number ? f->value.i : 0;
  };
  g.heads = intField("heads");
  g.kvHeads = intField("kv_heads");
  g.ffn = intField("ffn");
  const ResolvedField *mlp = model.field("mlp");
  g.mlp = mlp ? mlpKindOf(mlp->value.word) : MLPKind::GELU;
  g.moe = modelMoE(model);
  bool kvWritten = false;
  llvm::StringMap<llvm::SMRange> seen;
  for (const ast::Field &o : decl.overrides) {
    const FieldSpec *spec = layerOverrideSchema().field(o.name);
    if (!spec) {
      diags.error(o.nameRange, "'" + o.name + "' cannot be overridden per layer; a transformer "
                               "layer may override heads, kv_heads, ffn, mlp and the "
                               "mixture-of-experts fields (experts, top_k, moe_ffn, ...)" +
                                   didYouMean(o.name, layerOverrideSchema().fieldNames()));
      ok = false;
      continue;
    }
    if (auto [it, fresh] = seen.try_emplace(o.name, o.nameRange); !fresh) {
      diags.error(o.nameRange, "duplicate override '" + o.name + "'");
      diags.note(it->second, "previous definition is here");
      ok = false;
      continue;
    }
    auto v = eval.evaluateField(*o.value, *spec, scope);
    if (!v) {
      ok = false;
      continue;
    }
    if (o.name == "heads")
      g.heads = v->i;
    else if (o.name == "kv_heads")
      g.kvHeads = v->i, kvWritten = true;
    else if (o.name == "ffn")
      g.ffn = v->i;
    else if (o.name == "mlp")
      g.mlp = mlpKindOf(v->word);
    else
      setMoEField(g.moe, o.name, *v);
  }
  // An expert is as wide as the layer's own MLP unless moe_ffn says otherwise.
  const ResolvedField *moeFfn = model.field("moe_ffn");
  if (!seen.count("moe_ffn") && seen.count("ffn") && moeFfn && moeFfn->defaulted)
    g.moe.ffn = g.ffn;
  // Overriding heads without kv_heads keeps plain multi-head attention when the model has it.
  const ResolvedField *kv = model.field("kv_heads");
  if (!kvWritten && seen.count("heads") && kv && kv->defaulted)
    g.kvHeads = g.heads;
  if (decl.repeat) {
    FieldSpec count{"layer count", FieldType::Count, true, "", {}, {}, limits::MaxBlocks};
    if (auto v = eval.evaluateField(*decl.repeat, count, scope))
      g.count = v->i;
    else
      ok = false;
  }
  g.tiedTo = decl.tiedTo;
  if (!ok)
    return std::nullopt;
  return g;
}

void Analyzer::resolveLayers(const ast::Block &syntax, const Scope &scope, ResolvedBlock &model) {
  llvm::StringMap<llvm::SMRange> names;
  bool ok = true;
  for (const ast::Statement &st : syntax.statements) {
    auto *decl = std::get_if<ast::LayerDecl>(&st);
    if (!decl)
      continue;
    if (auto [it, fresh] = names.try_emplace(decl->name, decl->nameRange); !fresh) {
      diags.error(decl->nameRange, "duplicate layer '" + decl->name + "'");
      diags.note(it->second, "previous definition is here");
      ok = false;
      continue;
    }
    if (auto g = resolveLayer(*decl, scope, model))
      model.layers.push_back(std::move(*g));
    else
      ok = false;
  }
  if (ok && !syntax.hasSyntaxErrors)
    checkLayerStructure(syntax, model);
}

void Analyzer::checkLayerStructure(const ast::Block &syntax, const ResolvedBlock &model) {
  const auto &layers = model.layers;
  if (layers.empty()) {
    diags.error(syntax.headerRange, "model '" + syntax.name + "' declares no layers; it needs "
                                    "an embedding, transformer layers and an lm_head");
    return;
  }
  auto count = [&](LayerGroup::Kind k) {
    return llvm::count_if(layers, [k](const LayerGroup &g) { return g.kind == k; });
  };
  if (count(LayerGroup::Embedding) != 1 || layers.front().kind != LayerGroup::Embedding) {
    diags.error(layers.front().range, "the first layer of a model must be its one embedding");
    return;
  }
  if (count(LayerGroup::LMHead) != 1 || layers.back().kind != LayerGroup::LMHead) {
    diags.error(layers.back().range, "the last layer of a model must be its one lm_head");
    return;
  }
  if (count(LayerGroup::Transformer) == 0) {
    diags.error(syntax.headerRange, "model '" + syntax.name + "' has no transformer layers");
    return;
  }
  const LayerGroup &head = layers.back();
  if (!head.tiedTo.empty() && head.tiedTo != layers.front().name) {
    // The one valid target is known, so name it rather than guess from the spelling.
    diags.error(head.range, "'tied(" + head.tiedTo + ")' must name the embedding layer '" +
                                layers.front().name + "'");
    diags.note(layers.front().range, "the embedding is declared here");
  }
  int64_t blocks = 0;
  for (const LayerGroup &g : layers) {
    if (g.kind != LayerGroup::Transformer)
      continue;
    blocks += g.count; // each count is at most MaxBlocks, so the sum cannot overflow
    if (blocks > limits::MaxBlocks) {
      diags.error(g.range, "model '" + syntax.name + "' has " + llvm::Twine(blocks) +
                               " transformer blocks up to layer '" + g.name +
                               "', more than the limit of " + llvm::Twine(limits::MaxBlocks));
      return;
    }
  }
}

} // namespace parc
