//===- EvaluatorWords.cpp - Words, orders, auto and schedules of fields --===//
#include "Evaluator.h"
#include "parc/Support/Limits.h"
#include "parc/Support/NameSuggest.h"

#include "llvm/ADT/StringExtras.h"

namespace parc::sema {

std::optional<Value> Evaluator::evalWord(const ast::Expr &expr, const FieldSpec &spec,
                                         const Scope &scope) {
  std::vector<llvm::StringRef> words = spec.words;
  if (spec.type == FieldType::Bool)
    words = {"true", "false"};
  // `dtype = gpt.dtype`: the same setting as another block.
  if (expr.kind == ast::Expr::Ref && expr.path.size() > 1) {
    const ResolvedField *field = resolveRef(expr, scope);
    if (!field)
      return std::nullopt;
    if (field->value.kind == Value::Word && llvm::is_contained(words, field->value.word))
      return field->value;
    diags.error(expr.range, "'" + expr.path.back() + "' is " + field->value.str() +
                                ", not one of " + joinWords(words) + " for '" + spec.name + "'");
    return std::nullopt;
  }
  auto name = bareName(expr);
  if (!name) {
    diags.error(expr.range, "expected " + joinWords(words) + " for '" + spec.name + "'");
    return std::nullopt;
  }
  if (!llvm::is_contained(words, *name)) {
    diags.error(expr.range, "unknown value '" + *name + "' for '" + spec.name + "'; expected " +
                                joinWords(words) + didYouMean(*name, words));
    return std::nullopt;
  }
  Value v;
  v.kind = Value::Word;
  v.word = *name;
  return v;
}

std::optional<Value> Evaluator::evalOrder(const ast::Expr &expr) {
  // `tp-dp-pp` parses as a subtraction; read its operands as axis names.
  std::vector<const ast::Expr *> parts;
  std::function<bool(const ast::Expr &)> flatten = [&](const ast::Expr &e) {
    if (e.kind == ast::Expr::Binary && e.op == '-')
      return flatten(*e.operands[0]) && flatten(*e.operands[1]);
    parts.push_back(&e);
    return bareName(e).has_value();
  };
  Value v;
  v.kind = Value::Order;
  bool ok = flatten(expr);
  std::vector<Axis> named;
  std::vector<llvm::StringRef> words;
  for (Axis a : kAllAxes)
    words.push_back(toString(a));
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    std::string axis = *bareName(*parts[i]);
    auto it = std::find(words.begin(), words.end(), axis);
    if (it == words.end()) {
      diags.error(parts[i]->range, "unknown parallel axis '" + axis +
                                       "'; expected tp, cp, ep, dp or pp" +
                                       didYouMean(axis, {"tp", "cp", "ep", "dp", "pp"}));
      return std::nullopt;
    }
    Axis a = kAllAxes[size_t(it - words.begin())];
    ok = !llvm::is_contained(named, a);
    named.push_back(a);
  }
  for (Axis required : {Axis::TP, Axis::DP, Axis::PP})
    ok = ok && llvm::is_contained(named, required);
  if (!ok) {
    diags.error(expr.range, "'order' must name tp, dp and pp once each, and may name cp and ep, "
                            "fastest-varying first (for example tp-dp-pp or tp-cp-dp-pp)");
    return std::nullopt;
  }
  v.order = RankOrder(named);
  for (Axis a : named)
    v.word += (v.word.empty() ? "" : "-") + std::string(toString(a));
  return v;
}

namespace {
bool isAutoExpr(const ast::Expr &expr) {
  return (expr.kind == ast::Expr::Ref || expr.kind == ast::Expr::Call) && expr.path.size() == 1 &&
         expr.path[0] == "auto";
}
} // namespace

