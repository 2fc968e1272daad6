//===- PlanShapes.cpp - The shapes each op kind requires of its operands --===//
//
// The kernels index their operands with sizes taken from the operands' shapes (rows of a
// norm, m x n x k of a matmul, heads x head_dim of attention). A runtime trusts that the
// shapes of one op fit together, so these rules are what keeps an edited tensor table from
// making a kernel read or write outside a buffer: an op passes only when every operand has
// exactly the shape its kind derives from the others (docs/plan-format.md, Ops).
//
//===----------------------------------------------------------------------===//

#include "PlanVerifierInternal.h"

#include "parc/Support/CheckedInt.h"

using llvm::ArrayRef;
using llvm::StringRef;
using llvm::Twine;

namespace parc::plan::detail {

std::string shapeText(ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::optional<int64_t> elementCount(ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    std::optional<int64_t> next = dim >= 0 ? checkedMul(count, dim) : std::nullopt;
    if (!next || *next > MaxTensorElements)
      return std::nullopt;
    count = *next;
  }
  return count;
}

namespace {

using Shape = std::vector<int64_t>;

class ShapeRules {
public:
  ShapeRules(ReadContext &ctx, const RankPlan &plan, const Op &op, ArrayRef<OperandShape> inputs,
             ArrayRef<OperandShape> outputs, llvm::function_ref<std::string()> opPath)
      : ctx(ctx), plan(plan), op(op), inputs(inputs), outputs(outputs), opPath(opPath) {}

  void check();

private:
  enum Side { In, Out };
  ArrayRef<int64_t> shape(Side side, size_t i) const {
    return (side == In ? inputs : outputs)[i].shape;
  }
  int64_t dim(Side side, size_t i, size_t d) const { return shape(side, i)[d]; }
  std::string path(Side side, size_t i) const {
    return indexPath(fieldPath(opPath(), side == In ? "inputs" : "outputs"), i);
  }
  std::string describe(Side side, size_t i) const {
    return (side == In ? "input " : "output ") + std::to_string(i) + ", '" +
           (side == In ? inputs : outputs)[i].name.str() + "'";
  }

  // The requirements. Each records the first failure at the operand's path and returns
  // whether it held, so that a rule stops before indexing a shape that is too short.
  bool rank(Side side, size_t i, size_t dims, StringRef form) {
    if (shape(side, i).size() == dims)
      return true;
    return fail(side, i, "expected " + Twine(dims) + " dimensions " + form);
  }
  bool atLeastRank(Side side, size_t i, size_t dims) {
    if (shape(side, i).size() >= dims)
      return true;
    return fail(side, i, "expected at least " + Twine(dims) + " dimension" + (dims > 1 ? "s" : ""));
  }
  bool expect(Side side, size_t i, ArrayRef<int64_t> expected, const Twine &why) {
    if (shape(side, i) == expected)
      return true;
    return fail(side, i, "expected " + shapeText(expected) + " (" + why + ")");
  }
  bool same(Side side, size_t i, Side as, size_t j) {
    return expect(side, i, shape(as, j), "the shape of " + describe(as, j));
  }
  bool fail(Side side, size_t i, const Twine &problem) {
    return ctx.fail(path(side, i), "'" + (side == In ? inputs : outputs)[i].name + "' has shape " +
                                       shapeText(shape(side, i)) + "; " + problem);
  }
  bool attrFail(StringRef name, const Twine &problem) {
    return ctx.fail(fieldPath(fieldPath(opPath(), "attrs"), name), problem);
  }

