//===- Schema.h - Which fields each block has, their types and defaults ---===//
//
// The language's fields live in one table so that unknown-field suggestions, required-field
// checks, defaults, --emit=ast and docs/language.md all agree.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEMA_SCHEMA_H
#define PARC_SEMA_SCHEMA_H

#include "parc/Frontend/AST.h"
#include "parc/Support/Units.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include <vector>

namespace parc::sema {

enum class FieldType {
  Count,       // integer >= 1
  Natural,     // integer >= 0
  Real,        // dimensionless, >= 0
  Quantity,    // a number of the spec's dimension, > 0 (>= 0 for times)
  Enum,        // one of `words`
  Bool,        // true | false
  Order,       // tp, dp, pp and optionally cp, ep, each once: tp-cp-dp-pp
  Schedule,    // gpipe | 1f1b | interleaved(chunks = V)
  CountOrAuto, // integer >= 1, or `auto`
  CountList,   // [a, b, ...] of integers >= 1
  RealOrWord,  // a number > 0, or one of `words` (capacity = dropless)
};

struct FieldSpec {
  llvm::StringRef name;
  FieldType type;
  bool required;
  llvm::StringRef defaultValue; // source text, evaluated like a written field; "" = none
  Dimension dim;                // Quantity only
  std::vector<llvm::StringRef> words; // Enum only
  int64_t maxValue = 0;               // Natural/Count upper bound when non-zero
  bool allowZero = false;             // Quantity: 0 is meaningful (no reserve at all)
  /// The field may be `auto` or `auto(values, <= bound, ...)`: the search chooses it.
  bool searchable = false;
};

struct BlockSchema {
  llvm::StringRef kind; // "model", "cluster", "gpu", ...
  std::vector<FieldSpec> fields;
  std::vector<const BlockSchema *> nested;
  bool nestedRequired = true;

  const FieldSpec *field(llvm::StringRef name) const;
  const BlockSchema *nestedSchema(llvm::StringRef name) const;
  std::vector<llvm::StringRef> fieldNames() const;
  std::vector<llvm::StringRef> nestedNames() const;
};

const BlockSchema &schemaFor(ast::Block::Kind kind);
/// Fields a `transformer(...)` layer may override.
const BlockSchema &layerOverrideSchema();
llvm::ArrayRef<llvm::StringRef> layerKinds();

} // namespace parc::sema

#endif
