//===- SyntaxErrors.cpp - Lexer and parser errors in human terms ----------===//
//
// ANTLR's own messages ("mismatched input 'x' expecting {38 tokens}") name grammar internals.
// Here each error is rephrased from what the parser was in the middle of: which rule, which
// token came before, and which kinds of token could have followed.
//
//===----------------------------------------------------------------------===//
#include "FrontendInternal.h"
#include "parc/Support/NameSuggest.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/ConvertUTF.h"

using namespace antlr4;

namespace parc::frontend {

SourceText::SourceText(llvm::StringRef bytes) : text(bytes) {
  bool ascii = llvm::all_of(bytes, [](char c) { return (unsigned char)c < 0x80; });
  if (ascii)
    return;
  // The buffer was validated as UTF-8 before lexing: a lead byte tells the sequence length.
  // ANTLR drops a leading byte-order mark, so its code point 0 is the character after it.
  for (size_t i = bytes.startswith("\xEF\xBB\xBF") ? 3 : 0; i < bytes.size();) {
    byteOffsetOfCodePoint.push_back(i);
    unsigned char c = bytes[i];
    i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  }
}

llvm::SMLoc SourceText::locAtCodePoint(size_t index) const {
  size_t offset = index;
  if (!byteOffsetOfCodePoint.empty())
    offset = index < byteOffsetOfCodePoint.size() ? byteOffsetOfCodePoint[index] : text.size();
  offset = std::min(offset, text.size());
  return llvm::SMLoc::getFromPointer(text.data() + offset);
}

llvm::SMRange SourceText::rangeBetween(const Token *first, const Token *last) const {
  if (!first)
    return {};
  if (first->getType() == Token::EOF)
    return {locAtCodePoint(text.size()), locAtCodePoint(text.size())};
  if (!last || last->getStopIndex() + 1 < first->getStartIndex() ||
      last->getType() == Token::EOF)
    last = first;
  return {locAtCodePoint(first->getStartIndex()), locAtCodePoint(last->getStopIndex() + 1)};
}

llvm::SMRange SourceText::rangeOf(const Token *token) const {
  return rangeBetween(token, token);
}

llvm::SMRange SourceText::rangeOf(const ParserRuleContext *ctx) const {
  return rangeBetween(ctx->start, ctx->stop);
}

static std::string describeChar(llvm::StringRef bytes, size_t offset) {
  unsigned char c = bytes[offset];
  if (c >= 0x20 && c < 0x7F)
    return std::string("'") + char(c) + "'";
  if (c < 0x80)
    // Not utohexstr's width: it writes 0 as "000".
    return "control character 0x" + std::string(c < 0x10 ? "0" : "") +
           llvm::utohexstr(c, /*LowerCase=*/false);
  // Non-ASCII outside comments and strings: show the whole code point.
  const llvm::UTF8 *start = reinterpret_cast<const llvm::UTF8 *>(bytes.data() + offset);
  const llvm::UTF8 *end = reinterpret_cast<const llvm::UTF8 *>(bytes.end());
  llvm::UTF32 cp = 0;
  llvm::UTF32 *out = &cp;
  llvm::ConvertUTF8toUTF32(&start, end, &out, out + 1, llvm::lenientConversion);
  return "character U+" + llvm::utohexstr(cp, false, 4);
}

bool SyntaxErrorLog::anyBetween(size_t first, size_t last) const {
  return llvm::any_of(tokenIndexes, [&](size_t i) { return i >= first && i <= last; });
}

bool SyntaxErrorLog::inLostBody(size_t tokenIndex) const {
  return llvm::any_of(lostBodies, [&](const std::pair<size_t, size_t> &body) {
    return tokenIndex >= body.first && tokenIndex <= body.second;
  });
}

bool SyntaxErrorLog::lexerErrorOnLine(size_t line) const {
  return llvm::is_contained(lexerErrorLines, line);
}

std::unique_ptr<Token> ReportingLexer::nextToken() {
  // Past the error limit nothing more is reported: the rest of the file is not worth reading.
  if (diags.reachedErrorLimit())
    _input->seek(_input->size());
  return ParLexer::nextToken();
}

void ReportingLexer::notifyListeners(const LexerNoViableAltException &) {
  llvm::SMLoc loc = source.locAtCodePoint(tokenStartCharIndex);
  size_t offset = loc.getPointer() - source.bytes().data();
  if (offset >= source.bytes().size())
    return;
  log.lexerErrorLines.push_back(tokenStartLine);
  char c = source.bytes()[offset];
  if (c == '"')
    diags.error(loc, "missing closing '\"' at the end of this string");
  else if (c == '\\')
    diags.error(loc, "'\\' continues a line only when it is the last character on the line");
  else
    diags.error(loc, "unexpected " + describeChar(source.bytes(), offset) +
                         " (not part of the .par language)");
}

namespace {

/// A name or number as quoted in a message: a megabyte of digits is cut short.
std::string quoteText(llvm::StringRef text) {
  constexpr size_t kMaxShown = 40;
  if (text.size() <= kMaxShown)
    return "'" + text.str() + "'";
  return "'" + text.take_front(kMaxShown - 8).str() + "...' (" + std::to_string(text.size()) +
         " characters)";
}

/// How a token reads in "expected X, found Y".
std::string describeFound(Token *token) {
  switch (token->getType()) {
  case Token::EOF:
    return "end of file";
  case ParLexer::NEWLINE:
    return "end of line";
  case ParLexer::NUMBER:
    return "number " + quoteText(token->getText());
  case ParLexer::STRING:
    return "string " + quoteText(token->getText());
  default:
    return quoteText(token->getText());
  }
}

bool isNameToken(size_t type, const dfa::Vocabulary &vocab) {
  if (type == ParLexer::IDENT)
    return true;
  // Soft keywords are literal tokens the `name` rule also accepts.
  std::string literal = vocab.getLiteralName(type);
  return literal.size() > 2 && llvm::isAlnum(literal[1]);
}

bool isSeparator(Token *token) {
  return token->getType() == ParLexer::NEWLINE || token->getText() == ";";
}

/// The expected-token set as a short phrase: "'=' or '{'", "an expression", "a name".
std::string describeExpected(const misc::IntervalSet &expected,
                             const dfa::Vocabulary &vocab) {
  llvm::SmallVector<std::string, 8> parts;
  auto add = [&](std::string phrase) {
    if (!llvm::is_contained(parts, phrase))
      parts.push_back(std::move(phrase));
  };
  bool expression = expected.contains(size_t(ParLexer::NUMBER));
  if (expression)
    add("an expression");
  for (size_t type : expected.toList()) {
    if (type == Token::EOF)
      add("end of file");
    else if (type == ParLexer::NEWLINE || vocab.getLiteralName(type) == "';'")
      add("a newline or ';'");
    else if (expression && (type == ParLexer::NUMBER || type == ParLexer::STRING ||
                            isNameToken(type, vocab) ||
                            llvm::StringRef("'(' '[' '-' '+'").contains(vocab.getLiteralName(type))))
      continue;
    else if (isNameToken(type, vocab))
      add("a name");
    else if (type == ParLexer::NUMBER)
      add("a number");
    else if (type == ParLexer::STRING)
      add("a quoted path");
    else if (type == ParLexer::RATE_UNIT)
      add("a unit");
    else
      add(vocab.getLiteralName(type));
  }
  if (parts.empty())
    return "something else";
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i)
    out += (i + 1 == parts.size() ? " or " : ", ") + parts[i];
  return out;
}

size_t literalType(const dfa::Vocabulary &vocab, llvm::StringRef literal) {
  for (size_t type = 1; type <= vocab.getMaxTokenType(); ++type)
    if (vocab.getLiteralName(type) == literal)
      return type;
  return Token::INVALID_TYPE;
}

Token *tokenAt(Parser *parser, size_t index) {
  TokenStream *tokens = parser->getTokenStream();
  if (index == INVALID_INDEX || index >= tokens->size())
    return nullptr;
  return tokens->get(index);
}

Token *tokenBefore(Parser *parser, Token *token) {
  size_t index = token->getTokenIndex();
  if (index == 0 || index == INVALID_INDEX)
    return nullptr;
  return tokenAt(parser, index - 1);
}

/// The first '}' after token `from` that closes no block opened after it, or INVALID_INDEX.
size_t unmatchedCloseAfter(Parser *parser, size_t from) {
  unsigned depth = 0;
  for (size_t i = from;; ++i) {
    Token *t = tokenAt(parser, i);
    if (!t || t->getType() == Token::EOF)
      return INVALID_INDEX;
    if (t->getText() == "{")
      ++depth;
    else if (t->getText() == "}" && depth-- == 0)
      return i;
  }
}

/// Where the lost body that an unmatched '}' ends begins: after the last top-level block with a
/// proper keyword, whose '}' came early. The blocks after it (`intra_node { ... }`) were its.
size_t lostBodyStart(Parser *parser) {
  auto *file = dynamic_cast<ParParser::FileContext *>(parser->getContext());
  if (!file)
    return 0;
  auto items = file->topItem();
  for (auto it = items.rbegin(); it != items.rend(); ++it) {
    auto *decl = (*it)->blockDecl();
    if (decl && !decl->name().empty() && (*it)->getStop() &&
        llvm::is_contained(blockKeywords(), decl->name(0)->getText()))
      return (*it)->getStop()->getTokenIndex() + 1;
  }
  return 0;
}

ParserRuleContext *enclosing(ParserRuleContext *ctx, size_t rule) {
  for (; ctx; ctx = dynamic_cast<ParserRuleContext *>(ctx->parent))
    if (ctx->getRuleIndex() == rule)
      return ctx;
  return nullptr;
}

/// A `model`, `cluster`, `parallel` or `train` block written inside another block. The AST
/// builder reports it as the missing '}' it nearly always is.
bool isMisplacedTopItem(ParserRuleContext *child) {
  auto *stmt = dynamic_cast<ParParser::StatementContext *>(child);
  auto *decl = stmt ? stmt->blockDecl() : nullptr;
  if (!decl || decl->name().empty())
    return false;
  return llvm::is_contained(blockKeywords(), decl->name(0)->getText());
}

std::string missingLayerColon(Token *name, Token *found) {
  return "expected ':' after layer name " + quoteText(name->getText()) +
         " (write 'layer NAME : KIND'), found " + describeFound(found);
}

/// `layer b : transformer x` with no count, or `lm_head tied` with no '(': the soft keyword
/// was taken for the start of another statement on the same line.
std::optional<std::string> brokenLayerTail(Parser *parser, Token *first, Token *second,
                                           Token *&at) {
  if (!first || !second || (first->getText() != "x" && first->getText() != "tied"))
    return std::nullopt;
  Token *before = tokenBefore(parser, first);
  if (!before || isSeparator(before) || before->getText() == "{")
    return std::nullopt;
  at = second;
  if (first->getText() == "x")
    return "expected a layer count after 'x', found " + describeFound(second);
  return "expected '(' after 'tied', found " + describeFound(second);
}

const llvm::StringRef kTopLevelWords[] = {"model", "cluster", "parallel", "train", "include"};
const char *kTopLevelExpected =
    "expected 'model', 'cluster', 'parallel for', 'train' or 'include' at the top level";

} // namespace