std::optional<Value> Evaluator::evalAuto(const ast::Expr &expr, const FieldSpec &spec,
                                         const Scope &scope) {
  Value v;
  v.kind = Value::Auto;
  v.word = "auto";
  if (expr.kind != ast::Expr::Call)
    return v;
  if (!expr.args.empty()) {
    diags.error(expr.args.front().range, "'auto(...)' lists the values '" + spec.name +
                                             "' may take, such as auto(1, 2, 4) or "
                                             "auto(<= 16); it takes no named arguments");
    return std::nullopt;
  }
  bool numeric = spec.type == FieldType::Count || spec.type == FieldType::Natural ||
                 spec.type == FieldType::CountOrAuto;
  FieldSpec element = spec;
  element.searchable = false;
  if (element.type == FieldType::CountOrAuto)
    element.type = FieldType::Count;
  for (const ast::CallArg &arg : expr.values) {
    if (arg.comparison.empty()) {
      std::optional<Value> e = spec.type == FieldType::Schedule
                                   ? evalSchedule(*arg.value, scope, /*openChunks=*/true)
                                   : evaluateField(*arg.value, element, scope);
      if (!e)
        return std::nullopt;
      v.elems.push_back(*e);
      continue;
    }
    if (!numeric) {
      diags.error(arg.range, "'" + spec.name + "' is not a number: list its values in "
                                               "auto(...) instead of a bound");
      return std::nullopt;
    }
    std::optional<Value> bound = evaluateField(*arg.value, element, scope);
    if (!bound)
      return std::nullopt;
    llvm::StringRef cmp = arg.comparison;
    int64_t n = bound->i;
    if (cmp == "<=" || cmp == "<") {
      int64_t hi = cmp == "<" ? n - 1 : n;
      v.hi = v.hasHi ? std::min(v.hi, hi) : hi;
      v.hasHi = true;
    } else {
      int64_t lo = cmp == ">" ? n + 1 : n;
      v.lo = v.hasLo ? std::max(v.lo, lo) : lo;
      v.hasLo = true;
    }
  }
  if (v.hasLo && v.hasHi && v.lo > v.hi) {
    diags.error(expr.range, "'auto(...)' leaves '" + spec.name + "' no value: its bounds " +
                                std::to_string(v.lo) + " to " + std::to_string(v.hi) +
                                " are empty");
    return std::nullopt;
  }
  return v;
}

std::optional<Value> Evaluator::evalSchedule(const ast::Expr &expr, const Scope &scope,
                                             bool openChunks) {
  static const llvm::StringRef kSchedules[] = {"gpipe", "1f1b", "interleaved"};
  llvm::StringRef name;
  if (auto bare = bareName(expr))
    name = expr.path[0];
  else if (expr.kind == ast::Expr::Call)
    name = expr.path[0];
  else {
    diags.error(expr.range, "expected a schedule: gpipe, 1f1b or interleaved(chunks = N)");
    return std::nullopt;
  }
  if (!llvm::is_contained(kSchedules, name)) {
    diags.error(expr.range, "unknown schedule '" + name +
                                "'; expected gpipe, 1f1b or interleaved(chunks = N)" +
                                didYouMean(name, kSchedules));
    return std::nullopt;
  }
  Value v;
  v.kind = Value::Schedule;
  v.word = name.str();
  bool interleaved = name == "interleaved";
  if (!interleaved && expr.kind == ast::Expr::Call) {
    diags.error(expr.range, "schedule '" + name + "' takes no arguments");
    return std::nullopt;
  }
  if (!interleaved)
    return v;
  // Inside `schedule = auto(...)` a bare `interleaved` leaves its chunks to the search.
  if (openChunks && expr.kind != ast::Expr::Call) {
    v.chunks = 0;
    Value any;
    any.kind = Value::Auto;
    any.word = "auto";
    v.elems.push_back(any);
    return v;
  }
  if (expr.kind != ast::Expr::Call || expr.args.size() != 1 || expr.args[0].name != "chunks" ||
      !expr.values.empty()) {
    diags.error(expr.range, "'interleaved' needs its number of model chunks per pipeline "
                            "stage: interleaved(chunks = 2), or interleaved(chunks = auto)");
    return std::nullopt;
  }
  FieldSpec chunks{"chunks", FieldType::Count, true, "", {}, {}, limits::MaxBlocks};
  chunks.searchable = true;
  const ast::Expr &count = *expr.args[0].value;
  if (isAutoExpr(count)) {
    std::optional<Value> open = evalAuto(count, chunks, scope);
    if (!open)
      return std::nullopt;
    v.chunks = 0;
    v.elems.push_back(*open);
    return v;
  }
  chunks.searchable = false;
  auto n = evaluateField(count, chunks, scope);
  if (!n)
    return std::nullopt;
  v.chunks = n->i;
  return v;
}

