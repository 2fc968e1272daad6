//===- ASTBuilder.cpp - ANTLR parse tree -> parc AST ----------------------===//
//
// Walks the typed contexts ANTLR generated. A statement that failed to parse (an error was
// reported inside it or where it ends) is dropped here and its block marked: the syntax error
// was already reported, and semantic analysis should not pile a second error on the same
// mistake. Block headers are checked here rather than in the grammar (see Par.g4).
//
//===----------------------------------------------------------------------===//
#include "FrontendInternal.h"
#include "parc/Support/NameSuggest.h"

#include <optional>

namespace parc::frontend {

llvm::ArrayRef<llvm::StringRef> blockKeywords() {
  static const llvm::StringRef keywords[] = {"model", "cluster", "parallel", "train"};
  return keywords;
}

namespace {

using P = ParParser;

struct HeaderWord {
  std::string text;
  llvm::SMRange range;
};

/// One place in a top-level header: a keyword, or a name the user chooses.
struct HeaderSlot {
  llvm::StringRef keyword;  // empty for a name
  llvm::StringRef nameRole; // "model name", ... for a name
};

std::vector<HeaderSlot> headerPattern(llvm::StringRef keyword) {
  if (keyword == "model")
    return {{"model", ""}, {"", "model name"}};
  if (keyword == "cluster")
    return {{"cluster", ""}, {"", "cluster name"}};
  if (keyword == "parallel")
    return {{"parallel", ""}, {"for", ""}, {"", "model name"}, {"on", ""}, {"", "cluster name"}};
  return {{"train", ""}};
}

ast::Block::Kind blockKindOf(llvm::StringRef keyword) {
  return keyword == "model"      ? ast::Block::Model
         : keyword == "cluster"  ? ast::Block::Cluster
         : keyword == "parallel" ? ast::Block::Parallel
                                 : ast::Block::Train;
}

/// "model 'm'", "block 'gpu'", "parallel block": the block a message is about.
std::string describeBlock(const ast::Block &block) {
  if (block.kind == ast::Block::Nested)
    return "block '" + block.name + "'";
  if (block.name.empty())
    return std::string(ast::blockKindName(block.kind)) + " block";
  return std::string(ast::blockKindName(block.kind)) + " '" + block.name + "'";
}

class ASTBuilder {
public:
  ASTBuilder(const SourceText &source, DiagnosticEngine &diags, const SyntaxErrorLog &log,
             const IncludeHandler &onInclude)
      : source(source), diags(diags), log(log), onInclude(onInclude) {}

  void buildFile(P::FileContext *file, ast::Module &out);

private:
  using Blocks = std::vector<std::unique_ptr<ast::Block>>;

  /// Did parsing `ctx` fail, or was an error reported inside it or at the token that ends it?
  bool hasError(antlr4::ParserRuleContext *ctx) const;
  static std::string textOf(P::NameContext *name) { return name ? name->getText() : ""; }
  /// A block whose '{' was never found is only a header; the tokens after it are not its body.
  static bool opened(P::BlockContext *body) {
    return body && body->getStart() && body->getStart()->getText() == "{";
  }
  std::string describeToken(antlr4::Token *token) const;
  /// Two statements (or top-level items) with no newline or ';' between them.
  void checkSeparated(const std::vector<antlr4::tree::ParseTree *> &children);

  std::vector<HeaderWord> headerWords(P::BlockDeclContext *decl) const;
  /// Reports an include whose path is not a string.
  bool quotedPath(P::IncludeDeclContext *inc);
  bool readHeader(const std::vector<HeaderWord> &words, llvm::SMRange brace, ast::Block &block);
  std::unique_ptr<ast::Block> buildTopBlock(P::BlockDeclContext *decl, ast::Module &module);
  void fillBlock(P::BlockContext *ctx, ast::Block &block, ast::Module &module);
  void buildStatement(P::StatementContext *stmt, ast::Block &block, ast::Module &module);
  std::optional<ast::Field> buildField(P::FieldContext *ctx);
  std::optional<ast::LayerDecl> buildLayer(P::LayerDeclContext *ctx);
  std::unique_ptr<ast::Expr> buildExpr(P::ExprContext *ctx);
  bool buildArgs(const std::vector<P::FieldContext *> &fields, std::vector<ast::Field> &out);

