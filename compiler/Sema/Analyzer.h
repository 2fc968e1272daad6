//===- Analyzer.h - The semantic analyzer that Sema's files share ---------===//
//
// One Analyzer turns a module's blocks into Programs: Sema.cpp resolves blocks and fields
// and checks whole programs; SemaLayers.cpp resolves a model's layer list (per-layer
// overrides, mixture-of-experts settings) and checks its structure.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEMA_ANALYZER_H
#define PARC_SEMA_ANALYZER_H

#include "Evaluator.h"

#include <deque>

namespace parc::sema {

class Analyzer {
public:
  Analyzer(DiagnosticEngine &diags, std::vector<llvm::StringRef> blockNames)
      : diags(diags),
        eval(diags, [this](llvm::StringRef n) { return lookupBlock(n); }, std::move(blockNames)) {}

  std::optional<std::vector<Program>> run(const ast::Module &module, ResolvedModule *out);
  std::optional<ModelSpec> runModel(const ast::Module &module);

private:
  const ResolvedBlock *lookupBlock(llvm::StringRef name) const {
    for (const ResolvedBlock &b : resolved)
      if (b.name == name && (b.kind == ast::Block::Model || b.kind == ast::Block::Cluster))
        return &b;
    return nullptr;
  }
  bool resolveBlock(const ast::Block &syntax, const BlockSchema &schema, ResolvedBlock &out,
                    const Scope *parent);
  void resolveLayers(const ast::Block &syntax, const Scope &scope, ResolvedBlock &model);
  std::optional<LayerGroup> resolveLayer(const ast::LayerDecl &decl, const Scope &scope,
                                         const ResolvedBlock &model);
  void checkLayerStructure(const ast::Block &syntax, const ResolvedBlock &model);
  void warnIneffectiveTrainSettings(const ResolvedBlock &train);
  bool completeFromDatasheet(ResolvedBlock &cluster, const ast::Block &syntax);
  void checkProgramValues(const Program &program, const ResolvedBlock &cluster);
  /// A second block of a name: its body is still checked, but nothing can refer to it.
  void checkDuplicate(const ast::Block &block, const Scope &fileScope) {
    ResolvedBlock unused;
    resolveBlock(block, schemaFor(block.kind), unused, &fileScope);
  }
  void recordRanges(const ResolvedBlock &block, const std::string &prefix, Program &program);

  DiagnosticEngine &diags;
  Evaluator eval;
  std::deque<ResolvedBlock> resolved;
};

} // namespace parc::sema

#endif