std::optional<Value> Evaluator::evaluateField(const ast::Expr &expr, const FieldSpec &spec,
                                              const Scope &scope) {
  if (spec.searchable && isAutoExpr(expr))
    return evalAuto(expr, spec, scope);
  if (expr.kind == ast::Expr::Call && expr.path.size() == 1 && expr.path[0] == "auto") {
    diags.error(expr.range, "'" + spec.name + "' cannot be auto: the search chooses tp, pp, "
                                              "dp, cp, ep, micro_batch, schedule, zero, recompute, "
                                              "sequence_parallel and order");
    return std::nullopt;
  }
  switch (spec.type) {
  case FieldType::Enum:
  case FieldType::Bool:
    return evalWord(expr, spec, scope);
  case FieldType::Order:
    return evalOrder(expr);
  case FieldType::Schedule:
    return evalSchedule(expr, scope);
  case FieldType::CountOrAuto: // `auto` was handled above (dp is searchable)
    break;
  case FieldType::RealOrWord: {
    if (auto name = bareName(expr); name && (scope.block->field(*name) == nullptr ||
                                             llvm::is_contained(spec.words, *name)))
      return evalWord(expr, spec, scope);
    auto v = evalNumeric(expr, scope);
    if (!v || !(v = typeNumber(expr, *v, FieldSpec{spec.name, FieldType::Real, false, "", {}, {}})))
      return std::nullopt;
    if (v->r <= 0) {
      diags.error(expr.range, "'" + spec.name + "' must be positive or " +
                                  joinWords(spec.words) + ", got " + showNumber(*v));
      return std::nullopt;
    }
    return v;
  }
  case FieldType::CountList: {
    if (expr.kind != ast::Expr::List) {
      diags.error(expr.range, "expected a list of layer counts, e.g. [24, 24, 24, 24]");
      return std::nullopt;
    }
    Value list;
    list.kind = Value::List;
    FieldSpec element{spec.name, FieldType::Count, true, "", {}, {}, limits::MaxBlocks};
    for (const auto &e : expr.operands) {
      auto v = evalNumeric(*e, scope);
      if (!v || !(v = typeNumber(*e, *v, element)))
        return std::nullopt;
      list.elems.push_back(*v);
    }
    if (list.elems.empty()) {
      diags.error(expr.range, "'" + spec.name + "' must not be empty");
      return std::nullopt;
    }
    return list;
  }
  default:
    break;
  }
  auto v = evalNumeric(expr, scope);
  if (!v)
    return std::nullopt;
  return typeNumber(expr, *v, spec);
}

std::optional<Value> Evaluator::defaultValue(const FieldSpec &spec, const Scope &scope) {
  llvm::StringRef text = spec.defaultValue;
  // A default may name another field of the block (`kv_heads` defaults to `heads`).
  if (const ResolvedField *other = scope.block->field(text))
    return other->value;
  if (scope.failed.count(text))
    return std::nullopt;
  ast::Expr expr(ast::Expr::Number, {});
  auto [number, unit] = text.split(' ');
  if (!number.empty() && (llvm::isDigit(number[0]) || number[0] == '.') && number != "1f1b") {
    expr.literal = number.str();
    expr.unit = unit.str();
  } else if (number.contains('-') && spec.type == FieldType::Order) {
    llvm::SmallVector<llvm::StringRef, 5> axes;
    text.split(axes, '-');
    auto ref = [](llvm::StringRef n) {
      auto e = std::make_unique<ast::Expr>(ast::Expr::Ref, llvm::SMRange());
      e->path.push_back(n.str());
      return e;
    };
    // a-b-c-d parses as ((a - b) - c) - d.
    std::unique_ptr<ast::Expr> tree = ref(axes[0]);
    for (size_t i = 1; i < axes.size(); ++i) {
      auto node = std::make_unique<ast::Expr>(ast::Expr::Binary, llvm::SMRange());
      node->op = '-';
      node->operands.push_back(std::move(tree));
      node->operands.push_back(ref(axes[i]));
      tree = std::move(node);
    }
    expr = std::move(*tree);
  } else {
    expr.kind = ast::Expr::Ref;
    expr.path.push_back(text.str());
  }
  return evaluateField(expr, spec, scope);
}

} // namespace parc::sema