std::optional<std::string> HumanErrorStrategy::explain(Parser *parser, Token *offending,
                                                       const misc::IntervalSet &expected,
                                                       bool unwanted, Token *start, Token *&at) {
  at = offending;
  std::string found = describeFound(offending);
  Token *previous = tokenBefore(parser, offending);
  auto *ctx = parser->getContext();
  size_t rule = ctx ? ctx->getRuleIndex() : size_t(ParParser::RuleFile);
  const dfa::Vocabulary &vocab = parser->getVocabulary();
  bool atItemStart = !previous || isSeparator(previous) || previous->getText() == "{";
  std::string after = previous ? " after " + describeFound(previous) : "";

  // Running off the end inside a block: point at the brace that is still open, unless a
  // top-level block inside it shows where the '}' went missing (the AST builder says so).
  if (offending->getType() == Token::EOF) {
    ParserRuleContext *innermost = nullptr;
    for (auto *open = enclosing(ctx, ParParser::RuleBlock); open;
         open = enclosing(dynamic_cast<ParserRuleContext *>(open->parent), ParParser::RuleBlock)) {
      innermost = innermost ? innermost : open;
      for (auto *child : open->children)
        if (isMisplacedTopItem(dynamic_cast<ParserRuleContext *>(child)))
          return std::nullopt;
    }
    if (innermost) {
      diags.error(source.rangeOf(offending), "expected '}' before end of file");
      diags.note(source.rangeOf(innermost->getStart()), "to close the block opened here");
      return std::nullopt;
    }
  }

  if (rule == ParParser::RuleFile || rule == ParParser::RuleTopItem) {
    if (offending->getText() == "}") {
      unmatchedBrace = true;
      return std::string("unmatched '}': no block is open here");
    }
    if (!atItemStart)
      return "expected a newline or ';'" + after + ", found " + found;
    strayAtTopLevel = true;
    std::string hint;
    if (offending->getType() == ParLexer::IDENT)
      hint = didYouMean(offending->getText(), kTopLevelWords);
    return kTopLevelExpected + (", found " + found) + hint;
  }

  // A header that did not reach its '{': a field written outside any block, an unknown word
  // at the top level, or `model m` followed by something else.
  ParParser::BlockDeclContext *decl = nullptr;
  if (rule == ParParser::RuleBlockDecl)
    decl = static_cast<ParParser::BlockDeclContext *>(ctx);
  else if (rule == ParParser::RuleBlock && ctx->children.empty())
    decl = dynamic_cast<ParParser::BlockDeclContext *>(ctx->parent);
  if (decl) {
    Token *first = decl->getStart();
    bool topLevel = dynamic_cast<ParParser::TopItemContext *>(decl->parent) != nullptr;
    Token *second = tokenAt(parser, first->getTokenIndex() + 1);
    Token *third = second ? tokenAt(parser, second->getTokenIndex() + 1) : nullptr;
    if (auto message = brokenLayerTail(parser, first, second, at))
      return message;
    // `layer e embedding` reads as a block header until it fails to reach a '{'.
    if (!topLevel && first->getText() == "layer" && second && third &&
        isNameToken(second->getType(), vocab)) {
      at = third;
      return missingLayerColon(second, third);
    }
    if (offending->getText() == "=" && second && !topLevel) {
      at = second;
      return "expected '=' or '{' after " + quoteText(first->getText()) + ", found " +
             describeFound(second);
    }
    strayAtTopLevel = topLevel;
    if (topLevel && offending->getText() == "=" && second == offending) {
      at = first;
      return "field '" + first->getText() + "' is outside any block; fields belong inside a " +
             "model, cluster, parallel or train block";
    }
    if (topLevel && !llvm::is_contained(blockKeywords(), first->getText())) {
      at = first;
      return kTopLevelExpected + (", found " + describeFound(first)) +
             didYouMean(first->getText(), kTopLevelWords);
    }
    Token *last = decl->name().empty() ? first : decl->name().back()->getStart();
    llvm::SMRange headerRange = source.rangeBetween(first, last);
    llvm::StringRef header(headerRange.Start.getPointer(),
                           headerRange.End.getPointer() - headerRange.Start.getPointer());
    return "expected '{' after " + quoteText(header) + ", found " + found;
  }

  // A statement that starts with a name but is not `name = value`, `name {` or a layer.
  if (rule == ParParser::RuleStatement || rule == ParParser::RuleField) {
    Token *first = start ? start : ctx->getStart();
    Token *second = first ? tokenAt(parser, first->getTokenIndex() + 1) : nullptr;
    if (auto message = brokenLayerTail(parser, first, second, at))
      return message;
    if (first && second && first != offending && isNameToken(first->getType(), vocab)) {
      if (first->getText() == "layer" && isNameToken(second->getType(), vocab)) {
        Token *third = tokenAt(parser, second->getTokenIndex() + 1);
        if (third && third->getText() != ":" && third->getText() != "=") {
          at = third;
          return missingLayerColon(second, third);
        }
      }
      at = second;
      // `gpu memory = 80 GiB`: a block whose '{' is missing looks just like a field.
      Token *third = tokenAt(parser, second->getTokenIndex() + 1);
      if (third && third->getText() == "=" && isNameToken(second->getType(), vocab))
        return "expected '=' or '{' after " + quoteText(first->getText()) + ", found " +
               describeFound(second);
      return "expected '=' after field name " + quoteText(first->getText()) + ", found " +
             describeFound(second);
    }
  }
  if (rule == ParParser::RuleLayerDecl && previous && expected.contains(literalType(vocab, "':'")))
    return missingLayerColon(previous, offending);
  if (enclosing(ctx, ParParser::RuleLayerDecl) && previous && previous->getText() == ":")
    return "expected a layer kind (embedding, transformer or lm_head) after ':', found " + found;

  // `(5 + 5) GB/s`: a unit belongs to a number literal only.
  if (offending->getType() == ParLexer::RATE_UNIT && previous && previous->getText() == ")")
    return "a unit can only follow a number; write '(...) * 1 " + offending->getText() + "'";

  // Between statements: a token that starts nothing, or two statements on one line.
  if (rule == ParParser::RuleBlock && unwanted) {
    // `hidden = 1 heads = 2` reads `heads` as the unit of 1: the statement really ended at 1.
    Token *number = previous ? tokenBefore(parser, previous) : nullptr;
    if (offending->getText() == "=" && previous && previous->getType() == ParLexer::IDENT &&
        number && number->getType() == ParLexer::NUMBER) {
      at = previous;
      return "expected a newline or ';' after " + describeFound(number) + ", found " +
             describeFound(previous);
    }
    if (!atItemStart)
      return "expected a newline or ';'" + after + ", found " + found;
    return "expected a field, a nested block or a layer, found " + found;
  }
  std::string what = describeExpected(expected, vocab);
  if (previous && previous->getType() == ParLexer::NEWLINE)
    after = " at the start of a statement";
  return "expected " + what + after + ", found " + found;
}

