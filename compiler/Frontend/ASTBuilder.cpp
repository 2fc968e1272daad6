//===- ASTBuilder.cpp - ANTLR parse tree -> parc AST ----------------------===//
//
// Walks the typed contexts ANTLR generated. A context that failed to parse (its exception is
// set, or a child it needs is missing) is dropped here: the syntax error was already reported,
// and semantic analysis should not pile a second error on the same mistake.
//
//===----------------------------------------------------------------------===//
#include "FrontendInternal.h"

#include <optional>

namespace parc::frontend {
namespace {

using P = ParParser;

class ASTBuilder {
public:
  ASTBuilder(const SourceText &source, DiagnosticEngine &diags, const IncludeHandler &onInclude)
      : source(source), diags(diags), onInclude(onInclude) {}

  void buildFile(P::FileContext *file, std::vector<std::unique_ptr<ast::Block>> &out);

private:
  static bool broken(antlr4::ParserRuleContext *ctx) { return !ctx || ctx->exception; }
  static std::string textOf(P::NameContext *name) { return name ? name->getText() : ""; }

  std::unique_ptr<ast::Block> buildBlock(P::BlockContext *ctx, ast::Block::Kind kind);
  std::optional<ast::Field> buildField(P::FieldContext *ctx);
  std::optional<ast::LayerDecl> buildLayer(P::LayerDeclContext *ctx);
  std::unique_ptr<ast::Expr> buildExpr(P::ExprContext *ctx);
  bool buildArgs(const std::vector<P::FieldContext *> &fields, std::vector<ast::Field> &out);

  const SourceText &source;
  DiagnosticEngine &diags;
  const IncludeHandler &onInclude;
};

void ASTBuilder::buildFile(P::FileContext *file, std::vector<std::unique_ptr<ast::Block>> &out) {
  for (P::TopItemContext *item : file->topItem()) {
    if (broken(item))
      continue;
    if (auto *inc = item->includeDecl()) {
      if (broken(inc) || !inc->STRING())
        continue;
      std::string quoted = inc->STRING()->getText();
      std::string path = quoted.substr(1, quoted.size() - 2);
      for (auto &block : onInclude(path, source.rangeOf(inc->STRING()->getSymbol())))
        out.push_back(std::move(block));
      continue;
    }
    std::unique_ptr<ast::Block> block;
    if (auto *m = item->modelDecl(); m && !broken(m) && m->name()) {
      block = buildBlock(m->block(), ast::Block::Model);
      if (block) {
        block->name = textOf(m->name());
        block->nameRange = source.rangeOf(m->name());
        block->headerRange = source.rangeBetween(m->getStart(), m->name()->getStop());
      }
    } else if (auto *c = item->clusterDecl(); c && !broken(c) && c->name()) {
      block = buildBlock(c->block(), ast::Block::Cluster);
      if (block) {
        block->name = textOf(c->name());
        block->nameRange = source.rangeOf(c->name());
        block->headerRange = source.rangeBetween(c->getStart(), c->name()->getStop());
      }
    } else if (auto *p = item->parallelDecl(); p && !broken(p) && p->model && p->cluster) {
      block = buildBlock(p->block(), ast::Block::Parallel);
      if (block) {
        block->modelRef = textOf(p->model);
        block->modelRefRange = source.rangeOf(p->model);
        block->clusterRef = textOf(p->cluster);
        block->clusterRefRange = source.rangeOf(p->cluster);
        block->headerRange = source.rangeBetween(p->getStart(), p->cluster->getStop());
      }
    } else if (auto *t = item->trainDecl(); t && !broken(t)) {
      block = buildBlock(t->block(), ast::Block::Train);
      if (block)
        block->headerRange = source.rangeOf(t->getStart());
    }
    if (block)
      out.push_back(std::move(block));
  }
}

std::unique_ptr<ast::Block> ASTBuilder::buildBlock(P::BlockContext *ctx, ast::Block::Kind kind) {
  if (broken(ctx))
    return nullptr;
  auto block = std::make_unique<ast::Block>();
  block->kind = kind;
  block->closeLoc = source.rangeOf(ctx->getStop()).Start;
  for (P::StatementContext *stmt : ctx->statement()) {
    if (broken(stmt))
      continue;
    if (auto *f = stmt->field()) {
      if (auto field = buildField(f))
        block->statements.emplace_back(std::move(*field));
    } else if (auto *l = stmt->layerDecl()) {
      if (auto layer = buildLayer(l))
        block->statements.emplace_back(std::move(*layer));
    } else if (auto *s = stmt->subBlock(); s && !broken(s) && s->name()) {
      if (auto nested = buildBlock(s->block(), ast::Block::Nested)) {
        nested->name = textOf(s->name());
        nested->nameRange = source.rangeOf(s->name());
        nested->headerRange = nested->nameRange;
        block->statements.emplace_back(std::move(nested));
      }
    }
  }
  return block;
}

std::optional<ast::Field> ASTBuilder::buildField(P::FieldContext *ctx) {
  if (broken(ctx) || !ctx->name())
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
  if (broken(ctx) || ctx->name().size() < 2)
    return std::nullopt;
  ast::LayerDecl layer;
  layer.name = textOf(ctx->name(0));
  layer.nameRange = source.rangeOf(ctx->name(0));
  layer.kind = textOf(ctx->kind);
  layer.kindRange = source.rangeOf(ctx->kind);
  layer.range = source.rangeOf(ctx);
  if (auto *o = ctx->overrides()) {
    if (broken(o) || !buildArgs(o->field(), layer.overrides))
      return std::nullopt;
  }
  if (auto *t = ctx->tie()) {
    if (broken(t) || !t->name())
      return std::nullopt;
    layer.tiedTo = textOf(t->name());
    layer.tiedRange = source.rangeOf(t->name());
  }
  if (auto *r = ctx->repeat()) {
    if (broken(r) || !(layer.repeat = buildExpr(r->expr())))
      return std::nullopt;
  }
  return layer;
}

std::unique_ptr<ast::Expr> ASTBuilder::buildExpr(P::ExprContext *ctx) {
  if (broken(ctx))
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
      if (broken(unit))
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
    if (!buildArgs(call->field(), e->args))
      return nullptr;
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

std::vector<std::unique_ptr<ast::Block>> buildAST(ParParser::FileContext *file,
                                                  const SourceText &source,
                                                  DiagnosticEngine &diags,
                                                  const IncludeHandler &onInclude) {
  std::vector<std::unique_ptr<ast::Block>> blocks;
  if (file)
    ASTBuilder(source, diags, onInclude).buildFile(file, blocks);
  return blocks;
}

} // namespace parc::frontend
