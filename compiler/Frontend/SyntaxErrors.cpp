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
  for (size_t i = 0; i < bytes.size();) {
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
    return "control character 0x" + llvm::utohexstr(c, /*LowerCase=*/false, 2);
  // Non-ASCII outside comments and strings: show the whole code point.
  const llvm::UTF8 *start = reinterpret_cast<const llvm::UTF8 *>(bytes.data() + offset);
  const llvm::UTF8 *end = reinterpret_cast<const llvm::UTF8 *>(bytes.end());
  llvm::UTF32 cp = 0;
  llvm::UTF32 *out = &cp;
  llvm::ConvertUTF8toUTF32(&start, end, &out, out + 1, llvm::lenientConversion);
  return "character U+" + llvm::utohexstr(cp, false, 4);
}

void ReportingLexer::notifyListeners(const LexerNoViableAltException &) {
  llvm::SMLoc loc = source.locAtCodePoint(tokenStartCharIndex);
  size_t offset = loc.getPointer() - source.bytes().data();
  if (offset >= source.bytes().size())
    return;
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

/// How a token reads in "expected X, found Y".
std::string describeFound(Token *token) {
  switch (token->getType()) {
  case Token::EOF:
    return "end of file";
  case ParLexer::NEWLINE:
    return "end of line";
  case ParLexer::NUMBER:
    return "number '" + token->getText() + "'";
  case ParLexer::STRING:
    return "string " + token->getText();
  default:
    return "'" + token->getText() + "'";
  }
}

bool isNameToken(size_t type, const dfa::Vocabulary &vocab) {
  if (type == ParLexer::IDENT)
    return true;
  // Soft keywords are literal tokens the `name` rule also accepts.
  std::string literal = vocab.getLiteralName(type);
  return literal.size() > 2 && llvm::isAlnum(literal[1]);
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

Token *tokenBefore(Parser *parser, Token *token) {
  size_t index = token->getTokenIndex();
  if (index == 0 || index == INVALID_INDEX)
    return nullptr;
  return parser->getTokenStream()->get(index - 1);
}

const llvm::StringRef kTopLevelKeywords[] = {"model", "cluster", "parallel", "train", "include"};

} // namespace

void HumanErrorStrategy::report(Parser *parser, Token *offending,
                                const misc::IntervalSet &expected, bool unwanted) {
  llvm::SMRange where = source.rangeOf(offending);
  std::string found = describeFound(offending);
  Token *previous = tokenBefore(parser, offending);
  auto *ctx = parser->getContext();
  size_t rule = ctx ? ctx->getRuleIndex() : size_t(ParParser::RuleFile);
  const dfa::Vocabulary &vocab = parser->getVocabulary();

  // Top level: only block keywords may start an item.
  if (rule == ParParser::RuleFile || rule == ParParser::RuleTopItem) {
    std::string hint;
    if (offending->getType() == ParLexer::IDENT)
      hint = didYouMean(offending->getText(), kTopLevelKeywords);
    diags.error(where, "expected 'model', 'cluster', 'parallel for', 'train' or 'include' at "
                       "the top level, found " + found + hint);
    return;
  }
  // `hidden 12288` or `hidden: 12288`: a name that starts a statement but no '=' after it.
  if (rule == ParParser::RuleStatement || rule == ParParser::RuleField) {
    Token *start = ctx->getStart();
    if (start && start != offending && isNameToken(start->getType(), vocab) &&
        start->getText() != "layer") {
      diags.error(where, "expected '=' after field name '" + start->getText() + "', found " +
                             found);
      return;
    }
  }
  if (rule == ParParser::RuleLayerDecl && previous && previous->getText() == ":") {
    diags.error(where, "expected a layer kind (embedding, transformer or lm_head) after ':', "
                       "found " + found);
    return;
  }
  // Running off the end inside a block: point at the brace that is still open.
  if (offending->getType() == Token::EOF) {
    for (auto *open = ctx; open; open = dynamic_cast<ParserRuleContext *>(open->parent)) {
      if (open->getRuleIndex() != ParParser::RuleBlock)
        continue;
      diags.error(where, "expected '}' before end of file");
      diags.note(source.rangeOf(open->getStart()), "to close the block opened here");
      return;
    }
  }
  std::string what = describeExpected(expected, vocab);
  if (unwanted && rule == ParParser::RuleBlock)
    what = "a newline or ';'";
  std::string after = previous ? " after " + describeFound(previous) : "";
  if (previous && previous->getType() == ParLexer::NEWLINE)
    after = " at the start of a statement";
  diags.error(where, "expected " + what + after + ", found " + found);
}

void HumanErrorStrategy::reportNoViableAlternative(Parser *parser,
                                                   const NoViableAltException &e) {
  report(parser, e.getOffendingToken(), parser->getExpectedTokens(), false);
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