void HumanErrorStrategy::report(Parser *parser, Token *offending, const misc::IntervalSet &expected,
                                bool unwanted, Token *start) {
  // The lexer already explained this line; what the parser makes of the rest is noise.
  Token *previous = tokenBefore(parser, offending);
  if (log.lexerErrorOnLine(offending->getLine()) ||
      (previous && log.lexerErrorOnLine(previous->getLine())) ||
      offending->getLine() == log.lastReportedLine) {
    log.tokenIndexes.push_back(offending->getTokenIndex());
    return;
  }
  Token *at = offending;
  strayAtTopLevel = unmatchedBrace = false;
  std::optional<std::string> message = explain(parser, offending, expected, unwanted, start, at);
  // Recorded where the message points, which may be before the token ANTLR stopped at: the
  // AST builder drops what contains it.
  log.tokenIndexes.push_back(at->getTokenIndex());
  // The lines of a lost block body each read as a stray top-level item, and its '}' as an
  // unmatched one: the error that lost the block is the one worth reading.
  size_t index = offending->getTokenIndex();
  if ((strayAtTopLevel || unmatchedBrace) && log.inLostBody(index))
    return;
  if (strayAtTopLevel) {
    size_t close = unmatchedCloseAfter(parser, index);
    if (close != INVALID_INDEX)
      log.lostBodies.push_back({index, close});
  }
  // A '}' that closed its block early leaves the rest of the body at the top level, up to
  // this one: its nested blocks are not reported as unknown top-level blocks.
  if (unmatchedBrace)
    log.lostBodies.push_back({lostBodyStart(parser), index});
  log.lastReportedLine = at->getLine();
  if (message)
    diags.error(source.rangeOf(at), *message);
  // Recovering from the rest of a hostile file costs time for errors nobody sees.
  if (diags.reachedErrorLimit())
    throw ParseCancellationException();
}

