//===- OpInterpreter.cpp - Operands, outputs and the compute ops ----------===//
//
// The framework of the interpreter (operand lookup, output allocation, gradient accumulation,
// liveness) and the ops that are a single kernel call. Collectives, split and the loss are in
// OpCollectives.cpp.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/OpInterpreter.h"

#include "Devices.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <set>
#include <stdexcept>

namespace parc::runtime {

using plan::OpKind;

namespace {
std::string describeOp(bool backward, size_t index, const plan::Op &op) {
  std::string text = (backward ? "backward[" : "forward[") + std::to_string(index) + "] (" +
                     plan::spelling(op.kind).str();
  if (!op.outputs.empty())
    text += " -> " + llvm::join(op.outputs, ", ");
  return text + ")";
}

int64_t product(llvm::ArrayRef<int64_t> dims) {
  int64_t n = 1;
  for (int64_t dim : dims)
    n *= dim;
  return n;
}

[[noreturn]] void opError(const std::string &message) { throw std::runtime_error(message); }

/// The attention's saved softmax: [batch, heads, seq] (the logsumexp of each row, flash) or
/// [batch, heads, seq, seq] (the probabilities); q is [seq, batch, heads * headDim].
template <typename Operand>
void checkAttentionStats(const Operand &stats, const Operand &q, int64_t heads, bool flash) {
  if (q.shape.size() != 3)
    opError("attention's q must be [seq, batch, heads * head_dim]");
  std::vector<int64_t> expected = {q.shape[1], heads, q.shape[0]};
  if (!flash)
    expected.push_back(q.shape[0]);
  if (stats.shape != llvm::ArrayRef<int64_t>(expected))
    opError(std::string("the attention's saved ") +
            (flash ? "logsumexp must be [batch, heads, seq]"
                   : "probabilities must be [batch, heads, seq, seq]"));
}
} // namespace

ChunkNames::ChunkNames(const plan::Chunk &chunk)
    : forwardOps(chunk.forward.data()), backwardOps(chunk.backward.data()) {
  auto add = [&](llvm::StringRef name) {
    if (name.empty())
      return -1;
    auto [it, inserted] = index.try_emplace(name, unsigned(index.size()));
    if (inserted) {
      auto type = chunk.tensors.find(name.str());
      types.push_back(type == chunk.tensors.end() ? nullptr : &type->second);
    }
    return int(it->second);
  };
  for (const auto &entry : chunk.tensors)
    add(entry.first);
  for (auto [ops, slots] : {std::pair(&chunk.forward, &forward), {&chunk.backward, &backward}})
    for (const plan::Op &op : *ops) {
      OpSlots &opSlots = slots->emplace_back();
      for (const std::string &name : op.inputs)
        opSlots.inputs.push_back(add(name));
      for (const std::string &name : op.outputs)
        opSlots.outputs.push_back(add(name));
    }
  // What the schedule hands over, loads and seeds (ScheduleRunner.cpp).
  for (const std::string &boundary : {chunk.input, chunk.output})
    if (!boundary.empty()) {
      add(boundary);
      add(plan::gradName(boundary));
    }
  for (llvm::StringRef name : {"loss", "loss.grad", "tokens", "labels"})
    add(name);
}

std::vector<ChunkNames::Freed>
ChunkNames::freed(const std::vector<std::vector<std::string>> &lists) const {
  std::vector<Freed> result(lists.size());
  for (size_t i = 0; i < lists.size(); ++i)
    for (const std::string &name : lists[i])
      if (int found = slot(name); found >= 0)
        result[i].push_back(found);
  return result;
}

ChunkLiveness ChunkLiveness::analyze(const plan::Chunk &chunk) {
  ChunkLiveness result;
  std::set<std::string> readByBackward;
  for (const plan::Op &op : chunk.backward)
    readByBackward.insert(op.inputs.begin(), op.inputs.end());
  std::set<std::string> keepAfterForward = readByBackward;
  keepAfterForward.insert({chunk.output, "loss"});

  auto lastUses = [](llvm::ArrayRef<plan::Op> ops) {
    std::map<std::string, size_t> last;
    for (size_t i = 0; i < ops.size(); ++i) {
      for (const std::string &name : ops[i].inputs)
        last[name] = i;
      for (const std::string &name : ops[i].outputs)
        last[name] = i;
    }
    return last;
  };
  result.afterForward.resize(chunk.forward.size());
  for (const auto &[name, index] : lastUses(chunk.forward))
    if (!keepAfterForward.count(name))
      result.afterForward[index].push_back(name);
  result.afterBackward.resize(chunk.backward.size());
  std::string inputGrad = chunk.input.empty() ? "" : plan::gradName(chunk.input);
  for (const auto &[name, index] : lastUses(chunk.backward))
    if (name != inputGrad)
      result.afterBackward[index].push_back(name);
  for (const std::string &name : readByBackward)
    if (chunk.tensors.count(name))
      result.readByBackward.push_back(name);
  return result;
}

template <typename D> int64_t OpInterpreter<D>::Operand::numel() const { return product(shape); }

template <typename D>
void OpInterpreter<D>::run(const plan::Chunk &chunk, bool backward, llvm::ArrayRef<plan::Op> ops,
                           const std::vector<ChunkNames::Freed> &freeAfter, ChunkEnv<T> &env,
                           llvm::function_ref<void(size_t)> afterOp,
                           llvm::function_ref<void(size_t)> beforeOp) {
  auto isPointToPoint = [&](size_t i) {
    return ops[i].kind == OpKind::Send || ops[i].kind == OpKind::Recv;
  };
  for (size_t i = 0; i < ops.size();) {
    // A maximal run of sends and receives is one exchange; every other op runs alone.
    size_t end = i + 1;
    if (isPointToPoint(i))
      while (end < ops.size() && isPointToPoint(end))
        ++end;
    for (size_t j = i; j < end && beforeOp; ++j)
      beforeOp(j);
    Context ctx{chunk, ops[i], env, freeAfter[i], {}, env.chunkNames().slotsOf(ops, i)};
    std::optional<StopWatch> watch; // a clock read an op costs when nothing profiles
    if (profile)
      watch.emplace();
    try {
      if (isPointToPoint(i))
        exchangeRun(chunk, ops, i, end, env);
      else
        execute(ctx);
    } catch (const CommError &error) {
      throw CommError(describeOp(backward, i, ops[i]) + ": " + error.what());
    } catch (const std::runtime_error &error) {
      throw std::runtime_error(describeOp(backward, i, ops[i]) + ": " + error.what());
    }
    for (PendingGrad &pending : ctx.pending)
      dev.accumulateGrad(pending.grad, pending.scratch.data(), int64_t(pending.scratch.size()));
    // An exchange is timed as one op, under the kind of its first send or receive.
    if (profile)
      record(ctx, *watch);
    for (; i < end; ++i) {
      for (int slot : freeAfter[i])
        env.eraseAt(slot);
      if (afterOp)
        afterOp(i);
    }
  }
}

template <typename D> void OpInterpreter<D>::record(Context &ctx, const StopWatch &watch) {
  dev.synchronize();
  double seconds = watch.seconds();
  profile->add(profileKey(ctx.op), seconds,
               opFlops(ctx.op, [&](size_t i) { return in(ctx, i).shape; }));
}

template <typename D>
typename OpInterpreter<D>::Operand OpInterpreter<D>::in(Context &ctx, size_t i) {
  const std::string &name = ctx.op.inputs[i];
  int slot = ctx.slots ? ctx.slots->inputs[i] : ctx.env.chunkNames().slot(name);
  if (Tensor<T> *value = ctx.env.valueAt(slot))
    return {value->data(), value->shape};
  if (typename ParamStore<D>::Param *param = paramAt(ctx, slot, name, ParamUse::Value)) {
    if (param->released())
      opError("parameter '" + name +
              "' is released (ZeRO-3): the schedule must all_gather_params before this compute");
    return {param->value, param->localShape};
  }
  if (ctx.env.ids(name))
    opError("operand '" + name + "' holds token ids, not values");
  opError("operand '" + name + "' is not defined at this point");
}

template <typename D>
const int64_t *OpInterpreter<D>::ids(Context &ctx, size_t i, std::vector<int64_t> *shape) {
  const std::string &name = ctx.op.inputs[i];
  Tensor<int64_t> *tensor = ctx.env.ids(name);
  if (!tensor)
    opError("operand '" + name + "' must be token ids loaded by load_batch, but is not defined");
  if (shape)
    shape->assign(tensor->shape.begin(), tensor->shape.end());
  return tensor->data();
}

template <typename D>
typename OpInterpreter<D>::Operand OpInterpreter<D>::out(Context &ctx, size_t i, bool kernelAdds) {
  const std::string &name = ctx.op.outputs[i];
  int slot = outputSlot(ctx, i);
  if (typename ParamStore<D>::Param *param = paramAt(ctx, slot, name, ParamUse::Gradient)) {
    Grad *grad = params.writableGrad(*param);
    if constexpr (std::is_same_v<Grad, T>)
      if (kernelAdds)
        return {grad, param->localShape};
    PendingGrad &pending = ctx.pending.emplace_back();
    pending.scratch = Buffer<T>(memory, MemoryCategory::Grads, size_t(param->numel),
                                kernelAdds ? Init::Zero : Init::Overwritten);
    pending.grad = grad;
    return {pending.scratch.data(), param->localShape};
  }
  const plan::TensorType *type = ctx.env.chunkNames().type(slot);
  if (!type)
    opError("output '" + name + "' is missing from the chunk's tensor table");
  if (type->dtype == plan::DType::Int64)
    opError("output '" + name + "' is declared int64; ops write only floating-point tensors");
  if (ctx.env.hasAt(slot))
    opError("output '" + name + "' is written a second time in this pass");
  Tensor<T> &tensor = ctx.env.setValueAt(name, slot);
  tensor = Tensor<T>(memory, MemoryCategory::Activations, type->shape,
                     kernelAdds ? Init::Zero : Init::Overwritten);
  return {tensor.data(), tensor.shape};
}

template <typename D>
typename OpInterpreter<D>::Operand OpInterpreter<D>::outOver(Context &ctx, size_t o, size_t i) {
  const std::string &input = ctx.op.inputs[i], &output = ctx.op.outputs[o];
  const ChunkNames &names = ctx.env.chunkNames();
  int inSlot = ctx.slots ? ctx.slots->inputs[i] : names.slot(input);
  int outSlot = outputSlot(ctx, o);
  Tensor<T> *value = ctx.env.valueAt(inSlot);
  const plan::TensorType *type = names.type(outSlot);
  bool dies = inSlot >= 0 && llvm::is_contained(ctx.freedAfter, inSlot);
  if (!dies || !value || paramAt(ctx, outSlot, output, ParamUse::Gradient) || !type ||
      llvm::ArrayRef<int64_t>(type->shape) != llvm::ArrayRef<int64_t>(value->shape) ||
      ctx.env.hasAt(outSlot))
    return out(ctx, o, false);
  Tensor<T> moved = std::move(*value);
  ctx.env.eraseAt(inSlot);
  Tensor<T> &tensor = ctx.env.setValueAt(output, outSlot);
  tensor = std::move(moved);
  return {tensor.data(), tensor.shape};
}

template <typename D>
typename ParamStore<D>::Param *OpInterpreter<D>::paramAt(Context &ctx, int slot,
                                                         llvm::StringRef name, ParamUse use) {
  const ChunkNames &names = ctx.env.chunkNames();
  bool gradient = use == ParamUse::Gradient;
  int found = gradient ? names.gradOwnerAt(slot) : names.paramAt(slot);
  if (found == ChunkNames::unbound)
    return gradient ? params.gradOwner(name) : params.find(name);
  // ScheduleRunner binds the names to the store this interpreter steps, sized once.
  assert(size_t(found) < params.all().size() || found < 0);
  return found < 0 ? nullptr : &params.all()[size_t(found)];
}

template <typename D> int OpInterpreter<D>::outputSlot(Context &ctx, size_t i) const {
  return ctx.slots ? ctx.slots->outputs[i] : ctx.env.chunkNames().slot(ctx.op.outputs[i]);
}

template <typename D>
const std::vector<int64_t> &OpInterpreter<D>::group(const plan::Op &op) const {
  const std::vector<int64_t> &ranks = plan.groups.get(op.groupAttr("group"));
  if (ranks.empty())
    opError("group '" + plan::spelling(op.groupAttr("group")).str() +
            "' is empty on this rank; the op cannot run here");
  return ranks;
}

template <typename D> void OpInterpreter<D>::execute(Context &ctx) {
  switch (ctx.op.kind) {
  case OpKind::AllReduce:
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::Split:
  case OpKind::SplitBwd:
  case OpKind::Concat:
    return executeCollective(ctx);
  case OpKind::AttentionBlock:
  case OpKind::AttentionMerge:
  case OpKind::AttentionBlockBwd:
    return executeRingAttention(ctx);
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyBwd:
    return executeLoss(ctx);
  case OpKind::AllToAll:
    return allToAll(ctx);
  default:
    if (plan::isMixtureOfExperts(ctx.op.kind))
      return executeMoE(ctx);
    if (plan::opInfo(ctx.op.kind).backwardOnly)
      return executeBackward(ctx);
    return executeCompute(ctx);
  }
}

template <typename D> void OpInterpreter<D>::executeCompute(Context &ctx) {
  const plan::Op &op = ctx.op;
  auto sameSize = [](const Operand &a, const Operand &b, const char *what) {
    if (a.numel() != b.numel())
      opError(std::string(what) + ": operands of " + std::to_string(a.numel()) + " and " +
              std::to_string(b.numel()) + " elements");
  };
  switch (op.kind) {
  case OpKind::Embedding: {
    std::vector<int64_t> idShape;
    const int64_t *tokens = ids(ctx, 0, &idShape);
    Operand weight = in(ctx, 1), y = out(ctx, 0, false);
    int64_t batch = idShape[0], seq = idShape[1], hidden = weight.shape.back();
    if (y.numel() != seq * batch * hidden)
      opError("output does not hold [seq, batch, hidden] of the ids and the table");
    dev.embeddingForward(y.data, tokens, weight.data, seq, batch, hidden,
                         op.intAttr("vocab_offset"), weight.shape[0]);
    return;
  }
  case OpKind::PositionEmbedding: {
    Operand x = in(ctx, 0), weight = in(ctx, 1), y = out(ctx, 0, false);
    sameSize(x, y, "position_embedding");
    int64_t offset = op.intAttr("offset");
    if (offset < 0 || weight.shape[0] < offset + x.shape[0])
      opError("the position table has no rows " + std::to_string(offset) + " to " +
              std::to_string(offset + x.shape[0]));
    dev.positionEmbeddingForward(y.data, x.data, weight.data + offset * x.shape[2], x.shape[0],
                                 x.shape[1], x.shape[2]);
    return;
  }
  case OpKind::LayerNorm: {
    if (op.inputs.size() == 4) { // (a, b, weight, bias) -> (a + b, y), fused by OpFusion.h
      Operand a = in(ctx, 0), b = in(ctx, 1), weight = in(ctx, 2), bias = in(ctx, 3);
      Operand sum = out(ctx, 0, false), y = out(ctx, 1, false);
      for (const Operand *other : {&b, &sum, &y})
        sameSize(a, *other, "residual_add + layernorm");
      int64_t dim = a.shape.back();
      dev.residualLayerNormForward(sum.data, y.data, a.data, b.data, weight.data, bias.data,
                                   a.numel() / dim, dim, op.numberAttr("eps"));
      return;
    }
    Operand x = in(ctx, 0), weight = in(ctx, 1), bias = in(ctx, 2), y = out(ctx, 0, false);
    sameSize(x, y, "layernorm");
    int64_t dim = x.shape.back();
    dev.layerNormForward(y.data, x.data, weight.data, bias.data, x.numel() / dim, dim,
                         op.numberAttr("eps"));
    return;
  }
  case OpKind::RMSNorm: {
    if (op.inputs.size() == 3) { // (a, b, weight) -> (a + b, y), fused by OpFusion.h
      Operand a = in(ctx, 0), b = in(ctx, 1), weight = in(ctx, 2);
      Operand sum = out(ctx, 0, false), y = out(ctx, 1, false);
      for (const Operand *other : {&b, &sum, &y})
        sameSize(a, *other, "residual_add + rmsnorm");
      int64_t dim = a.shape.back();
      dev.residualRmsNormForward(sum.data, y.data, a.data, b.data, weight.data, a.numel() / dim,
                                 dim, op.numberAttr("eps"));
      return;
    }
    Operand x = in(ctx, 0), weight = in(ctx, 1), y = out(ctx, 0, false);
    sameSize(x, y, "rmsnorm");
    int64_t dim = x.shape.back();
    dev.rmsNormForward(y.data, x.data, weight.data, x.numel() / dim, dim, op.numberAttr("eps"));
    return;
  }
  case OpKind::MatMul: {
    Operand a = in(ctx, 0), b = in(ctx, 1);
    bool transA = op.boolAttr("trans_a"), transB = op.boolAttr("trans_b");
    if (b.shape.size() != 2 || (transA && a.shape.size() != 2))
      opError("matmul needs a 2-D b (and a 2-D a with trans_a)");
    int64_t k = transA ? a.shape[0] : a.shape.back();
    int64_t m = a.numel() / k;
    int64_t n = transB ? b.shape[0] : b.shape[1];
    if ((transB ? b.shape[1] : b.shape[0]) != k)
      opError("inner dimensions differ");
    Operand c = out(ctx, 0, false);
    if (c.numel() != m * n)
      opError("the output holds " + std::to_string(c.numel()) + " elements, not " +
              std::to_string(m) + " x " + std::to_string(n));
    dev.matmulForward(c.data, a.data, b.data, m, n, k, transA, transB);
    return;
  }
  case OpKind::BiasAdd: {
    Operand x = in(ctx, 0), bias = in(ctx, 1), y = out(ctx, 0, false);
    sameSize(x, y, "bias_add");
    dev.biasAddForward(y.data, x.data, bias.data, x.numel() / bias.numel(), bias.numel());
    return;
  }
  case OpKind::RoPE: {
    Operand x = in(ctx, 0), y = out(ctx, 0, false);
    sameSize(x, y, "rope");
    int64_t heads = op.intAttr("heads");
    dev.ropeForward(y.data, x.data, x.shape[0], x.shape[1], heads, x.shape[2] / heads,
                    op.numberAttr("theta"), op.intAttr("offset"));
    return;
  }
  case OpKind::Attention: {
    Operand q = in(ctx, 0), k = in(ctx, 1), v = in(ctx, 2), y = out(ctx, 0, false);
    Operand stats = out(ctx, 1, false);
    sameSize(q, y, "attention");
    int64_t heads = op.intAttr("heads");
    checkAttentionStats(stats, q, heads, op.boolAttr("flash"));
    dev.attentionForward(y.data, stats.data, q.data, k.data, v.data, q.shape[0], q.shape[1],
                         heads, op.intAttr("kv_heads"), q.shape[2] / heads, op.boolAttr("causal"),
                         op.boolAttr("flash"));
    return;
  }
  case OpKind::GELU: {
    Operand x = in(ctx, 0), y = out(ctx, 0, false);
    sameSize(x, y, "gelu");
    if (op.inputs.size() == 2) { // gelu(x + bias), fused by OpFusion.h
      Operand bias = in(ctx, 1);
      dev.biasGeluForward(y.data, x.data, bias.data, x.numel() / bias.numel(), bias.numel());
      return;
    }
    dev.geluForward(y.data, x.data, x.numel());
    return;
  }
  case OpKind::SwiGLU: {
    Operand gate = in(ctx, 0), up = in(ctx, 1), y = out(ctx, 0, false);
    sameSize(gate, up, "swiglu");
    sameSize(gate, y, "swiglu");
    int64_t ffn = gate.shape.back();
    dev.swigluForward(y.data, gate.data, up.data, gate.numel() / ffn, ffn);
    return;
  }
  case OpKind::ResidualAdd: {
    Operand a = in(ctx, 0), b = in(ctx, 1), y = out(ctx, 0, false);
    sameSize(a, b, "residual_add");
    sameSize(a, y, "residual_add");
    dev.residualAddForward(y.data, a.data, b.data, a.numel());
    return;
  }
  default:
    opError("op kind '" + plan::spelling(op.kind).str() + "' is not a forward compute op");
  }
}

template <typename D> void OpInterpreter<D>::executeBackward(Context &ctx) {
  const plan::Op &op = ctx.op;
  switch (op.kind) {
  case OpKind::EmbeddingBwd: {
    std::vector<int64_t> idShape;
    const int64_t *tokens = ids(ctx, 0, &idShape);
    Operand dy = in(ctx, 1), dweight = out(ctx, 0, true);
    dev.embeddingBackward(dweight.data, tokens, dy.data, idShape[1], idShape[0],
                          dweight.shape.back(), op.intAttr("vocab_offset"), dweight.shape[0]);
    return;
  }
  case OpKind::PositionEmbeddingBwd: {
    Operand dy = in(ctx, 0), dx = out(ctx, 0, false), dweight = out(ctx, 1, true);
    int64_t offset = op.intAttr("offset");
    if (offset < 0 || dweight.shape[0] < offset + dy.shape[0])
      opError("the position table has no rows " + std::to_string(offset) + " to " +
              std::to_string(offset + dy.shape[0]));
    dev.positionEmbeddingBackward(dx.data, dweight.data + offset * dy.shape[2], dy.data,
                                  dy.shape[0], dy.shape[1], dy.shape[2]);
    return;
  }
  case OpKind::LayerNormBwd: {
    Operand x = in(ctx, 0), weight = in(ctx, 1), dy = in(ctx, 2);
    Operand dx = out(ctx, 0, false), dweight = out(ctx, 1, true), dbias = out(ctx, 2, true);
    int64_t dim = x.shape.back();
    dev.layerNormBackward(dx.data, dweight.data, dbias.data, x.data, weight.data, dy.data,
                          x.numel() / dim, dim, op.numberAttr("eps"));
    return;
  }
  case OpKind::RMSNormBwd: {
    Operand x = in(ctx, 0), weight = in(ctx, 1), dy = in(ctx, 2);
    Operand dx = out(ctx, 0, false), dweight = out(ctx, 1, true);
    int64_t dim = x.shape.back();
    dev.rmsNormBackward(dx.data, dweight.data, x.data, weight.data, dy.data, x.numel() / dim, dim,
                        op.numberAttr("eps"));
    return;
  }
  case OpKind::MatMulBwd: {
    Operand a = in(ctx, 0), b = in(ctx, 1), dc = in(ctx, 2);
    bool transA = op.boolAttr("trans_a"), transB = op.boolAttr("trans_b");
    int64_t k = transA ? a.shape[0] : a.shape.back();
    int64_t m = a.numel() / k;
    int64_t n = transB ? b.shape[0] : b.shape[1];
    if (dc.numel() != m * n)
      opError("the output gradient does not match the product's shape");
    // Fresh tensors start at zero, so adding is overwriting them; parameter gradients add.
    // (Overwriting with beta = 0 instead made OpenBLAS scale C in its beta kernel, slower
    // than the zero-fill, and its kernel still reads C.)
    Operand da = out(ctx, 0, true), db = out(ctx, 1, true);
    dev.matmulBackward(da.data, db.data, a.data, b.data, dc.data, m, n, k, transA, transB,
                       cpu::GradWrite::Add, cpu::GradWrite::Add);
    return;
  }
  case OpKind::BiasAddBwd: { // dx is dy, so it takes dy's storage when dy dies here
    Operand dy = in(ctx, 0), dx = outOver(ctx, 0, 0), dbias = out(ctx, 1, true);
    dev.biasAddBackward(dx.data, dbias.data, dy.data, dy.numel() / dbias.numel(), dbias.numel());
    return;
  }
  case OpKind::RoPEBwd: {
    Operand dy = in(ctx, 0), dx = out(ctx, 0, false);
    int64_t heads = op.intAttr("heads");
    dev.ropeBackward(dx.data, dy.data, dy.shape[0], dy.shape[1], heads, dy.shape[2] / heads,
                     op.numberAttr("theta"), op.intAttr("offset"));
    return;
  }
  case OpKind::AttentionBwd: {
    Operand q = in(ctx, 0), k = in(ctx, 1), v = in(ctx, 2), y = in(ctx, 3), stats = in(ctx, 4);
    Operand dy = in(ctx, 5);
    Operand dq = out(ctx, 0, false), dk = out(ctx, 1, false), dv = out(ctx, 2, false);
    int64_t heads = op.intAttr("heads");
    if (y.numel() != q.numel() || dy.numel() != q.numel())
      opError("attention_bwd: the output and its gradient differ in size from q");
    checkAttentionStats(stats, q, heads, op.boolAttr("flash"));
    dev.attentionBackward(dq.data, dk.data, dv.data, q.data, k.data, v.data, y.data, stats.data,
                          dy.data, q.shape[0], q.shape[1], heads, op.intAttr("kv_heads"),
                          q.shape[2] / heads, op.boolAttr("causal"), op.boolAttr("flash"));
    return;
  }
  case OpKind::GELUBwd: {
    if (op.inputs.size() == 3) { // (x, bias, dy) -> (dx, dbias), fused by OpFusion.h
      Operand x = in(ctx, 0), bias = in(ctx, 1), dy = in(ctx, 2);
      Operand dx = out(ctx, 0, false), dbias = out(ctx, 1, true);
      dev.biasGeluBackward(dx.data, dbias.data, x.data, bias.data, dy.data,
                           x.numel() / bias.numel(), bias.numel());
      return;
    }
    Operand x = in(ctx, 0), dy = in(ctx, 1), dx = out(ctx, 0, false);
    dev.geluBackward(dx.data, x.data, dy.data, x.numel());
    return;
  }
  case OpKind::SwiGLUBwd: {
    Operand gate = in(ctx, 0), up = in(ctx, 1), dy = in(ctx, 2);
    Operand dgate = out(ctx, 0, false), dup = out(ctx, 1, false);
    int64_t ffn = gate.shape.back();
    dev.swigluBackward(dgate.data, dup.data, gate.data, up.data, dy.data, gate.numel() / ffn, ffn);
    return;
  }
  case OpKind::ResidualAddBwd: { // da is dy, as is db: one of them can be dy's storage
    Operand dy = in(ctx, 0), da = outOver(ctx, 0, 0), db = out(ctx, 1, false);
    dev.residualAddBackward(da.data, db.data, dy.data, dy.numel());
    return;
  }
  default:
    opError("op kind '" + plan::spelling(op.kind).str() + "' is not a backward compute op");
  }
}

#define INSTANTIATE(D) template class OpInterpreter<D>;
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
