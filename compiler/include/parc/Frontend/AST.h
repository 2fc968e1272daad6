//===- AST.h - The typed syntax tree of a .par file -----------------------===//
//
// Built from the ANTLR parse tree by the front end and the only thing that leaves it: nothing
// after parsing sees ANTLR. Every node keeps its source range for diagnostics.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_FRONTEND_AST_H
#define PARC_FRONTEND_AST_H

#include "llvm/Support/SMLoc.h"
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace parc::ast {

struct Field;
struct CallArg;

struct Expr {
  enum Kind { Number, Ref, Unary, Binary, Call, List, String } kind;
  llvm::SMRange range;

  // Number: the literal as written and its optional unit suffix.
  std::string literal;
  std::string unit;
  llvm::SMRange unitRange;
  // Ref: `hidden`, `gpt3_175b.hidden`; Call: the callee in path[0]; String: the text.
  std::vector<std::string> path;
  std::string text;
  // Unary and Binary: '+', '-', '*', '/'.
  char op = 0;
  std::vector<std::unique_ptr<Expr>> operands; // Unary/Binary operands, List elements.
  std::vector<Field> args;                     // Call: named arguments.
  std::vector<CallArg> values;                 // Call: unnamed arguments, in order.

  explicit Expr(Kind kind, llvm::SMRange range) : kind(kind), range(range) {}
};

/// An unnamed call argument, with the bound it states: `4`, `<= 16`.
struct CallArg {
  std::string comparison; // "", "<=", ">=", "<" or ">"
  std::unique_ptr<Expr> value;
  llvm::SMRange range;
};

struct Field {
  std::string name;
  llvm::SMRange nameRange;
  std::unique_ptr<Expr> value;
  llvm::SMRange range; // name through value
};

struct LayerDecl {
  std::string name;
  llvm::SMRange nameRange;
  std::string kind;
  llvm::SMRange kindRange;
  std::vector<Field> overrides;
  std::string tiedTo; // empty unless `tied(NAME)`
  llvm::SMRange tiedRange;
  std::unique_ptr<Expr> repeat; // `x COUNT`, or null for one layer
  llvm::SMRange range;
};

struct Block;
using Statement = std::variant<Field, LayerDecl, std::unique_ptr<Block>>;

struct Block {
  enum Kind { Model, Cluster, Parallel, Train, Nested } kind;
  std::string name;     // model/cluster/nested name; empty for parallel and train
  llvm::SMRange nameRange;
  std::string modelRef, clusterRef; // parallel for MODEL on CLUSTER
  llvm::SMRange modelRefRange, clusterRefRange;
  llvm::SMRange headerRange; // keyword through the name(s)
  llvm::SMLoc closeLoc;      // the closing brace
  std::vector<Statement> statements;
  /// A syntax error inside the block dropped some of its statements: checks for what is
  /// missing would only repeat that error.
  bool hasSyntaxErrors = false;
  /// Names of the dropped statements, so that uses of them do not read as undefined.
  std::vector<std::string> unparsedNames;
};

/// All top-level blocks of a file with its includes spliced in where they were written.
struct Module {
  std::vector<std::unique_ptr<Block>> blocks;
  llvm::SMLoc endLoc; // end of the main file, for "missing block" errors
  /// Names of top-level blocks dropped for a syntax error in their header: a `parallel for`
  /// naming one of them is not reported a second time.
  std::vector<std::string> unparsedBlockNames;
};

const char *blockKindName(Block::Kind kind);

} // namespace parc::ast

#endif