void HumanErrorStrategy::consumeUntil(Parser *parser, const misc::IntervalSet &set) {
  // Skip a braced group whole: stopping at its '}' would close the enclosing block early. A
  // statement ends at its line, whatever ANTLR's follow sets say: skipping past the newline
  // would swallow the next statement.
  // Inside a block a name in the middle of a line is the rest of the broken statement, not
  // the start of a fresh one.
  bool inBlock = enclosing(parser->getContext(), ParParser::RuleBlock) != nullptr;
  const dfa::Vocabulary &vocab = parser->getVocabulary();
  unsigned depth = 0;
  for (Token *t = parser->getCurrentToken(); t->getType() != Token::EOF;
       t = parser->getCurrentToken()) {
    std::string text = t->getText();
    Token *before = tokenBefore(parser, t);
    bool startsLine = !before || isSeparator(before) || before->getText() == "{";
    bool resumes =
        set.contains(t->getType()) && (!inBlock || startsLine || !isNameToken(t->getType(), vocab));
    if (depth == 0 && (resumes || isSeparator(t)))
      return;
    if (text == "{")
      ++depth;
    else if (text == "}" && depth > 0)
      --depth;
    parser->consume();
  }
}

void HumanErrorStrategy::sync(Parser *parser) {
  // At the entry of a loop ANTLR gives up on the whole rule when the first token does not fit,
  // and the recovery then skips the rest of the block. For the statements of a block and the
  // items of a file, skip just the bad tokens, as ANTLR does between iterations.
  size_t rule = parser->getContext()->getRuleIndex();
  bool header = rule == ParParser::RuleBlockDecl;
  if (inErrorRecoveryMode(parser) ||
      (rule != ParParser::RuleBlock && rule != ParParser::RuleFile && !header)) {
    DefaultErrorStrategy::sync(parser);
    return;
  }
  atn::ATNState *state = parser->getATN().states[parser->getState()];
  const misc::IntervalSet &next = parser->getATN().nextTokens(state);
  size_t la = parser->getTokenStream()->LA(1);
  if (next.contains(Token::EPSILON) || next.contains(la))
    return;
  if (header) {
    // A header with something odd in it: skip to its '{' if that is on the header's line;
    // otherwise give up on the header rather than take a '{' further down as its own.
    reportUnwantedToken(parser);
    size_t headerLine = parser->getContext()->getStart()->getLine();
    for (Token *t = parser->getCurrentToken(); t->getLine() == headerLine;
         t = parser->getCurrentToken()) {
      if (t->getText() == "{")
        return;
      if (t->getType() == Token::EOF || isSeparator(t) || t->getText() == "}")
        break;
      parser->consume();
    }
    throw InputMismatchException(parser);
  }
  if (singleTokenDeletion(parser))
    return;
  reportUnwantedToken(parser);
  consumeUntil(parser, getExpectedTokens(parser).Or(getErrorRecoverySet(parser)));
}