  const SourceText &source;
  DiagnosticEngine &diags;
  const SyntaxErrorLog &log;
  const IncludeHandler &onInclude;
  /// Top-level blocks found inside other blocks (a '}' was missing), added after the block
  /// they were found in.
  Blocks hoisted;
  const ast::Block *unclosedReported = nullptr;
};

bool ASTBuilder::hasError(antlr4::ParserRuleContext *ctx) const {
  if (!ctx || ctx->exception || !ctx->getStart())
    return true;
  size_t first = ctx->getStart()->getTokenIndex();
  antlr4::Token *stop = ctx->getStop();
  size_t last = stop && stop->getTokenIndex() != INVALID_INDEX && stop->getTokenIndex() >= first
                    ? stop->getTokenIndex()
                    : first;
  if (log.anyBetween(first, last + 1))
    return true;
  // The lexer dropped characters it could not read; what is left of the line is not what
  // was meant.
  size_t lastLine = stop && stop->getLine() >= ctx->getStart()->getLine()
                        ? stop->getLine()
                        : ctx->getStart()->getLine();
  for (size_t line = ctx->getStart()->getLine(); line <= lastLine; ++line)
    if (log.lexerErrorOnLine(line))
      return true;
  return false;
}

std::string ASTBuilder::describeToken(antlr4::Token *token) const {
  if (token->getType() == ParParser::NEWLINE)
    return "end of line";
  std::string text = token->getText();
  std::string quoted = "'" + (text.size() > 40 ? text.substr(0, 32) + "..." : text) + "'";
  return token->getType() == ParParser::NUMBER ? "number " + quoted : quoted;
}

void ASTBuilder::checkSeparated(const std::vector<antlr4::tree::ParseTree *> &children) {
  for (size_t i = 1; i < children.size(); ++i) {
    auto *prev = dynamic_cast<antlr4::ParserRuleContext *>(children[i - 1]);
    auto *next = dynamic_cast<antlr4::ParserRuleContext *>(children[i]);
    bool items =
        (dynamic_cast<P::StatementContext *>(prev) && dynamic_cast<P::StatementContext *>(next)) ||
        (dynamic_cast<P::TopItemContext *>(prev) && dynamic_cast<P::TopItemContext *>(next));
    if (!items || hasError(prev) || hasError(next) || !prev->getStop())
      continue;
    diags.error(source.rangeOf(next->getStart()), "expected a newline or ';' after " +
                                                      describeToken(prev->getStop()) + ", found " +
                                                      describeToken(next->getStart()));
  }
}

std::vector<HeaderWord> ASTBuilder::headerWords(P::BlockDeclContext *decl) const {
  std::vector<HeaderWord> words;
  for (P::NameContext *name : decl->name())
    words.push_back({textOf(name), source.rangeOf(name)});
  return words;
}

bool ASTBuilder::quotedPath(P::IncludeDeclContext *inc) {
  if (inc->path)
    return true;
  antlr4::Token *keyword = inc->getStart();
  antlr4::Token *last = inc->getStop();
  if (!last || last == keyword) {
    diags.error(source.rangeOf(keyword), "expected a quoted file name after 'include', as in "
                                         "'include \"cluster.par\"'");
    return false;
  }
  llvm::SMRange path = source.rangeBetween(
      dynamic_cast<antlr4::tree::TerminalNode *>(inc->children[1])->getSymbol(), last);
  llvm::StringRef text(path.Start.getPointer(), path.End.getPointer() - path.Start.getPointer());
  diags.error(path,
              "the file name after 'include' must be in double quotes: 'include \"" + text + "\"'");
  return false;
}

/// Reads `model NAME`, `cluster NAME`, `parallel [NAME] for MODEL on CLUSTER` or `train` into
/// `block`. Reports the first thing wrong with the header, and returns true when the intent
/// is still clear (a misspelt or missing keyword, a trailing word) so that the block's
/// contents are checked as well.
bool ASTBuilder::readHeader(const std::vector<HeaderWord> &allWords, llvm::SMRange brace,
                            ast::Block &block) {
  // `parallel NAME for MODEL on CLUSTER`: a named mapping, one of several in a file.
  std::vector<HeaderWord> words = allWords;
  std::optional<HeaderWord> mappingName;
  if (words.size() >= 3 && words[0].text == "parallel" && words[1].text != "for" &&
      words[2].text == "for") {
    mappingName = words[1];
    words.erase(words.begin() + 1);
  }
  llvm::StringRef keyword = words[0].text;
  bool reported = false;
  auto fail = [&](llvm::SMRange where, const llvm::Twine &message, bool recoverable) {
    if (!reported)
      diags.error(where, message);
    reported = true;
    return recoverable;
  };
  if (!llvm::is_contained(blockKeywords(), keyword)) {
    auto guess = suggestName(keyword, blockKeywords());
    if (!fail(words[0].range,
              "unknown top-level block '" + keyword + "'" +
                  (guess ? "; did you mean '" + *guess + "'?"
                         : std::string("; expected 'model', 'cluster', 'parallel for' or "
                                       "'train'")),
              guess.has_value()))
      return false;
    keyword = blockKeywords()[llvm::find(blockKeywords(), *guess) - blockKeywords().begin()];
  }
  std::vector<HeaderSlot> pattern = headerPattern(keyword);
  const char *usage = keyword == "parallel" ? "; write 'parallel for MODEL on CLUSTER'" : "";
  bool oneMissing = words.size() + 1 == pattern.size();
  std::vector<HeaderWord> names;
  size_t next = 1;
  for (size_t slot = 1; slot < pattern.size(); ++slot) {
    const HeaderWord *word = next < words.size() ? &words[next] : nullptr;
    const HeaderSlot &previous = pattern[slot - 1];
    // "'parallel'", "model name 'gpt'": what the missing or wrong word should follow.
    std::string after = previous.keyword.empty()
                            ? previous.nameRole.str() + " '" + words[next - 1].text + "'"
                            : "'" + previous.keyword.str() + "'";
    std::string found = word ? "'" + word->text + "'" : std::string("'{'");
    llvm::SMRange where = word ? word->range : brace;
    llvm::StringRef keywordHere = pattern[slot].keyword;
    if (!keywordHere.empty()) {
      if (word && word->text == keywordHere) {
        ++next;
        continue;
      }
      // `parallel for m onn c`: a misspelling in the right place.
      if (word && words.size() == pattern.size() && suggestName(word->text, {keywordHere})) {
        fail(where,
             "expected '" + keywordHere + "' after " + after + ", found " + found +
                 "; did you mean '" + keywordHere + "'?",
             true);
        ++next;
        continue;
      }
      // `parallel gpt on c`: the keyword is missing and everything else is there.
      if (!fail(where, "expected '" + keywordHere + "' after " + after + ", found " + found + usage,
                word && oneMissing))
        return false;
      continue;
    }
    // A name slot. The keyword that should follow it in its place means the name is missing.
    bool keywordInstead =
        word && slot + 1 < pattern.size() && word->text == pattern[slot + 1].keyword;
    if (!word || keywordInstead) {
      fail(where,
           "expected a " + pattern[slot].nameRole + " after " + after + ", found " + found + usage,
           false);
      return false;
    }
    names.push_back(*word);
    ++next;
  }
  if (next < words.size())
    fail(words[next].range,
         "expected '{' after '" + words[next - 1].text + "', found '" + words[next].text + "'",
         true);

  block.kind = blockKindOf(keyword);
  block.headerRange = {words.front().range.Start, words.back().range.End};
  if (mappingName) {
    block.name = mappingName->text;
    block.nameRange = mappingName->range;
  }
  if (block.kind == ast::Block::Model || block.kind == ast::Block::Cluster) {
    block.name = names[0].text;
    block.nameRange = names[0].range;
  } else if (block.kind == ast::Block::Parallel) {
    block.modelRef = names[0].text;
    block.modelRefRange = names[0].range;
    block.clusterRef = names[1].text;
    block.clusterRefRange = names[1].range;
  }
  return true;
}

std::unique_ptr<ast::Block> ASTBuilder::buildTopBlock(P::BlockDeclContext *decl,
                                                      ast::Module &module) {
  P::BlockContext *body = decl->block();
  std::vector<HeaderWord> words = headerWords(decl);
  if (!opened(body) || words.empty() || hasError(decl->name().back()))
    return nullptr;
  // A block inside the lost body of another (`gpu { ... }` after a stray '}' closed its
  // cluster): the error that lost the body was reported.
  if (log.inLostBody(decl->getStart()->getTokenIndex()) &&
      !llvm::is_contained(blockKeywords(), words[0].text))
    return nullptr;
  auto block = std::make_unique<ast::Block>();
  if (!readHeader(words, source.rangeOf(body->getStart()), *block)) {
    if (words.size() > 1)
      module.unparsedBlockNames.push_back(words[1].text);
    return nullptr;
  }
  fillBlock(body, *block, module);
  return block;
}

void ASTBuilder::buildFile(P::FileContext *file, ast::Module &out) {
  checkSeparated(file->children);
  for (P::TopItemContext *item : file->topItem()) {
    if (auto *inc = item->includeDecl()) {
      if (hasError(inc) || !quotedPath(inc))
        continue;
      std::string quoted = inc->path->getText();
      std::string path = quoted.substr(1, quoted.size() - 2);
      onInclude(path, source.rangeOf(inc->path), out);
      continue;
    }
    auto *decl = item->blockDecl();
    if (!decl)
      continue;
    if (auto block = buildTopBlock(decl, out))
      out.blocks.push_back(std::move(block));
    for (auto &found : hoisted)
      out.blocks.push_back(std::move(found));
    hoisted.clear();
  }
}

void ASTBuilder::fillBlock(P::BlockContext *ctx, ast::Block &block, ast::Module &module) {
  antlr4::Token *close = ctx->getStop();
  block.closeLoc = source.rangeOf(close).Start;
  // An error node directly in the block is a token ANTLR skipped or made up between
  // statements, such as a missing '}'.
  block.hasSyntaxErrors = ctx->exception || !close || close->getText() != "}" ||
                          llvm::any_of(ctx->children, [](antlr4::tree::ParseTree *child) {
                            return dynamic_cast<antlr4::tree::ErrorNode *>(child) != nullptr;
                          });
  checkSeparated(ctx->children);
  for (P::StatementContext *stmt : ctx->statement())
    buildStatement(stmt, block, module);
}

void ASTBuilder::buildStatement(P::StatementContext *stmt, ast::Block &block, ast::Module &module) {
  if (auto *decl = stmt->blockDecl()) {
    std::vector<HeaderWord> words = headerWords(decl);
    if (!opened(decl->block()) || words.empty()) {
      block.hasSyntaxErrors = true;
      return;
    }
    if (llvm::is_contained(blockKeywords(), words[0].text)) {
      // `cluster c {` inside a model: the model's '}' is missing above it. Read it as the
      // top-level block it was meant to be.
      llvm::SMRange header{words.front().range.Start, words.back().range.End};
      llvm::StringRef headerText(header.Start.getPointer(),
                                 header.End.getPointer() - header.Start.getPointer());
      // One missing '}' often swallows every block after it: say so once.
      if (unclosedReported != &block) {
        diags.error(header, "expected '}' to close " + describeBlock(block) + " before '" +
                                headerText + "'");
        diags.note(block.headerRange, describeBlock(block) + " starts here");
        unclosedReported = &block;
      }
      block.hasSyntaxErrors = true;
      if (auto top = buildTopBlock(decl, module))
        hoisted.push_back(std::move(top));
      return;
    }
    if (words.size() > 1) {
      // Which of the words names the block is anyone's guess: check neither.
      diags.error(words[1].range,
                  "expected '{' after '" + words[0].text + "', found '" + words[1].text + "'");
      block.hasSyntaxErrors = true;
      block.unparsedNames.push_back(words[0].text);
      return;
    }
    auto nested = std::make_unique<ast::Block>();
    nested->kind = ast::Block::Nested;
    nested->name = words[0].text;
    nested->nameRange = words[0].range;
    nested->headerRange = nested->nameRange;
    fillBlock(decl->block(), *nested, module);
    block.statements.emplace_back(std::move(nested));
    return;
  }
  if (auto *inc = stmt->includeDecl()) {
    if (!hasError(inc) && quotedPath(inc))
      diags.error(source.rangeOf(inc->getStart()),
                  "'include' is only allowed at the top level, outside every block");
    block.hasSyntaxErrors = true;
    return;
  }
  if (hasError(stmt)) {
    // `hidden 12`: whatever the statement was meant to be, it is about its first name.
    block.hasSyntaxErrors = true;
    antlr4::Token *first = stmt->getStart();
    if (first && first->getType() == ParParser::IDENT)
      block.unparsedNames.push_back(first->getText());
    return;
  }
  if (auto *f = stmt->field()) {
    if (auto field = buildField(f))
      block.statements.emplace_back(std::move(*field));
  } else if (auto *l = stmt->layerDecl()) {
    if (auto layer = buildLayer(l))
      block.statements.emplace_back(std::move(*layer));
  }
}

std::optional<ast::Field> ASTBuilder::buildField(P::FieldContext *ctx) {
  if (!ctx || ctx->exception || !ctx->name())
    return std::nullopt;
  auto value = buildExpr(ctx->expr());
  if (!value)
    return std::nullopt;
  ast::Field field;
  field.name = textOf(ctx->name());
  field.nameRange = source.rangeOf(ctx->name());
  field.value = std::move(value);
  field.range = source.rangeOf(ctx);
  return field;
}

bool ASTBuilder::buildArgs(const std::vector<P::FieldContext *> &fields,
                           std::vector<ast::Field> &out) {
  for (P::FieldContext *f : fields) {
    auto field = buildField(f);
    if (!field)
      return false;
    out.push_back(std::move(*field));
  }
  return true;
}

std::optional<ast::LayerDecl> ASTBuilder::buildLayer(P::LayerDeclContext *ctx) {
  if (!ctx || ctx->exception || ctx->name().size() < 2)
    return std::nullopt;
  ast::LayerDecl layer;
  layer.name = textOf(ctx->name(0));
  layer.nameRange = source.rangeOf(ctx->name(0));
  layer.kind = textOf(ctx->kind);
  layer.kindRange = source.rangeOf(ctx->kind);
  layer.range = source.rangeOf(ctx);
  if (auto *o = ctx->overrides()) {
    if (o->exception || !buildArgs(o->field(), layer.overrides))
      return std::nullopt;
  }
  if (auto *t = ctx->tie()) {
    if (t->exception || !t->name())
      return std::nullopt;
    layer.tiedTo = textOf(t->name());
    layer.tiedRange = source.rangeOf(t->name());
  }
  if (auto *r = ctx->repeat()) {
    if (r->exception || !(layer.repeat = buildExpr(r->expr())))
      return std::nullopt;
  }
  return layer;
}

std::unique_ptr<ast::Expr> ASTBuilder::buildExpr(P::ExprContext *ctx) {
  if (!ctx || ctx->exception)
    return nullptr;
  llvm::SMRange range = source.rangeOf(ctx);
  auto make = [&](ast::Expr::Kind kind) { return std::make_unique<ast::Expr>(kind, range); };

  if (auto *paren = dynamic_cast<P::ParenExprContext *>(ctx)) {
    auto inner = buildExpr(paren->expr());
    if (inner)
      inner->range = range; // errors about the value point at the parentheses too
    return inner;
  }
  if (auto *unary = dynamic_cast<P::UnaryExprContext *>(ctx)) {
    auto operand = buildExpr(unary->expr());
    if (!operand || !unary->op)
      return nullptr;
    auto e = make(ast::Expr::Unary);
    e->op = unary->op->getText()[0];
    e->operands.push_back(std::move(operand));
    return e;
  }
  auto binary = [&](P::ExprContext *lhs, P::ExprContext *rhs,
                    antlr4::Token *op) -> std::unique_ptr<ast::Expr> {
    auto l = buildExpr(lhs), r = buildExpr(rhs);
    if (!l || !r || !op)
      return nullptr;
    auto e = make(ast::Expr::Binary);
    e->op = op->getText()[0];
    e->operands.push_back(std::move(l));
    e->operands.push_back(std::move(r));
    return e;
  };
  if (auto *mul = dynamic_cast<P::MulExprContext *>(ctx))
    return mul->expr().size() == 2 ? binary(mul->expr(0), mul->expr(1), mul->op) : nullptr;
  if (auto *add = dynamic_cast<P::AddExprContext *>(ctx))
    return add->expr().size() == 2 ? binary(add->expr(0), add->expr(1), add->op) : nullptr;
  if (auto *num = dynamic_cast<P::NumberExprContext *>(ctx)) {
    if (!num->NUMBER())
      return nullptr;
    auto e = make(ast::Expr::Number);
    e->literal = num->NUMBER()->getText();
    if (auto *unit = num->unit()) {
      if (unit->exception)
        return nullptr;
      e->unit = unit->getText();
      e->unitRange = source.rangeOf(unit);
    }
    return e;
  }
  if (auto *call = dynamic_cast<P::CallExprContext *>(ctx)) {
    if (!call->name())
      return nullptr;
    auto e = make(ast::Expr::Call);
    e->path.push_back(textOf(call->name()));
    for (P::CallArgContext *arg : call->callArg()) {
      if (!arg || arg->exception)
        return nullptr;
      if (P::FieldContext *named = arg->field()) {
        auto field = buildField(named);
        if (!field)
          return nullptr;
        e->args.push_back(std::move(*field));
        continue;
      }
      ast::CallArg value;
      value.comparison = arg->cmp ? arg->cmp->getText() : "";
      value.value = buildExpr(arg->expr());
      value.range = source.rangeOf(arg);
      if (!value.value)
        return nullptr;
      e->values.push_back(std::move(value));
    }
    return e;
  }
  if (auto *ref = dynamic_cast<P::RefExprContext *>(ctx)) {
    auto e = make(ast::Expr::Ref);
    for (P::NameContext *part : ref->name())
      e->path.push_back(textOf(part));
    return e->path.empty() ? nullptr : std::move(e);
  }
  if (auto *list = dynamic_cast<P::ListExprContext *>(ctx)) {
    auto e = make(ast::Expr::List);
    for (P::ExprContext *elem : list->expr()) {
      auto element = buildExpr(elem);
      if (!element)
        return nullptr;
      e->operands.push_back(std::move(element));
    }
    return e;
  }
  if (auto *str = dynamic_cast<P::StringExprContext *>(ctx)) {
    if (!str->STRING())
      return nullptr;
    auto e = make(ast::Expr::String);
    std::string quoted = str->STRING()->getText();
    e->text = quoted.substr(1, quoted.size() - 2);
    return e;
  }
  return nullptr;
}

} // namespace

void buildAST(ParParser::FileContext *file, const SourceText &source, DiagnosticEngine &diags,
              const SyntaxErrorLog &log, const IncludeHandler &onInclude, ast::Module &out) {
  if (file)
    ASTBuilder(source, diags, log, onInclude).buildFile(file, out);
}

} // namespace parc::frontend
