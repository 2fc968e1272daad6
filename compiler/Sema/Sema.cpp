//===- Sema.cpp - Blocks, fields and layers into a Program ----------------===//
#include "Analyzer.h"
#include "parc/Sema/GPUKinds.h"
#include "parc/Support/Limits.h"
#include "parc/Support/NameSuggest.h"

#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

namespace parc {
using namespace sema;

// Defined in ProgramBuilder.cpp: the typed Program from the resolved blocks, and the checks
// of the model's values that need several of its fields.
void fillModel(const ResolvedBlock &model, ModelSpec &spec);
void fillProgram(const ResolvedBlock &model, const ResolvedBlock &cluster,
                 const ResolvedBlock &parallel, const ResolvedBlock *train, Program &program);
void checkModelValues(const ModelSpec &spec, const ResolvedBlock &model, DiagnosticEngine &diags);

const ResolvedField *ResolvedBlock::field(llvm::StringRef name) const {
  for (const ResolvedField &f : fields)
    if (f.name == name)
      return &f;
  return nullptr;
}

const ResolvedBlock *ResolvedBlock::nestedBlock(llvm::StringRef name) const {
  for (const ResolvedBlock &b : nested)
    if (b.name == name)
      return &b;
  return nullptr;
}

namespace {

std::string quotedList(llvm::ArrayRef<std::string> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + ("'" + names[i] + "'");
  return out;
}

/// "; did you mean 'X'?" for a misspelt name, remembering X in `meant`.
std::string suggestionFor(llvm::StringRef typo, llvm::ArrayRef<llvm::StringRef> names,
                          llvm::StringSet<> &meant) {
  auto guess = suggestName(typo, names);
  if (!guess)
    return "";
  meant.insert(*guess);
  return "; did you mean '" + *guess + "'?";
}
} // namespace


bool Analyzer::resolveBlock(const ast::Block &syntax, const BlockSchema &schema,
                            ResolvedBlock &out, const Scope *parent) {
  out.kind = syntax.kind;
  out.name = syntax.name;
  out.headerRange = syntax.headerRange;
  Scope scope;
  scope.block = &out;
  scope.syntax = &syntax;
  scope.schema = &schema;
  scope.parent = parent;
  for (const std::string &name : syntax.unparsedNames)
    scope.failed.insert(name);
  llvm::StringMap<llvm::SMRange> seen;
  // Names that misspelt fields and blocks were taken for: not reported missing as well.
  llvm::StringSet<> meant;
  bool reportedMissingClose = false;
  bool ok = true;
  for (const ast::Statement &st : syntax.statements) {
    if (auto *f = std::get_if<ast::Field>(&st)) {
      auto [it, fresh] = seen.try_emplace(f->name, f->nameRange);
      if (!fresh) {
        diags.error(f->nameRange, "duplicate field '" + f->name + "'");
        diags.note(it->second, "previous definition is here");
        ok = false;
        continue;
      }
      const FieldSpec *spec = schema.field(f->name);
      if (!spec) {
        if (schema.nestedSchema(f->name))
          diags.error(f->nameRange, "'" + f->name + "' is a block: write '" + f->name +
                                        " { ... }'");
        else
          diags.error(f->nameRange, "unknown field '" + f->name + "' in " + schema.kind.str() +
                                        suggestionFor(f->name, schema.fieldNames(), meant));
        scope.failed.insert(f->name);
        ok = false;
        continue;
      }
      if (auto v = eval.evaluateField(*f->value, *spec, scope))
        out.fields.push_back({f->name, *v, f->range, false});
      else {
        scope.failed.insert(f->name);
        ok = false;
      }
    } else if (auto *nested = std::get_if<std::unique_ptr<ast::Block>>(&st)) {
      const ast::Block &inner = **nested;
      auto [it, fresh] = seen.try_emplace(inner.name, inner.nameRange);
      if (!fresh) {
        diags.error(inner.nameRange, "duplicate block '" + inner.name + "'");
        diags.note(it->second, "previous definition is here");
        ok = false;
        continue;
      }
      const BlockSchema *innerSchema = schema.nestedSchema(inner.name);
      // `intra_node` inside `gpu`: the gpu block's '}' went missing above it. One error says
      // so; the blocks after it are in the same place for the same reason.
      bool belongsOutside =
          !innerSchema && parent && parent->schema && parent->schema->nestedSchema(inner.name);
      if (belongsOutside) {
        if (!reportedMissingClose)
          diags.error(inner.nameRange, "'" + inner.name + "' belongs in the enclosing " +
                                           parent->schema->kind.str() + ", not in " +
                                           schema.kind.str() + "; is a '}' missing above it?");
        reportedMissingClose = true;
        ok = false;
        continue;
      }
      if (!innerSchema) {
        std::string where = schema.kind.str();
        diags.error(inner.nameRange,
                    "unknown block '" + inner.name + "' in " + where +
                        (schema.nested.empty()
                             ? " (" + where + " has no nested blocks)"
                             : suggestionFor(inner.name, schema.nestedNames(), meant)));
        ok = false;
        continue;
      }
      ResolvedBlock child;
      ok &= resolveBlock(inner, *innerSchema, child, &scope);
      out.nested.push_back(std::move(child));
    } else if (syntax.kind != ast::Block::Model) {
      diags.error(std::get<ast::LayerDecl>(st).range,
                  "'layer' declarations belong in a model block");
      ok = false;
    }
  }

  if (syntax.kind == ast::Block::Cluster && !syntax.hasSyntaxErrors)
    ok &= completeFromDatasheet(out, syntax);
  std::vector<std::string> missing;
  for (const FieldSpec &spec : schema.fields) {
    if (seen.count(spec.name) || meant.count(spec.name))
      continue;
    // `kv_heads` defaults to `heads`: when that is missing too, its own error says so.
    if (schema.field(spec.defaultValue) && !out.field(spec.defaultValue))
      continue;
    if (spec.required) {
      missing.push_back(spec.name.str());
      continue;
    }
    if (spec.defaultValue.empty())
      continue;
    if (auto v = eval.defaultValue(spec, scope))
      out.fields.push_back({spec.name.str(), *v, {}, true});
  }
  for (const BlockSchema *inner : schema.nested) {
    if (seen.count(inner->kind) || meant.count(inner->kind))
      continue;
    // A GPU kind's datasheet gives the intra-node link (completeFromDatasheet).
    const ResolvedBlock *gpu = out.nestedBlock("gpu");
    if (inner->kind == "intra_node" && gpu && (gpu->field("kind") || gpu->hasErrors))
      continue;
    // A single-node cluster never uses its inter-node link.
    const ResolvedField *nodes = out.field("nodes");
    if (inner->kind == "inter_node" && (!nodes || nodes->value.i == 1))
      continue;
    if (scope.failed.count("nodes") && inner->kind == "inter_node")
      continue;
    missing.push_back(inner->kind.str() + " { ... }");
  }
  // A statement lost to a syntax error may be the one that looks missing.
  if (syntax.hasSyntaxErrors)
    missing.clear();
  if (!missing.empty()) {
    std::string what = syntax.kind == ast::Block::Nested ? "block '" + syntax.name + "'"
                       : syntax.name.empty()
                           ? std::string(ast::blockKindName(syntax.kind)) + " block"
                           : std::string(ast::blockKindName(syntax.kind)) + " '" +
                                 syntax.name + "'";
    diags.error(syntax.headerRange, what + " is missing required " +
                                        (missing.size() == 1 ? "field " : "fields ") +
                                        quotedList(missing));
    ok = false;
  }
  // Fields in schema order, so that printing and later lookups do not depend on the source.
  std::vector<ResolvedField> ordered;
  for (const FieldSpec &spec : schema.fields)
    if (const ResolvedField *f = out.field(spec.name))
      ordered.push_back(*f);
  out.fields = std::move(ordered);

  if (syntax.kind == ast::Block::Model)
    resolveLayers(syntax, scope, out);
  out.hasErrors = !ok || syntax.hasSyntaxErrors;
  return ok;
}

namespace {
/// The NCCL tuning model's per-step hardware latency of a ring with the Simple protocol
/// (NVIDIA/nccl src/graph/tuning.cc, hwLat): the default latency of a datasheet's link.
constexpr double kNVLinkStepLatency = 3.4e-6, kPCIeStepLatency = 5.7e-6;

void fillField(ResolvedBlock &block, llvm::StringRef name, Value value) {
  if (!block.field(name))
    block.fields.push_back({name.str(), std::move(value), {}, true});
}

void sortFields(ResolvedBlock &block, const BlockSchema &schema) {
  std::vector<ResolvedField> ordered;
  for (const FieldSpec &spec : schema.fields)
    if (const ResolvedField *f = block.field(spec.name))
      ordered.push_back(*f);
  block.fields = std::move(ordered);
}

ResolvedBlock *nestedOf(ResolvedBlock &block, llvm::StringRef name) {
  for (ResolvedBlock &b : block.nested)
    if (b.name == name)
      return &b;
  return nullptr;
}
} // namespace

/// `gpu { kind = ... }` fills the gpu fields and the intra-node link left unset from the
/// datasheet (GPUKinds.h); without a kind, the fields a datasheet would give are required.
/// Returns false after reporting a missing field.
bool Analyzer::completeFromDatasheet(ResolvedBlock &cluster, const ast::Block &syntax) {
  ResolvedBlock *gpu = nestedOf(cluster, "gpu");
  if (!gpu)
    return true; // reported as missing
  const ResolvedField *kind = gpu->field("kind");
  const GPUDatasheet *row = kind ? datasheetOf(kind->value.word) : nullptr;
  const BlockSchema &gpuSchema = *schemaFor(ast::Block::Cluster).nestedSchema("gpu");
  const BlockSchema &linkSchema = *schemaFor(ast::Block::Cluster).nestedSchema("intra_node");
  if (row) {
    auto rate = [](double tera) { return Value::real(tera * 1e12, Dimension::flopRate()); };
    fillField(*gpu, "memory", Value::integer(row->memoryGiB << 30, Dimension::size()));
    fillField(*gpu, "flops_bf16", rate(row->peakTFLOPS.bf16));
    fillField(*gpu, "flops_fp16", rate(row->peakTFLOPS.fp16));
    fillField(*gpu, "flops_fp32", rate(row->peakTFLOPS.fp32));
    fillField(*gpu, "flops_tf32", rate(row->peakTFLOPS.tf32));
    fillField(*gpu, "memory_bandwidth",
              Value::real(row->memoryBandwidthGBs * 1e9, Dimension::bandwidth()));
    fillField(*gpu, "sms", Value::integer(row->sms));
    sortFields(*gpu, gpuSchema);
    ResolvedBlock *link = nestedOf(cluster, "intra_node");
    if (!link) {
      ResolvedBlock made;
      made.kind = ast::Block::Nested;
      made.name = "intra_node";
      made.declared = false;
      cluster.nested.push_back(std::move(made));
      link = &cluster.nested.back();
      Value word;
      word.kind = Value::Word;
      word.word = row->intraNode == IntraNodeKind::PCIe ? "pcie" : "nvlink";
      fillField(*link, "kind", word);
    }
    bool pcie = link->field("kind") && link->field("kind")->value.word == "pcie";
    fillField(*link, "bandwidth", Value::real(row->intraNodeGBs * 1e9, Dimension::bandwidth()));
    fillField(*link, "latency",
              Value::real(pcie ? kPCIeStepLatency : kNVLinkStepLatency, Dimension::time()));
    sortFields(*link, linkSchema);
    gpu = nestedOf(cluster, "gpu"); // the push above may have moved it
  }
  bool ok = true;
  auto requireAll = [&](const ResolvedBlock &block, std::vector<llvm::StringRef> names,
                        llvm::SMRange where) {
    std::vector<std::string> missing;
    for (llvm::StringRef n : names)
      if (!block.field(n))
        missing.push_back(n.str());
    if (missing.empty())
      return;
    diags.error(where, "block '" + block.name + "' is missing required " +
                           (missing.size() == 1 ? "field " : "fields ") + quotedList(missing) +
                           "; or name a GPU 'kind' whose datasheet gives " +
                           (missing.size() == 1 ? "it" : "them"));
    ok = false;
  };
  auto headerOf = [&](llvm::StringRef name) {
    for (const ast::Statement &st : syntax.statements)
      if (auto *b = std::get_if<std::unique_ptr<ast::Block>>(&st))
        if ((*b)->name == name)
          return (*b)->headerRange;
    return syntax.headerRange;
  };
  // Per-dtype peaks stand in for `flops`; which one the model needs is checked with the model.
  bool anyPeak = gpu->field("flops_bf16") || gpu->field("flops_fp16") || gpu->field("flops_fp32");
  if (!gpu->hasErrors)
    requireAll(*gpu, anyPeak ? std::vector<llvm::StringRef>{"memory"}
                             : std::vector<llvm::StringRef>{"memory", "flops"},
               headerOf("gpu"));
  if (ResolvedBlock *link = nestedOf(cluster, "intra_node"); link && !link->hasErrors)
    requireAll(*link, {"bandwidth", "latency"}, headerOf("intra_node"));
  return ok;
}

/// Optimizer settings the chosen optimizer ignores: almost always a copy-paste leftover or a
/// forgotten `optimizer = sgd`.
void Analyzer::warnIneffectiveTrainSettings(const ResolvedBlock &train) {
  const ResolvedField *optimizer = train.field("optimizer");
  if (!optimizer)
    return;
  bool sgd = optimizer->value.word == "sgd";
  static const llvm::StringRef kAdamOnly[] = {"beta1", "beta2", "eps"};
  for (const ResolvedField &f : train.fields) {
    if (f.defaulted)
      continue;
    bool adamOnly = llvm::is_contained(kAdamOnly, f.name);
    if ((sgd && adamOnly) || (!sgd && f.name == "momentum"))
      diags.warning(f.range, "'" + f.name + "' has no effect with optimizer " +
                                 optimizer->value.word + "; it applies to " +
                                 (sgd ? "adam" : "sgd") + " only");
  }
}

void Analyzer::recordRanges(const ResolvedBlock &block, const std::string &prefix,
                            Program &program) {
  for (const ResolvedField &f : block.fields)
    if (!f.defaulted)
      program.fieldRanges[prefix + f.name] = f.range;
  for (const ResolvedBlock &inner : block.nested)
    recordRanges(inner, prefix + inner.name + ".", program);
}

std::optional<std::vector<Program>> Analyzer::run(const ast::Module &module,
                                                  ResolvedModule *out) {
  std::vector<const ast::Block *> parallels;
  const ast::Block *train = nullptr;
  llvm::StringMap<llvm::SMRange> mappingNames;
  bool duplicateUnnamed = false;
  llvm::StringMap<llvm::SMRange> declared[2]; // models, clusters
  Scope fileScope;
  for (const std::string &name : module.unparsedBlockNames)
    fileScope.failed.insert(name);
  bool ok = true;
  for (const auto &block : module.blocks) {
    const ast::Block &b = *block;
    if (b.kind == ast::Block::Model || b.kind == ast::Block::Cluster) {
      auto &table = declared[b.kind == ast::Block::Cluster];
      auto [it, fresh] = table.try_emplace(b.name, b.nameRange);
      if (!fresh) {
        diags.error(b.nameRange, std::string("duplicate ") + ast::blockKindName(b.kind) + " '" +
                                     b.name + "'");
        diags.note(it->second, "previous definition is here");
        ok = false;
        checkDuplicate(b, fileScope);
        continue;
      }
    } else if (b.kind == ast::Block::Parallel) {
      // Several mappings of one file each need a name: `parallel NAME for MODEL on CLUSTER`.
      auto [it, fresh] = mappingNames.try_emplace(b.name, b.name.empty() ? b.headerRange
                                                                         : b.nameRange);
      if (!fresh) {
        duplicateUnnamed |= b.name.empty();
        if (b.name.empty())
          diags.error(b.headerRange, "only one unnamed 'parallel for' block is allowed per "
                                     "file; name each mapping: 'parallel NAME for MODEL on "
                                     "CLUSTER'");
        else
          diags.error(b.nameRange, "duplicate mapping '" + b.name + "'");
        diags.note(it->second, "the first one is here");
        ok = false;
        checkDuplicate(b, fileScope);
        continue;
      }
      parallels.push_back(&b);
    } else {
      if (train) {
        diags.error(b.headerRange, "only one 'train' block is allowed per file");
        diags.note(train->headerRange, "the first one is here");
        ok = false;
        checkDuplicate(b, fileScope);
        continue;
      }
      train = &b;
    }
    resolved.emplace_back();
    ok &= resolveBlock(b, schemaFor(b.kind), resolved.back(), &fileScope);
    if (b.kind == ast::Block::Train)
      warnIneffectiveTrainSettings(resolved.back());
    resolved.back().modelRef = b.modelRef;
    resolved.back().clusterRef = b.clusterRef;
    if (diags.reachedErrorLimit())
      return std::nullopt;
  }

  if (!train) {
    // No train block: its defaults still apply, and --emit=ast shows them.
    ast::Block empty;
    empty.kind = ast::Block::Train;
    resolved.emplace_back();
    resolveBlock(empty, schemaFor(ast::Block::Train), resolved.back(), nullptr);
    resolved.back().declared = false;
  }
  if (out)
    out->blocks.assign(resolved.begin(), resolved.end());

  if (module.blocks.empty() && !diags.hasErrors()) {
    diags.error(module.endLoc, "this file declares nothing: expected a 'model', a 'cluster' and "
                               "a 'parallel for MODEL on CLUSTER' block");
    return std::nullopt;
  }
  if (parallels.empty()) {
    if (!diags.hasErrors())
      diags.error(module.endLoc, "no 'parallel for MODEL on CLUSTER' block: nothing to plan");
    return std::nullopt;
  }
  // Named and unnamed mappings mixed: the unnamed one needs a name too (unless a second
  // unnamed block was reported above).
  if (parallels.size() > 1 && !duplicateUnnamed)
    for (const ast::Block *p : parallels)
      if (p->name.empty()) {
        diags.error(p->headerRange, "this file has " + std::to_string(parallels.size()) +
                                        " 'parallel for' blocks: name each mapping, "
                                        "'parallel NAME for MODEL on CLUSTER'");
        ok = false;
      }
  auto findRef = [&](llvm::StringRef ref, llvm::SMRange where, ast::Block::Kind kind,
                     ast::Block::Kind other) -> const ResolvedBlock * {
    for (const ResolvedBlock &b : resolved)
      if (b.kind == kind && b.name == ref)
        return &b;
    const char *what = ast::blockKindName(kind);
    if (llvm::is_contained(module.unparsedBlockNames, ref))
      return nullptr; // its header had a syntax error, already reported
    if (declared[other == ast::Block::Cluster].count(ref))
      diags.error(where, "'" + ref + "' is a " + ast::blockKindName(other) + ", not a " + what);
    else if (!declared[kind == ast::Block::Cluster].count(ref)) {
      std::vector<llvm::StringRef> candidates;
      for (const auto &entry : declared[kind == ast::Block::Cluster])
        candidates.push_back(entry.getKey());
      diags.error(where, std::string("unknown ") + what + " '" + ref + "'" +
                             didYouMean(ref, candidates));
    }
    return nullptr;
  };
  const ResolvedBlock *tr = nullptr;
  std::vector<const ResolvedBlock *> pars;
  for (const ResolvedBlock &b : resolved) {
    if (b.kind == ast::Block::Parallel)
      pars.push_back(&b);
    if (b.kind == ast::Block::Train)
      tr = &b;
  }
  std::vector<Program> programs;
  llvm::SmallPtrSet<const ResolvedBlock *, 2> checkedModels; // a model's errors said once
  for (size_t i = 0; i < parallels.size() && i < pars.size(); ++i) {
    const ast::Block *parallel = parallels[i];
    const ResolvedBlock *model = findRef(parallel->modelRef, parallel->modelRefRange,
                                         ast::Block::Model, ast::Block::Cluster);
    const ResolvedBlock *cluster = findRef(parallel->clusterRef, parallel->clusterRefRange,
                                           ast::Block::Cluster, ast::Block::Model);
    if (!ok || !model || !cluster || diags.hasErrors())
      continue;
    Program program;
    fillProgram(*model, *cluster, *pars[i], tr, program);
    program.parallel.headerRange = parallel->headerRange;
    recordRanges(*model, "model.", program);
    recordRanges(*cluster, "cluster.", program);
    recordRanges(*pars[i], "parallel.", program);
    if (tr)
      recordRanges(*tr, "train.", program);
    if (checkedModels.insert(model).second)
      checkModelValues(program.model, *model, diags);
    checkProgramValues(program, *cluster);
    programs.push_back(std::move(program));
  }
  if (!ok || diags.hasErrors())
    return std::nullopt;
  return programs;
}

std::optional<ModelSpec> Analyzer::runModel(const ast::Module &module) {
  Scope fileScope;
  const ResolvedBlock *model = nullptr;
  for (const auto &block : module.blocks) {
    if (block->kind != ast::Block::Model) {
      diags.error(block->headerRange, "expected only a model block here");
      return std::nullopt;
    }
    resolved.emplace_back();
    resolveBlock(*block, schemaFor(block->kind), resolved.back(), &fileScope);
    model = &resolved.back();
  }
  if (!model || resolved.size() != 1) {
    diags.error(module.endLoc, "expected exactly one model block");
    return std::nullopt;
  }
  ModelSpec spec;
  fillModel(*model, spec);
  checkModelValues(spec, *model, diags);
  if (diags.hasErrors())
    return std::nullopt;
  return spec;
}

/// Values whose validity depends on another block: the peak for the model's dtype.
void Analyzer::checkProgramValues(const Program &program, const ResolvedBlock &cluster) {
  const ModelSpec &model = program.model;
  if (program.cluster.gpuFlops <= 0) {
    const ResolvedBlock *gpu = cluster.nestedBlock("gpu");
    std::string dtype = toString(model.dtype);
    diags.error(gpu ? gpu->headerRange : cluster.headerRange,
                "block 'gpu' gives no peak FLOP/s for the model's dtype " + dtype +
                    ": write 'flops' or 'flops_" + dtype + "', or name a GPU 'kind'");
    diags.note(model.nameRange, "model '" + model.name + "' is " + dtype);
  }
}


std::optional<std::vector<Program>> analyzeAll(const ast::Module &module,
                                               DiagnosticEngine &diags,
                                               ResolvedModule *resolved) {
  std::vector<llvm::StringRef> names;
  for (const auto &b : module.blocks)
    if (!b->name.empty() && b->kind != ast::Block::Parallel)
      names.push_back(b->name);
  Analyzer analyzer(diags, std::move(names));
  return analyzer.run(module, resolved);
}

std::optional<Program> analyze(const ast::Module &module, DiagnosticEngine &diags,
                               ResolvedModule *resolved) {
  std::optional<std::vector<Program>> all = analyzeAll(module, diags, resolved);
  if (!all || all->empty())
    return std::nullopt;
  if (all->size() > 1) {
    diags.error(all->back().parallel.headerRange,
                "this file has " + std::to_string(all->size()) +
                    " mappings; choose one (parc --mapping=NAME)");
    return std::nullopt;
  }
  return std::move(all->front());
}

std::optional<ModelSpec> analyzeModel(const ast::Module &module, DiagnosticEngine &diags) {
  std::vector<llvm::StringRef> names;
  for (const auto &b : module.blocks)
    names.push_back(b->name);
  return Analyzer(diags, std::move(names)).runModel(module);
}

} // namespace parc
