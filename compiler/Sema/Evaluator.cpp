//===- Evaluator.cpp - Checked arithmetic over quantities with units ------===//
#include "Evaluator.h"
#include "parc/Support/CheckedInt.h"
#include "parc/Support/Limits.h"
#include "parc/Support/NameSuggest.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include <cmath>

namespace parc::sema {
namespace {

const char *kIntLimit = "9223372036854775807";

} // namespace


/// A value as messages show it: `-1e-06 s`, `19.2`, in base units.
std::string showNumber(const Value &v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (v.isInt)
    os << v.i;
  else
    os << llvm::format("%.15g", v.r);
  if (!v.dim.isNone())
    os << " " << v.dim.baseUnit();
  return os.str();
}

/// Literals and names are quoted in messages; a megabyte of digits is cut short.
std::string abbreviate(llvm::StringRef text) {
  constexpr size_t kMaxShown = 40;
  if (text.size() <= kMaxShown)
    return text.str();
  return text.take_front(kMaxShown - 8).str() + "... (" + std::to_string(text.size()) +
         " characters)";
}

std::string joinWords(llvm::ArrayRef<llvm::StringRef> words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i)
    out += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i].str();
  return out;
}

/// `dtype = bf16` and the like: a bare name, or nothing.
std::optional<std::string> bareName(const ast::Expr &expr) {
  if (expr.kind == ast::Expr::Ref && expr.path.size() == 1)
    return expr.path[0];
  return std::nullopt;
}


std::optional<Value> Evaluator::evalLiteral(const ast::Expr &expr) {
  llvm::StringRef text = expr.literal;
  Value v;
  if (text.find_first_of(".eE") == llvm::StringRef::npos) {
    auto parsed = parseDecimalInt(text);
    if (!parsed) {
      diags.error(expr.range, "integer literal '" + abbreviate(text) +
                                  "' is too large (the limit is " + kIntLimit + ")");
      return std::nullopt;
    }
    v = Value::integer(*parsed);
  } else {
    double r = std::strtod(text.str().c_str(), nullptr);
    if (!std::isfinite(r)) {
      diags.error(expr.range, "number '" + abbreviate(text) + "' is too large");
      return std::nullopt;
    }
    v = Value::real(r);
  }
  if (expr.unit.empty())
    return v;
  auto unit = lookupUnit(expr.unit);
  if (!unit) {
    diags.error(expr.unitRange, "unknown unit '" + abbreviate(expr.unit) + "'" +
                                    didYouMean(expr.unit, allUnitSpellings()));
    return std::nullopt;
  }
  v.dim = unit->dim;
  if (v.isInt && unit->intScale) {
    if (auto scaled = checkedMul(v.i, unit->intScale)) {
      v.i = *scaled;
      v.r = double(*scaled);
      return v;
    }
    diags.error(expr.range,
                "'" + abbreviate(text) + " " + expr.unit + "' does not fit a 64-bit integer");
    return std::nullopt;
  }
  v.r = v.asDouble() * unit->scale;
  v.isInt = false;
  return v;
}

const ResolvedField *Evaluator::resolveRef(const ast::Expr &expr, const Scope &scope) {
  llvm::StringRef head = expr.path[0];
  const ResolvedBlock *block = nullptr;
  const ResolvedField *field = nullptr;
  // The innermost scope that knows the first name decides what it means.
  for (const Scope *s = &scope; s && !field && !block; s = s->parent) {
    if (s->failed.count(head))
      return nullptr;
    if (!s->block)
      continue;
    if ((field = s->block->field(head)))
      break;
    if ((block = s->block->nestedBlock(head)))
      break;
    if (s->syntax) {
      for (const ast::Statement &st : s->syntax->statements) {
        auto *f = std::get_if<ast::Field>(&st);
        if (f && f->name == head) {
          diags.error(expr.range, "'" + head + "' is used before it is defined");
          diags.note(f->nameRange, "'" + head + "' is defined here");
          return nullptr;
        }
      }
    }
  }
  if (!field && !block)
    block = lookupBlock(head);
  if (!field && !block && llvm::is_contained(blockNames, head)) {
    diags.error(expr.range, "'" + head +
                                "' is declared further down; a block can only refer "
                                "to the blocks above it");
    return nullptr;
  }
  // A required field that is not written: the block's "missing required field" error says so.
  for (const Scope *s = &scope; s && !field && !block; s = s->parent)
    if (s->schema && s->schema->field(head) && s->schema->field(head)->required)
      return nullptr;
  if (!field && !block) {
    std::vector<llvm::StringRef> visible(blockNames);
    for (const Scope *s = &scope; s; s = s->parent)
      if (s->block)
        for (const ResolvedField &f : s->block->fields)
          visible.push_back(f.name);
    diags.error(expr.range, "unknown name '" + abbreviate(head) + "'" + didYouMean(head, visible));
    return nullptr;
  }
  for (size_t i = 1; i < expr.path.size(); ++i) {
    if (!block) {
      diags.error(expr.range, "'" + expr.path[i - 1] + "' is a field, it has no '" +
                                  expr.path[i] + "'");
      return nullptr;
    }
    llvm::StringRef part = expr.path[i];
    const ResolvedBlock *parent = block;
    field = parent->field(part);
    block = field ? nullptr : parent->nestedBlock(part);
    if (!field && !block) {
      // The field is missing or wrong over there, and that block's own error says so.
      if (parent->hasErrors)
        return nullptr;
      std::vector<llvm::StringRef> names;
      for (const ResolvedField &f : parent->fields)
        names.push_back(f.name);
      diags.error(expr.range, "'" + expr.path[i - 1] + "' has no field '" + part + "'" +
                                  didYouMean(part, names));
      return nullptr;
    }
  }
  if (!field) {
    diags.error(expr.range, "'" + expr.path.back() + "' is a block, not a value");
    return nullptr;
  }
  return field;
}

