//===- Parser.h - Read a .par file (and its includes) into an AST ---------===//
#ifndef PARC_FRONTEND_PARSER_H
#define PARC_FRONTEND_PARSER_H

#include "parc/Frontend/AST.h"
#include "parc/Support/Diagnostics.h"
#include "llvm/ADT/StringRef.h"
#include <optional>

namespace parc {

/// Parses `path` and every file it includes. Syntax errors are reported through `diags` with
/// the parse continuing past them; the returned module holds what could be read. Returns
/// nullopt only when the main file itself could not be read.
std::optional<ast::Module> parseFile(llvm::StringRef path, DiagnosticEngine &diags);

/// Parses an in-memory buffer named `name` (for tests and stdin); includes resolve relative to
/// the current directory.
ast::Module parseBuffer(llvm::StringRef text, llvm::StringRef name, DiagnosticEngine &diags);

} // namespace parc

#endif
