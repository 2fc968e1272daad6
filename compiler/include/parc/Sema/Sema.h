//===- Sema.h - Name resolution, evaluation and typing of a .par module ---===//
#ifndef PARC_SEMA_SEMA_H
#define PARC_SEMA_SEMA_H

#include "parc/Frontend/AST.h"
#include "parc/Sema/Program.h"
#include "parc/Support/Diagnostics.h"
#include "parc/Support/Units.h"
#include "llvm/Support/raw_ostream.h"
#include <optional>

namespace parc {

/// A field's value after evaluation, in base units.
struct Value {
  enum Kind { Number, Word, Schedule, Order, List, Auto } kind = Number;
  bool isInt = true;
  int64_t i = 0;
  double r = 0;
  Dimension dim;
  std::string word;  // Word: an enumeration value, true/false or auto; Schedule: its name
  int64_t chunks = 1; // Schedule: interleaved(chunks = V)
  RankOrder order;
  std::vector<Value> elems; // List; Auto: the values `auto(...)` allows (none listed: any)
  /// Auto: the bounds `auto(>= lo, <= hi)` states; Schedule: chunks 0 with elems[0] the Auto
  /// value of `interleaved(chunks = auto ...)`.
  int64_t lo = 0, hi = 0;
  bool hasLo = false, hasHi = false;

  static Value integer(int64_t v, Dimension d = {}) {
    Value x;
    x.i = v;
    x.r = double(v);
    x.dim = d;
    return x;
  }
  static Value real(double v, Dimension d = {}) {
    Value x;
    x.isInt = false;
    x.r = v;
    x.dim = d;
    return x;
  }
  double asDouble() const { return isInt ? double(i) : r; }
  bool isAuto() const { return kind == Auto || (kind == Word && word == "auto"); }
  /// The normalised form --emit=ast prints: `85899345920 B`, `bf16`, `interleaved(chunks = 2)`.
  std::string str() const;
};

struct ResolvedField {
  std::string name;
  Value value;
  llvm::SMRange range; // empty when defaulted
  bool defaulted = false;
};

/// One block after evaluation: every field of its schema (written or defaulted), in schema
/// order, its nested blocks, and for a model its layers.
struct ResolvedBlock {
  ast::Block::Kind kind = ast::Block::Model;
  std::string name, modelRef, clusterRef;
  llvm::SMRange headerRange;
  bool declared = true; // false for a train block filled entirely from defaults
  bool hasErrors = false; // a field is missing or failed: lookups of it stay quiet
  std::vector<ResolvedField> fields;
  std::vector<ResolvedBlock> nested;
  std::vector<LayerGroup> layers;

  const ResolvedField *field(llvm::StringRef name) const;
  const ResolvedBlock *nestedBlock(llvm::StringRef name) const;
};

struct ResolvedModule {
  std::vector<ResolvedBlock> blocks;
};

/// Checks and evaluates `module`. Reports every error it finds (up to the engine's cap). The
/// program is returned only when there were no errors and a `parallel for` block names a
/// declared model and cluster. `resolved`, if given, receives every block that evaluated.
std::optional<Program> analyze(const ast::Module &module, DiagnosticEngine &diags,
                               ResolvedModule *resolved = nullptr);
/// The same for a file that may hold several named mappings (`parallel NAME for ...`): one
/// program per parallel block, in file order.
std::optional<std::vector<Program>> analyzeAll(const ast::Module &module, DiagnosticEngine &diags,
                                               ResolvedModule *resolved = nullptr);

/// Checks and evaluates a module that holds one model block and nothing else (an imported
/// model): its typed model, or nothing after an error.
std::optional<ModelSpec> analyzeModel(const ast::Module &module, DiagnosticEngine &diags);

/// --emit=ast: the resolved model in a stable text form, one field a line with its location.
void printResolved(const ResolvedModule &module, llvm::SourceMgr &sourceMgr,
                   llvm::raw_ostream &os);

} // namespace parc

#endif