/// A field of an enclosing block that is left at its default is as usable as a written one
/// (`global_batch = 8 * micro_batch`); nullopt when `name` is not such a field.
std::optional<std::optional<Value>> Evaluator::unwrittenDefault(llvm::StringRef name,
                                                                const Scope &scope) {
  for (const Scope *s = &scope; s; s = s->parent) {
    if (!s->block || s->failed.count(name) || s->block->field(name) ||
        s->block->nestedBlock(name))
      return std::nullopt;
    if (s->syntax)
      for (const ast::Statement &st : s->syntax->statements)
        if (auto *f = std::get_if<ast::Field>(&st); f && f->name == name)
          return std::nullopt;
    const FieldSpec *spec = s->schema ? s->schema->field(name) : nullptr;
    if (spec && !spec->required && !spec->defaultValue.empty())
      return defaultValue(*spec, *s);
  }
  return std::nullopt;
}

std::optional<Value> Evaluator::evalRef(const ast::Expr &expr, const Scope &scope) {
  if (expr.path.size() == 1) {
    if (auto fromDefault = unwrittenDefault(expr.path[0], scope)) {
      if (*fromDefault && (*fromDefault)->kind != Value::Number) {
        diags.error(expr.range, "'" + expr.path[0] + "' is " + (*fromDefault)->str() +
                                    " (its default), not a number");
        return std::nullopt;
      }
      return *fromDefault;
    }
  }
  const ResolvedField *field = resolveRef(expr, scope);
  if (!field)
    return std::nullopt;
  if (field->value.kind != Value::Number) {
    diags.error(expr.range, "'" + expr.path.back() + "' is " + field->value.str() +
                                ", not a number");
    return std::nullopt;
  }
  return field->value;
}

std::optional<Value> Evaluator::evalBinary(const ast::Expr &expr, const Value &l,
                                           const Value &r) {
  char op = expr.op;
  Dimension dim = l.dim;
  if (op == '+' || op == '-') {
    if (l.dim != r.dim) {
      diags.error(expr.range, std::string("cannot ") + (op == '+' ? "add " : "subtract ") +
                                  r.dim.describe() + (op == '+' ? " to " : " from ") +
                                  l.dim.describe());
      return std::nullopt;
    }
  } else {
    dim = op == '*' ? l.dim * r.dim : l.dim / r.dim;
  }
  if (op == '/' && r.asDouble() == 0) {
    diags.error(expr.operands[1]->range, "division by zero");
    return std::nullopt;
  }
  if (l.isInt && r.isInt) {
    std::optional<int64_t> result;
    switch (op) {
    case '+':
      result = checkedAdd(l.i, r.i);
      break;
    case '-':
      result = checkedSub(l.i, r.i);
      break;
    case '*':
      result = checkedMul(l.i, r.i);
      break;
    default: {
      IntDivision d = checkedDiv(l.i, r.i);
      if (d.status == IntDivision::Inexact)
        return Value::real(double(l.i) / double(r.i), dim);
      if (d.status == IntDivision::Exact)
        result = d.quotient;
    }
    }
    if (!result) {
      diags.error(expr.range, "integer overflow: the result does not fit 64 bits");
      return std::nullopt;
    }
    return Value::integer(*result, dim);
  }
  double a = l.asDouble(), b = r.asDouble();
  double v = op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
  if (!std::isfinite(v)) {
    diags.error(expr.range, "the result of this expression is too large");
    return std::nullopt;
  }
  return Value::real(v, dim);
}

