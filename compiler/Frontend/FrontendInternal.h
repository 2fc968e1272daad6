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
#include <optional>
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

/// Where syntax errors were found in one buffer. The AST builder drops what they touch, and
/// the parser stays quiet about a line the lexer already complained about.
struct SyntaxErrorLog {
  std::vector<size_t> tokenIndexes; // the offending token of each parser error
  std::vector<size_t> lexerErrorLines;
  size_t lastReportedLine = 0; // ANTLR's recovery often trips twice over one broken line
  /// Token ranges that are the body of a block whose header or opening was lost (a stray
  /// '}' above, a header that never reached its '{'), up to the '}' that closed it. Their
  /// lines read as top-level items; only the first of them is reported.
  std::vector<std::pair<size_t, size_t>> lostBodies;

  /// True if a parser error was reported at a token in [first, last].
  bool anyBetween(size_t first, size_t last) const;
  bool lexerErrorOnLine(size_t line) const;
  bool inLostBody(size_t tokenIndex) const;
};

/// ANTLR's lexer, reporting characters it cannot read through parc's diagnostics; the input
/// ends where the error limit is reached.
class ReportingLexer : public ParLexer {
public:
  ReportingLexer(antlr4::CharStream *input, const SourceText &source, DiagnosticEngine &diags,
                 SyntaxErrorLog &log)
      : ParLexer(input), source(source), diags(diags), log(log) {}
  std::unique_ptr<antlr4::Token> nextToken() override;
  void notifyListeners(const antlr4::LexerNoViableAltException &e) override;

private:
  const SourceText &source;
  DiagnosticEngine &diags;
  SyntaxErrorLog &log;
};

/// An error strategy that keeps ANTLR's recovery but says what went wrong in human terms, and
/// stops the parse (antlr4::ParseCancellationException) at the error limit.
class HumanErrorStrategy : public antlr4::DefaultErrorStrategy {
public:
  HumanErrorStrategy(const SourceText &source, DiagnosticEngine &diags, SyntaxErrorLog &log)
      : source(source), diags(diags), log(log) {}
  void sync(antlr4::Parser *parser) override;

protected:
  void reportNoViableAlternative(antlr4::Parser *parser,
                                 const antlr4::NoViableAltException &e) override;
  void reportInputMismatch(antlr4::Parser *parser,
                           const antlr4::InputMismatchException &e) override;
  void reportFailedPredicate(antlr4::Parser *parser,
                             const antlr4::FailedPredicateException &e) override;
  void reportUnwantedToken(antlr4::Parser *parser) override;
  void reportMissingToken(antlr4::Parser *parser) override;
  bool singleTokenInsertion(antlr4::Parser *parser) override;
  antlr4::Token *singleTokenDeletion(antlr4::Parser *parser) override;
  void consumeUntil(antlr4::Parser *parser, const antlr4::misc::IntervalSet &set) override;

private:
  /// `start` is where a failed prediction began (NoViableAlt only), else null.
  void report(antlr4::Parser *parser, antlr4::Token *offending,
              const antlr4::misc::IntervalSet &expected, bool unwanted,
              antlr4::Token *start = nullptr);
  /// The message for one syntax error and, in `at`, the token it points at; nullopt when it
  /// was reported some other way already or will be by the AST builder.
  std::optional<std::string> explain(antlr4::Parser *parser, antlr4::Token *offending,
                                     const antlr4::misc::IntervalSet &expected, bool unwanted,
                                     antlr4::Token *start, antlr4::Token *&at);

  /// Set by explain(): the error is about a top-level item that is not one (a field, a stray
  /// word, a header with no '{'), or about an unmatched '}'.
  bool strayAtTopLevel = false;
  bool unmatchedBrace = false;

  const SourceText &source;
  DiagnosticEngine &diags;
  SyntaxErrorLog &log;
};

/// Called for each `include "path"`: parses that file and appends its blocks to `out`.
using IncludeHandler =
    std::function<void(llvm::StringRef path, llvm::SMRange pathRange, ast::Module &out)>;

/// The top-level block keywords, for headers and "did you mean".
llvm::ArrayRef<llvm::StringRef> blockKeywords();

/// Turns a parse tree into AST blocks appended to `out`, skipping the parts that failed to
/// parse and reporting headers that are not well-formed.
void buildAST(ParParser::FileContext *file, const SourceText &source, DiagnosticEngine &diags,
              const SyntaxErrorLog &log, const IncludeHandler &onInclude, ast::Module &out);

} // namespace parc::frontend

#endif