/// The parser is at the '{' that opens a block.
static bool atBlockStart(Parser *parser) {
  auto *ctx = parser->getContext();
  return ctx && ctx->getRuleIndex() == ParParser::RuleBlock && ctx->children.empty();
}

bool HumanErrorStrategy::singleTokenInsertion(Parser *parser) {
  // Never make up a missing '{': everything after it would be read as that block's body.
  if (atBlockStart(parser))
    return false;
  return DefaultErrorStrategy::singleTokenInsertion(parser);
}

Token *HumanErrorStrategy::singleTokenDeletion(Parser *parser) {
  // Nor skip a line's first word to reach a '{': that brace opens the next line's block. Nor
  // skip a newline or ';': `lr = 3e-4 +` would take the next line's first name as its operand.
  if (atBlockStart(parser) || isSeparator(parser->getCurrentToken()))
    return nullptr;
  return DefaultErrorStrategy::singleTokenDeletion(parser);
}

void HumanErrorStrategy::reportNoViableAlternative(Parser *parser,
                                                   const NoViableAltException &e) {
  report(parser, e.getOffendingToken(), parser->getExpectedTokens(), false, e.getStartToken());
}

void HumanErrorStrategy::reportInputMismatch(Parser *parser, const InputMismatchException &e) {
  report(parser, e.getOffendingToken(), e.getExpectedTokens(), false);
}

void HumanErrorStrategy::reportFailedPredicate(Parser *parser,
                                               const FailedPredicateException &e) {
  report(parser, e.getOffendingToken(), parser->getExpectedTokens(), false);
}

void HumanErrorStrategy::reportUnwantedToken(Parser *parser) {
  if (inErrorRecoveryMode(parser))
    return;
  beginErrorCondition(parser);
  report(parser, parser->getCurrentToken(), getExpectedTokens(parser), true);
}

void HumanErrorStrategy::reportMissingToken(Parser *parser) {
  if (inErrorRecoveryMode(parser))
    return;
  beginErrorCondition(parser);
  report(parser, parser->getCurrentToken(), getExpectedTokens(parser), false);
}

} // namespace parc::frontend