  void embedding(Side ids, size_t idsIndex, Side table, size_t tableIndex, Side act,
                 size_t actIndex);
  void vocabShard(int64_t rows, StringRef what);
  void norm(bool backward, bool bias);
  std::optional<Shape> product();
  void matmul(bool backward);
  void heads(Side side, size_t i);
  void attention(bool backward);
  void attentionBlock(bool backward);
  void attentionOutputs(bool backward, const Shape &stats, StringRef statsForm);
  void attentionMerge();
  void loss(bool backward);
  void split(Side whole, Side parts);
  void gatherOrScatter(bool gather);
  void allSame(ArrayRef<std::pair<Side, size_t>> operands);
  std::optional<int64_t> routedRows(size_t logits);
  bool tokenRows(Side side, size_t i, int64_t rows, int64_t width);
  void moe();
  void expertParallel();

  ReadContext &ctx;
  const RankPlan &plan;
  const Op &op;
  ArrayRef<OperandShape> inputs, outputs;
  llvm::function_ref<std::string()> opPath;
};

void ShapeRules::allSame(ArrayRef<std::pair<Side, size_t>> operands) {
  for (size_t k = 1; k < operands.size() && !ctx.failed(); ++k)
    same(operands[k].first, operands[k].second, operands[0].first, operands[0].second);
}

void ShapeRules::vocabShard(int64_t rows, StringRef what) {
  int64_t offset = op.intAttr("vocab_offset");
  std::optional<int64_t> end = checkedAdd(offset, rows);
  if (!end || *end > plan.model.paddedVocab)
    attrFail("vocab_offset", "rows [" + Twine(offset) + ", " + Twine(offset) + " + " + Twine(rows) +
                                 ") of the " + what + " lie outside the padded vocabulary of " +
                                 Twine(plan.model.paddedVocab));
}

/// ids [batch, seq] and a table shard [rows, hidden] give activations [seq, batch, hidden].
void ShapeRules::embedding(Side ids, size_t idsIndex, Side table, size_t tableIndex, Side act,
                           size_t actIndex) {
  if (!rank(ids, idsIndex, 2, "[batch, seq]") || !rank(table, tableIndex, 2, "[rows, hidden]"))
    return;
  Shape expected = {dim(ids, idsIndex, 1), dim(ids, idsIndex, 0), dim(table, tableIndex, 1)};
  if (expect(act, actIndex, expected, "[seq, batch, hidden] of the ids and the table"))
    vocabShard(dim(table, tableIndex, 0), "embedding shard");
}

/// layernorm (x, weight, bias) -> y and rmsnorm (x, weight) -> y; their backward
/// (x, weight, dy) -> (dx, dweight[, dbias]).
void ShapeRules::norm(bool backward, bool bias) {
  if (!atLeastRank(In, 0, 1))
    return;
  Shape features = {shape(In, 0).back()};
  if (!expect(In, 1, features, "the last dimension of " + describe(In, 0)))
    return;
  if (!backward) {
    if (bias && !expect(In, 2, features, "the last dimension of " + describe(In, 0)))
      return;
    same(Out, 0, In, 0);
    return;
  }
  allSame({{In, 0}, {In, 2}, {Out, 0}});
  for (size_t i = 1; i < outputs.size() && !ctx.failed(); ++i)
    expect(Out, i, features, "the last dimension of " + describe(In, 0));
}

/// The shape of op(a) op(b): the rows of a (all dims but the last; a 2-D a's columns with
/// trans_a), then b's columns (its rows with trans_b).
std::optional<Shape> ShapeRules::product() {
  bool transA = op.boolAttr("trans_a"), transB = op.boolAttr("trans_b");
  if (!rank(In, 1, 2, "(b is a matrix)") ||
      (transA ? !rank(In, 0, 2, "(trans_a needs a matrix)") : !atLeastRank(In, 0, 1)))
    return std::nullopt;
  int64_t k = transA ? dim(In, 0, 0) : shape(In, 0).back();
  int64_t inner = transB ? dim(In, 1, 1) : dim(In, 1, 0);
  if (inner != k) {
    fail(In, 1, "its inner dimension is " + Twine(inner) + " but " + describe(In, 0) +
                    " gives " + Twine(k));
    return std::nullopt;
  }
  Shape c = transA ? Shape{dim(In, 0, 1)} : Shape(shape(In, 0).drop_back());
  c.push_back(transB ? dim(In, 1, 0) : dim(In, 1, 1));
  return c;
}

void ShapeRules::matmul(bool backward) {
  std::optional<Shape> c = product();
  if (!c)
    return;
  if (!backward) {
    expect(Out, 0, *c, "op(a) op(b) of the inputs");
    return;
  }
  if (expect(In, 2, *c, "op(a) op(b) of inputs 0 and 1") && same(Out, 0, In, 0))
    same(Out, 1, In, 1);
}

/// [seq, batch, heads * head_dim] for the op's `heads`.
void ShapeRules::heads(Side side, size_t i) {
  if (!rank(side, i, 3, "[seq, batch, heads x head_dim]"))
    return;
  int64_t count = op.intAttr("heads");
  if (dim(side, i, 2) % count != 0)
    fail(side, i, "its last dimension is not " + Twine(count) + " heads of one size");
  else if (op.kind == OpKind::RoPE || op.kind == OpKind::RoPEBwd) {
    if ((dim(side, i, 2) / count) % 2 != 0)
      fail(side, i, "rotary embedding needs an even head size, got " +
                        Twine(dim(side, i, 2) / count));
  }
}

/// q [s, b, heads * d], k and v [s, b, kv_heads * d] -> y like q and the saved softmax:
/// with `flash` the logsumexp of every row [b, heads, s], else the probabilities
/// [b, heads, s, s]. The backward reads q, k, v, y, stats and dy like q, and writes dq, dk,
/// dv like q, k, v.
void ShapeRules::attention(bool backward) {
  heads(In, 0);
  if (ctx.failed())
    return;
  int64_t seq = dim(In, 0, 0), batch = dim(In, 0, 1), count = op.intAttr("heads");
  int64_t headDim = dim(In, 0, 2) / count;
  std::optional<int64_t> kv = checkedMul(op.intAttr("kv_heads"), headDim);
  Shape keys = {seq, batch, kv.value_or(-1)};
  if (!expect(In, 1, keys, "[seq, batch, kv_heads x head_dim] of the query's head size") ||
      !same(In, 2, In, 1))
    return;
  bool flash = op.boolAttr("flash");
  Shape stats = {batch, count, seq};
  if (!flash)
    stats.push_back(seq);
  StringRef statsForm = flash ? "the logsumexp of every row, [batch, heads, seq]"
                              : "the probabilities, [batch, heads, seq, seq]";
  attentionOutputs(backward, stats, statsForm);
}

/// What attention and its ring blocks write, as one rule: the forward's y like q and its
/// saved `stats`; the backward reads y like q, the stats and dy like q, and writes dq, dk, dv
/// like q, k, v.
void ShapeRules::attentionOutputs(bool backward, const Shape &stats, StringRef statsForm) {
  if (!backward) {
    if (same(Out, 0, In, 0))
      expect(Out, 1, stats, statsForm);
    return;
  }
  if (!same(In, 3, In, 0) || !expect(In, 4, stats, statsForm) || !same(In, 5, In, 0))
    return;
  for (size_t i = 0; i < 3 && !ctx.failed(); ++i)
    same(Out, i, In, i);
}

/// One block of ring attention: q [sq, batch, heads x d], k and v [sk, batch, kv_heads x d]
/// (sq = sk for a causal, diagonal block), y like q, lse [batch, heads, sq]; the backward reads
/// the merged y and lse of the queries and writes dq, dk, dv like q, k, v.
void ShapeRules::attentionBlock(bool backward) {
  heads(In, 0);
  if (ctx.failed() || !rank(In, 1, 3, "[keys, batch, kv_heads x head_dim]"))
    return;
  int64_t seq = dim(In, 0, 0), batch = dim(In, 0, 1), count = op.intAttr("heads");
  int64_t keys = dim(In, 1, 0);
  std::optional<int64_t> kv = checkedMul(op.intAttr("kv_heads"), dim(In, 0, 2) / count);
  if (op.boolAttr("causal") && keys != seq) {
    fail(In, 1, "a causal (diagonal) block has as many keys as queries (" + Twine(seq) + ")");
    return;
  }
  if (!expect(In, 1, {keys, batch, kv.value_or(-1)},
              "[keys, batch, kv_heads x head_dim] of the query's head size") ||
      !same(In, 2, In, 1))
    return;
  Shape lse = {batch, count, seq};
  StringRef lseForm = "the logsumexp of every query row, [batch, heads, seq]";
  attentionOutputs(backward, lse, lseForm);
}

/// Two blocks of the same queries: y1, y2 and y [seq, batch, heads x d] alike, lse1, lse2 and
/// lse [batch, heads, seq] of them.
void ShapeRules::attentionMerge() {
  if (!rank(In, 0, 3, "[seq, batch, heads x head_dim]") || !rank(In, 1, 3, "[batch, heads, seq]"))
    return;
  int64_t heads = dim(In, 1, 1);
  if (dim(In, 1, 0) != dim(In, 0, 1) || dim(In, 1, 2) != dim(In, 0, 0) || heads < 1 ||
      dim(In, 0, 2) % heads != 0) {
    fail(In, 1, "expected [batch, heads, seq] of " + describe(In, 0) +
                    ", its features a multiple of heads");
    return;
  }
  allSame({{In, 0}, {In, 2}, {Out, 0}});
  allSame({{In, 1}, {In, 3}, {Out, 1}});
}

/// logits [seq, batch, vocab shard] and labels [batch, seq]; the loss and its gradient are
/// scalars, dlogits like the logits; the softmax covers the model's real vocabulary.
void ShapeRules::loss(bool backward) {
  if (!rank(In, 0, 3, "[seq, batch, vocab shard]"))
    return;
  if (!expect(In, 1, {dim(In, 0, 1), dim(In, 0, 0)}, "[batch, seq] of the logits"))
    return;
  vocabShard(dim(In, 0, 2), "logits");
  if (!ctx.failed() && op.intAttr("vocab") != plan.model.vocab)
    attrFail("vocab", "expected the model's vocabulary of " + Twine(plan.model.vocab) +
                          " (model.vocab), got " + Twine(op.intAttr("vocab")));
  if (ctx.failed())
    return;
  if (!backward) {
    expect(Out, 0, {}, "the loss is a scalar");
    return;
  }
  if (expect(In, 2, {}, "the loss gradient is a scalar"))
    same(Out, 0, In, 0);
}

/// split: the parts tile the whole along `dim`, equal to it in every other dimension.
void ShapeRules::split(Side whole, Side parts) {
  int64_t d = op.intAttr("dim");
  ArrayRef<int64_t> full = shape(whole, 0);
  size_t count = (parts == In ? inputs : outputs).size();
  int64_t covered = 0;
  for (size_t i = 0; i < count && !ctx.failed(); ++i) {
    Shape expected(full.begin(), full.end());
    if (shape(parts, i).size() == full.size())
      expected[size_t(d)] = dim(parts, i, size_t(d));
    if (!expect(parts, i, expected, "a part of " + describe(whole, 0) + " along dim " + Twine(d)))
      return;
    covered += dim(parts, i, size_t(d)); // each part is at most the whole: no overflow
    if (covered > full[size_t(d)])
      fail(parts, i, "the parts so far cover " + Twine(covered) + " of the " +
                         Twine(full[size_t(d)]) + " along dim " + Twine(d));
  }
  if (!ctx.failed() && covered != full[size_t(d)])
    ctx.fail(fieldPath(opPath(), parts == In ? "inputs" : "outputs"),
             "the parts cover " + Twine(covered) + " of the " + Twine(full[size_t(d)]) +
                 " along dim " + Twine(d) + " of " + describe(whole, 0));
}

/// all_gather multiplies dimension `dim` by the group's size, reduce_scatter divides it.
void ShapeRules::gatherOrScatter(bool gather) {
  int64_t d = op.intAttr("dim");
  int64_t members = int64_t(plan.groups.get(op.groupAttr("group")).size());
  Shape expected(shape(In, 0).begin(), shape(In, 0).end());
  if (gather) {
    std::optional<int64_t> whole = checkedMul(expected[size_t(d)], members);
    expected[size_t(d)] = whole.value_or(-1);
  } else if (expected[size_t(d)] % members != 0) {
    fail(In, 0, "dimension " + Twine(d) + " does not divide into the group's " + Twine(members) +
                    " members");
    return;
  } else {
    expected[size_t(d)] /= members;
  }
  expect(Out, 0, expected,
         Twine(gather ? "the group's parts" : "one member's part") + " along dim " + Twine(d));
}

/// The router's logits [seq, batch, experts] as input `logits`: the rows their top_k
/// choices send to the experts, seq x batch x top_k.
std::optional<int64_t> ShapeRules::routedRows(size_t logits) {
  if (!rank(In, logits, 3, "[seq, batch, experts] (the router's logits)"))
    return std::nullopt;
  int64_t topK = op.intAttr("top_k");
  if (topK > dim(In, logits, 2)) {
    attrFail("top_k", Twine(topK) + " choices among the " + Twine(dim(In, logits, 2)) +
                          " experts of '" + inputs[logits].name + "'");
    return std::nullopt;
  }
  std::optional<int64_t> tokens = checkedMul(dim(In, logits, 0), dim(In, logits, 1));
  std::optional<int64_t> rows = tokens ? checkedMul(*tokens, topK) : std::nullopt;
  if (!rows)
    fail(In, logits, "its tokens times top_k overflow");
  return rows;
}

/// [rows, width]: rows of the tokens as the experts see them.
bool ShapeRules::tokenRows(Side side, size_t i, int64_t rows, int64_t width) {
  return expect(side, i, {rows, width}, "[seq x batch x top_k, features] of the routed tokens");
}

/// The mixture-of-experts ops: x and out [seq, batch, hidden] like the logits' tokens, the
/// routed rows [seq x batch x top_k, features], an expert weight [experts, out, in].
void ShapeRules::moe() {
  // An expert matmul's routing operand is the logits [seq, batch, experts] or row counts.
  bool counted = (op.kind == OpKind::ExpertMatMul || op.kind == OpKind::ExpertMatMulBwd) &&
                 shape(In, 1).size() == 2;
  if (op.kind == OpKind::MoeCounts || op.kind == OpKind::AllToAll || counted)
    return expertParallel();
  size_t logits = op.kind == OpKind::MoeAuxLossBwd ? 0 : 1;
  std::optional<int64_t> rows = routedRows(logits);
  if (!rows)
    return;
  auto tokens = [&](Side side, size_t i, int64_t width) {
    return expect(side, i, {dim(In, logits, 0), dim(In, logits, 1), width},
                  "[seq, batch, features] of the logits' tokens");
  };
  auto rowsOf = [&](Side side, size_t i) {
    return rank(side, i, 2, "[rows, features]") && tokenRows(side, i, *rows, dim(side, i, 1));
  };
  switch (op.kind) {
  case OpKind::MoeDispatch:
    if (rank(In, 0, 3, "[seq, batch, hidden]") && tokens(In, 0, dim(In, 0, 2)))
      tokenRows(Out, 0, *rows, dim(In, 0, 2));
    return;
  case OpKind::MoeDispatchBwd:
  case OpKind::MoeCombine:
    if (rowsOf(In, 0))
      tokens(Out, 0, dim(In, 0, 1));
    return;
  case OpKind::ExpertMatMul:
  case OpKind::ExpertMatMulBwd: {
    if (!rowsOf(In, 0) || !rank(In, 2, 3, "[experts, out, in]"))
      return;
    Shape weight = {dim(In, logits, 2), shape(In, 2)[1], dim(In, 0, 1)};
    if (!expect(In, 2, weight, "[experts, out, in] of the logits' experts and the rows' features"))
      return;
    if (op.kind == OpKind::ExpertMatMul) {
      tokenRows(Out, 0, *rows, weight[1]);
      return;
    }
    if (tokenRows(In, 3, *rows, weight[1]) && same(Out, 0, In, 0))
      same(Out, 1, In, 2);
    return;
  }
  case OpKind::MoeCombineBwd:
    if (rowsOf(In, 0) && tokens(In, 2, dim(In, 0, 1)) && same(Out, 0, In, 0))
      same(Out, 1, In, 1);
    return;
  case OpKind::MoeAuxLossBwd:
    same(Out, 0, In, 0);
    return;
  default:
    return;
  }
}

/// Under expert parallelism the rows travel in blocks: row counts [members, experts per
/// member] (moe_counts from the logits [seq, batch, experts], all_to_all's output like its
/// input) say how many of a [rows, features] buffer's leading rows belong to each (member,
/// expert), member-major; an expert weight [experts per member, out, in] multiplies them.
void ShapeRules::expertParallel() {
  size_t counts = op.kind == OpKind::MoeCounts ? 0 : 1;
  Side countsSide = op.kind == OpKind::MoeCounts ? Out : In;
  if (!rank(countsSide, counts, 2, "[members, experts per member] (row counts)"))
    return;
  switch (op.kind) {
  case OpKind::MoeCounts: {
    if (!routedRows(0))
      return;
    int64_t members = plan.parallel.ep, experts = dim(In, 0, 2);
    if (experts % members != 0) {
      fail(In, 0, "its " + Twine(experts) + " experts do not divide over ep = " + Twine(members));
      return;
    }
    expect(Out, 0, {members, experts / members}, "ep x the experts of each ep member");
    return;
  }
  case OpKind::AllToAll: {
    int64_t members = int64_t(plan.groups.get(op.groupAttr("group")).size());
    if (dim(In, 1, 0) != members) {
      fail(In, 1, "expected the counts of the group's " + Twine(members) + " members");
      return;
    }
    if (rank(In, 0, 2, "[rows, features]") && rank(Out, 0, 2, "[rows, features]") &&
        expect(Out, 0, {dim(Out, 0, 0), dim(In, 0, 1)}, "rows as wide as " + describe(In, 0)))
      same(Out, 1, In, 1);
    return;
  }
  default: { // expert_matmul and expert_matmul_bwd
    if (!rank(In, 0, 2, "[rows, features]") || !rank(In, 2, 3, "[experts, out, in]"))
      return;
    Shape weight = {dim(In, 1, 1), shape(In, 2)[1], dim(In, 0, 1)};
    if (!expect(In, 2, weight, "[experts, out, in] of the counts' experts and the rows' features"))
      return;
    Shape products = {dim(In, 0, 0), weight[1]};
    if (op.kind == OpKind::ExpertMatMul) {
      expect(Out, 0, products, "one product row per row of " + describe(In, 0));
      return;
    }
    if (expect(In, 3, products, "one product row per row of " + describe(In, 0)) &&
        same(Out, 0, In, 0))
      same(Out, 1, In, 2);
    return;
  }
  }
}

void ShapeRules::check() {
  switch (op.kind) {
  case OpKind::Embedding:
    return embedding(In, 0, In, 1, Out, 0);
  case OpKind::EmbeddingBwd:
    return embedding(In, 0, Out, 0, In, 1);
  case OpKind::PositionEmbedding:
  case OpKind::PositionEmbeddingBwd: {
    // x (dy) [s, b, h] and the table [positions >= s, h]; y (dx) like x.
    Side table = op.kind == OpKind::PositionEmbedding ? In : Out;
    size_t tableIndex = 1;
    if (!rank(In, 0, 3, "[seq, batch, hidden]") || !rank(table, tableIndex, 2, "[positions, hidden]"))
      return;
    if (dim(table, tableIndex, 0) < dim(In, 0, 0) || dim(table, tableIndex, 1) != dim(In, 0, 2))
      fail(table, tableIndex, "expected at least " + Twine(dim(In, 0, 0)) + " positions of " +
                                  Twine(dim(In, 0, 2)) + " features (" + describe(In, 0) + ")");
    else
      same(Out, 0, In, 0);
    return;
  }
  case OpKind::LayerNorm:
  case OpKind::LayerNormBwd:
    return norm(op.kind == OpKind::LayerNormBwd, /*bias=*/true);
  case OpKind::RMSNorm:
  case OpKind::RMSNormBwd:
    return norm(op.kind == OpKind::RMSNormBwd, /*bias=*/false);
  case OpKind::MatMul:
  case OpKind::MatMulBwd:
    return matmul(op.kind == OpKind::MatMulBwd);
  case OpKind::BiasAdd:
  case OpKind::BiasAddBwd: {
    // x (dy) [..., d] and the bias [d]; y (dx) like x.
    if (!atLeastRank(In, 0, 1))
      return;
    Side bias = op.kind == OpKind::BiasAdd ? In : Out;
    if (expect(bias, 1, {shape(In, 0).back()}, "the last dimension of " + describe(In, 0)))
      same(Out, 0, In, 0);
    return;
  }
  case OpKind::RoPE:
  case OpKind::RoPEBwd:
    heads(In, 0);
    if (!ctx.failed())
      same(Out, 0, In, 0);
    return;
  case OpKind::Attention:
  case OpKind::AttentionBwd:
    return attention(op.kind == OpKind::AttentionBwd);
  case OpKind::GELU:
  case OpKind::AllReduce:
    return allSame({{In, 0}, {Out, 0}});
  case OpKind::SwiGLU:
  case OpKind::ResidualAdd:
  case OpKind::GELUBwd:
    return allSame({{In, 0}, {In, 1}, {Out, 0}});
  case OpKind::SwiGLUBwd:
    return allSame({{In, 0}, {In, 1}, {In, 2}, {Out, 0}, {Out, 1}});
  case OpKind::ResidualAddBwd:
    return allSame({{In, 0}, {Out, 0}, {Out, 1}});
  case OpKind::Split:
    return split(In, Out);
  case OpKind::SplitBwd:
    return split(Out, In);
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
    return gatherOrScatter(op.kind == OpKind::AllGather);
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyBwd:
    return loss(op.kind == OpKind::CrossEntropyBwd);
  case OpKind::Send:
  case OpKind::Recv:
    // One operand of any shape: the communicator checks that both ends move the same bytes.
    return;
  case OpKind::Concat:
    return split(Out, In);
  case OpKind::AttentionBlock:
  case OpKind::AttentionBlockBwd:
    return attentionBlock(op.kind == OpKind::AttentionBlockBwd);
  case OpKind::AttentionMerge:
    return attentionMerge();
  case OpKind::MoeDispatch:
  case OpKind::ExpertMatMul:
  case OpKind::MoeCombine:
  case OpKind::MoeDispatchBwd:
  case OpKind::ExpertMatMulBwd:
  case OpKind::MoeCombineBwd:
  case OpKind::MoeAuxLossBwd:
  case OpKind::MoeCounts:
  case OpKind::AllToAll:
    return moe();
  }
}

} // namespace

void checkOpShapes(ReadContext &ctx, const RankPlan &plan, const Op &op,
                   ArrayRef<OperandShape> inputs, ArrayRef<OperandShape> outputs,
                   llvm::function_ref<std::string()> opPath) {
  ShapeRules(ctx, plan, op, inputs, outputs, opPath).check();
}

} // namespace parc::plan::detail