std::optional<Value> Evaluator::evalNumeric(const ast::Expr &expr, const Scope &scope) {
  switch (expr.kind) {
  case ast::Expr::Number:
    return evalLiteral(expr);
  case ast::Expr::Ref:
    return evalRef(expr, scope);
  case ast::Expr::Unary: {
    auto v = evalNumeric(*expr.operands[0], scope);
    if (!v || expr.op == '+')
      return v;
    if (v->isInt) {
      auto neg = checkedSub(0, v->i);
      if (!neg) {
        diags.error(expr.range, "integer overflow: the result does not fit 64 bits");
        return std::nullopt;
      }
      return Value::integer(*neg, v->dim);
    }
    return Value::real(-v->r, v->dim);
  }
  case ast::Expr::Binary: {
    auto l = evalNumeric(*expr.operands[0], scope);
    auto r = evalNumeric(*expr.operands[1], scope);
    if (!l || !r)
      return std::nullopt;
    return evalBinary(expr, *l, *r);
  }
  case ast::Expr::Call:
    diags.error(expr.range, "'" + expr.path[0] + "(...)' is not a number");
    return std::nullopt;
  case ast::Expr::List:
    diags.error(expr.range, "expected a number, got a list");
    return std::nullopt;
  case ast::Expr::String:
    diags.error(expr.range, "expected a number, got a string");
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<Value> Evaluator::typeNumber(const ast::Expr &expr, Value v, const FieldSpec &spec) {
  std::string name = spec.name.str();
  if (spec.type == FieldType::Quantity) {
    if (v.dim != spec.dim) {
      std::string hint = v.dim.isNone() ? " (write a unit, e.g. '" +
                                              llvm::StringRef(spec.dim == Dimension::size()
                                                                  ? "80 GiB"
                                                              : spec.dim == Dimension::bandwidth()
                                                                  ? "100 GB/s"
                                                              : spec.dim == Dimension::time()
                                                                  ? "5 us"
                                                                  : "312 TFLOPS")
                                                  .str() +
                                              "')"
                                        : "";
      diags.error(expr.range, "expected " + spec.dim.describe() + ", got " + v.dim.describe() +
                                  hint);
      return std::nullopt;
    }
    bool zeroAllowed = spec.allowZero || spec.dim == Dimension::time();
    if (v.asDouble() < 0 || (!zeroAllowed && v.asDouble() == 0)) {
      diags.error(expr.range, "'" + name + "' must be " +
                                  (zeroAllowed ? "non-negative" : "positive") +
                                  ", got " + showNumber(v));
      return std::nullopt;
    }
    if (spec.dim == Dimension::size() && !v.isInt) {
      if (v.r > 9.2e18) {
        diags.error(expr.range, "'" + name + "' is too large: " + showNumber(v) +
                                    " does not fit a 64-bit byte count");
        return std::nullopt;
      }
      Value rounded = Value::integer(int64_t(std::llround(v.r)), v.dim);
      if (rounded.i == 0) {
        diags.error(expr.range, "'" + name + "' must be at least 1 B, got " + showNumber(v));
        return std::nullopt;
      }
      if (double(rounded.i) != v.r)
        diags.warning(expr.range, "'" + name + "' is not a whole number of bytes (" +
                                      showNumber(v) + "); using " + showNumber(rounded));
      v = rounded;
    }
    return v;
  }
  if (!v.dim.isNone()) {
    diags.error(expr.range, "expected a plain number, got " + v.dim.describe());
    return std::nullopt;
  }
  if (spec.type == FieldType::Real) {
    if (v.asDouble() < 0) {
      diags.error(expr.range, "'" + name + "' must not be negative, got " + showNumber(v));
      return std::nullopt;
    }
    return Value::real(v.asDouble());
  }
  // Count, Natural, CountOrAuto and list elements: integers.
  if (!v.isInt) {
    if (v.r != std::floor(v.r)) {
      diags.error(expr.range, "expected an integer for '" + name + "', got " + showNumber(v));
      return std::nullopt;
    }
    if (std::fabs(v.r) >= 9.2e18) {
      diags.error(expr.range, "value " + showNumber(v) + " of '" + name +
                                  "' does not fit a 64-bit integer");
      return std::nullopt;
    }
    v = Value::integer(int64_t(v.r));
  }
  int64_t min = spec.type == FieldType::Natural ? 0 : 1;
  if (v.i < min) {
    diags.error(expr.range, "'" + name + "' must be " +
                                (min ? "positive" : "non-negative") + ", got " + showNumber(v));
    return std::nullopt;
  }
  if (spec.maxValue && v.i > spec.maxValue) {
    diags.error(expr.range, "'" + name + "' must be between " + std::to_string(min) + " and " +
                                std::to_string(spec.maxValue) + ", got " + showNumber(v));
    return std::nullopt;
  }
  return v;
}

} // namespace parc::sema
