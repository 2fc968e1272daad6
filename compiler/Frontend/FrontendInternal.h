//===- FrontendInternal.h - Pieces shared inside the front end only -------===//
//
// ANTLR types appear here and in the .cpp files of this directory, never in a public header.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_FRONTEND_INTERNAL_H
#define PARC_FRONTEND_INTERNAL_H

#include "ParLexer.h"
#include "ParParser.h"
#include "parc/Frontend/AST.h"
#include "parc/Support/Diagnostics.h"

#include <functional>
#include <vector>

namespace parc::frontend {

using grammar::ParLexer;
using grammar::ParParser;

/// One buffer of the SourceMgr as ANTLR sees it. ANTLR indexes code points; SourceMgr wants
/// byte pointers, and the two differ once a comment holds non-ASCII text.
class SourceText {
public:
  explicit SourceText(llvm::StringRef bytes);
  llvm::SMLoc locAtCodePoint(size_t index) const;
  llvm::SMRange rangeOf(const antlr4::Token *token) const;
  llvm::SMRange rangeOf(const antlr4::ParserRuleContext *ctx) const;
  llvm::SMRange rangeBetween(const antlr4::Token *first, const antlr4::Token *last) const;
  llvm::StringRef bytes() const { return text; }

private:
  llvm::StringRef text;
  std::vector<uint32_t> byteOffsetOfCodePoint; // empty when the text is pure ASCII
};

/// ANTLR's lexer, reporting characters it cannot read through parc's diagnostics.
class ReportingLexer : public ParLexer {
public:
  ReportingLexer(antlr4::CharStream *input, const SourceText &source, DiagnosticEngine &diags)
      : ParLexer(input), source(source), diags(diags) {}
  void notifyListeners(const antlr4::LexerNoViableAltException &e) override;

private:
  const SourceText &source;
  DiagnosticEngine &diags;
};

/// An error strategy that keeps ANTLR's recovery but says what went wrong in human terms.
class HumanErrorStrategy : public antlr4::DefaultErrorStrategy {
public:
  HumanErrorStrategy(const SourceText &source, DiagnosticEngine &diags)
      : source(source), diags(diags) {}

protected:
  void reportNoViableAlternative(antlr4::Parser *parser,
                                 const antlr4::NoViableAltException &e) override;
  void reportInputMismatch(antlr4::Parser *parser,
                           const antlr4::InputMismatchException &e) override;
  void reportFailedPredicate(antlr4::Parser *parser,
                             const antlr4::FailedPredicateException &e) override;
  void reportUnwantedToken(antlr4::Parser *parser) override;
  void reportMissingToken(antlr4::Parser *parser) override;

private:
  void report(antlr4::Parser *parser, antlr4::Token *offending,
              const antlr4::misc::IntervalSet &expected, bool unwanted);

  const SourceText &source;
  DiagnosticEngine &diags;
};

/// Called for each `include "path"`: parses that file and returns its blocks.
using IncludeHandler =
    std::function<std::vector<std::unique_ptr<ast::Block>>(llvm::StringRef path,
                                                           llvm::SMRange pathRange)>;

/// Turns a parse tree into AST blocks, skipping the parts that failed to parse.
std::vector<std::unique_ptr<ast::Block>> buildAST(ParParser::FileContext *file,
                                                  const SourceText &source,
                                                  DiagnosticEngine &diags,
                                                  const IncludeHandler &onInclude);

} // namespace parc::frontend

#endif
