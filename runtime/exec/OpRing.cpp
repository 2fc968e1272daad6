//===- OpRing.cpp - Ring attention's exchanges and blocks -----------------===//
//
// Context parallelism's ops (docs/plan-format.md): a run of consecutive send and recv ops is
// posted as one exchange, like the schedule's transfers, so that every member of the cp ring
// can send to its successor before it waits for its predecessor; and the blockwise attention
// kernels with their logsumexp merge.
//
// Tags: the n-th message from a rank to a peer within one run has tag n on both sides. A run
// completes before the next op, and the ring's peers never exchange anything else (a cp
// neighbour differs in the cp coordinate only, a pipeline neighbour in the pp coordinate), so
// nothing else can match them.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/OpInterpreter.h"

#include "Devices.h"

#include <stdexcept>

namespace parc::runtime {

using plan::OpKind;

namespace {
[[noreturn]] void opError(const std::string &message) { throw std::runtime_error(message); }
} // namespace

template <typename D>
void OpInterpreter<D>::exchangeRun(const plan::Chunk &chunk, llvm::ArrayRef<plan::Op> ops,
                                   size_t first, size_t last, ChunkEnv<T> &env) {
  std::vector<Transfer> transfers;
  std::map<std::pair<bool, int64_t>, int64_t> sent; // (send, peer) -> messages so far
  for (size_t i = first; i < last; ++i) {
    const plan::Op &op = ops[i];
    const std::vector<int64_t> &ranks = group(op);
    int64_t member = op.intAttr("peer");
    if (member < 0 || member >= int64_t(ranks.size()))
      opError("peer " + std::to_string(member) + " is not a member of group " +
              formatGroup(ranks));
    int64_t peer = ranks[size_t(member)];
    bool send = op.kind == OpKind::Send;
    int64_t tag = sent[{send, peer}]++;
    Context ctx{chunk, op, env, {}, {}};
    if (send) {
      Operand x = in(ctx, 0);
      transfers.push_back(Transfer::send(peer, tag, x.data, size_t(x.numel())));
    } else {
      Operand y = out(ctx, 0, false);
      transfers.push_back(Transfer::recv(peer, tag, y.data, size_t(y.numel())));
    }
  }
  comm.exchange(transfers);
}

template <typename D> void OpInterpreter<D>::executeRingAttention(Context &ctx) {
  const plan::Op &op = ctx.op;
  if (op.kind == OpKind::AttentionMerge) {
    Operand y1 = in(ctx, 0), lse1 = in(ctx, 1), y2 = in(ctx, 2), lse2 = in(ctx, 3);
    Operand y = out(ctx, 0, false), lse = out(ctx, 1, false);
    bool shaped = y1.shape.size() == 3 && lse1.shape.size() == 3 && y1.shape == y2.shape &&
                  lse1.shape == lse2.shape && y.numel() == y1.numel() &&
                  lse.numel() == lse1.numel();
    int64_t seq = shaped ? y1.shape[0] : 0, batch = shaped ? y1.shape[1] : 0;
    int64_t heads = shaped ? lse1.shape[1] : 0;
    if (!shaped || lse1.shape[0] != batch || lse1.shape[2] != seq || y1.shape[2] % heads != 0)
      opError("attention_merge takes two attentions [seq, batch, heads*d] of the same queries "
              "with their logsumexp [batch, heads, seq]");
    dev.attentionMerge(y.data, lse.data, y1.data, lse1.data, y2.data, lse2.data, seq, batch,
                       heads, y1.shape[2] / heads);
    return;
  }
  int64_t heads = op.intAttr("heads"), kvHeads = op.intAttr("kv_heads");
  bool causal = op.boolAttr("causal");
  Operand q = in(ctx, 0), k = in(ctx, 1), v = in(ctx, 2);
  if (q.shape.size() != 3 || k.shape.size() != 3 || k.shape != v.shape || q.shape[2] % heads)
    opError("a block takes q [seq, batch, heads*d] and k, v [seq, batch, kv_heads*d]");
  int64_t seqQ = q.shape[0], seqK = k.shape[0], batch = q.shape[1], headDim = q.shape[2] / heads;
  if (k.shape[1] != batch || k.shape[2] != kvHeads * headDim || (causal && seqQ != seqK))
    opError("the keys do not match the queries (a causal block is a diagonal, square block)");
  if (op.kind == OpKind::AttentionBlock) {
    Operand y = out(ctx, 0, false), lse = out(ctx, 1, false);
    if (y.numel() != q.numel() || lse.numel() != batch * heads * seqQ)
      opError("the outputs are not [seq, batch, heads*d] and [batch, heads, seq]");
    dev.attentionBlockForward(y.data, lse.data, q.data, k.data, v.data, seqQ, seqK, batch, heads,
                              kvHeads, headDim, causal);
    return;
  }
  Operand y = in(ctx, 3), lse = in(ctx, 4), dy = in(ctx, 5);
  if (y.numel() != q.numel() || dy.numel() != q.numel() || lse.numel() != batch * heads * seqQ)
    opError("the merged attention, its logsumexp or its gradient do not match the queries");
  Operand dq = out(ctx, 0, false), dk = out(ctx, 1, false), dv = out(ctx, 2, false);
  dev.attentionBlockBackward(dq.data, dk.data, dv.data, q.data, k.data, v.data, y.data, lse.data,
                             dy.data, seqQ, seqK, batch, heads, kvHeads, headDim, causal);
}

#define INSTANTIATE(D)                                                                             \
  template void OpInterpreter<D>::exchangeRun(const plan::Chunk &, llvm::ArrayRef<plan::Op>,      \
                                              size_t, size_t, ChunkEnv<typename D::Value> &);      \
  template void OpInterpreter<D>::executeRingAttention(Context &);
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
