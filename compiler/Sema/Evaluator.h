//===- Evaluator.h - Expressions to typed values --------------------------===//
#ifndef PARC_SEMA_EVALUATOR_H
#define PARC_SEMA_EVALUATOR_H

#include "Schema.h"
#include "parc/Sema/Sema.h"
#include "llvm/ADT/StringSet.h"

#include <deque>
#include <functional>

namespace parc::sema {

/// Where a name in an expression is looked up: the fields of the block being evaluated (those
/// written so far), then its enclosing block, then top-level blocks by name. The outermost
/// scope has no block; it holds the top-level blocks lost to syntax errors.
struct Scope {
  ResolvedBlock *block = nullptr;
  const ast::Block *syntax = nullptr; // to tell "defined later" from "undefined"
  const BlockSchema *schema = nullptr; // to tell a missing required field from an unknown name
  const Scope *parent = nullptr;
  llvm::StringSet<> failed; // fields whose value had an error: uses of them stay quiet
};

class Evaluator {
public:
  using BlockLookup = std::function<const ResolvedBlock *(llvm::StringRef)>;
  Evaluator(DiagnosticEngine &diags, BlockLookup lookupBlock, std::vector<llvm::StringRef> blockNames)
      : diags(diags), lookupBlock(std::move(lookupBlock)), blockNames(std::move(blockNames)) {}

  /// Evaluates `expr` as the value of a field of type `spec`; reports and returns nullopt on
  /// error. `fieldName` names the field in messages.
  std::optional<Value> evaluateField(const ast::Expr &expr, const FieldSpec &spec,
                                     const Scope &scope);
  /// The value of a field that was not written.
  std::optional<Value> defaultValue(const FieldSpec &spec, const Scope &scope);

private:
  std::optional<Value> evalNumeric(const ast::Expr &expr, const Scope &scope);
  std::optional<Value> evalLiteral(const ast::Expr &expr);
  /// The field a reference names (`hidden`, `gpt.hidden`, `dgx.gpu.memory`); null after an
  /// error, or quietly when the name already failed.
  const ResolvedField *resolveRef(const ast::Expr &expr, const Scope &scope);
  std::optional<std::optional<Value>> unwrittenDefault(llvm::StringRef name,
                                                       const Scope &scope);
  std::optional<Value> evalRef(const ast::Expr &expr, const Scope &scope);
  std::optional<Value> evalBinary(const ast::Expr &expr, const Value &l, const Value &r);
  std::optional<Value> typeNumber(const ast::Expr &expr, Value v, const FieldSpec &spec);
  std::optional<Value> evalWord(const ast::Expr &expr, const FieldSpec &spec, const Scope &scope);
  std::optional<Value> evalOrder(const ast::Expr &expr);
  std::optional<Value> evalSchedule(const ast::Expr &expr, const Scope &scope,
                                    bool openChunks = false);
  /// `auto` or `auto(values, <= bound, ...)` for a searchable field; nullopt after an error.
  std::optional<Value> evalAuto(const ast::Expr &expr, const FieldSpec &spec, const Scope &scope);

  DiagnosticEngine &diags;
  BlockLookup lookupBlock;
  std::vector<llvm::StringRef> blockNames;
};

// Message text that both halves of the evaluator (Evaluator.cpp, EvaluatorWords.cpp) write.
/// A value as messages show it: `-1e-06 s`, `19.2`, in base units.
std::string showNumber(const Value &v);
/// Literals and names are quoted in messages; a megabyte of digits is cut short.
std::string abbreviate(llvm::StringRef text);
/// "a, b or c".
std::string joinWords(llvm::ArrayRef<llvm::StringRef> words);
/// `dtype = bf16` and the like: a bare name, or nothing.
std::optional<std::string> bareName(const ast::Expr &expr);

} // namespace parc::sema

#endif
