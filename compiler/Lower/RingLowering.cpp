//===- RingLowering.cpp - Attention under context parallelism -------------===//
//
// Ring attention as Megatron-Core and Transformer Engine run it. The sequence is cut into
// 2 x cp chunks of c positions; cp rank r holds chunks r and 2cp - 1 - r, so that every rank
// has the same share of the causal mask. The keys and values of the rank's chunks travel the
// cp ring: at step i rank r holds the block of rank j = r - i (mod cp), received from rank
// r - 1 while step i - 1 ran, and attends its query chunks to the parts the causal mask allows:
//   step 0 (j = r)  chunk 0 to key chunk 0 (diagonal), chunk 1 to key chunk 0 (full) and to
//                   key chunk 1 (diagonal);
//   j < r           both query chunks to key chunk 0 (full);
//   j > r           query chunk 1 to both key chunks (full).
// Each block writes its output and the logsumexp of its rows; attention_merge folds the blocks
// of one query chunk together (the online softmax). The backward runs the ring again: each
// block's dK and dV are added to the accumulators that travel with the keys, and after cp
// steps the accumulators arrive back at their owner.
//
// Every tensor is one chunk [c, micro_batch, width]; a logsumexp is [micro_batch, heads, c].
//
//===----------------------------------------------------------------------===//
#include "LowerInternal.h"

namespace parc::lower {

namespace {

using plan::OpKind;
using Attrs = std::map<std::string, plan::AttrValue>;

/// One block of a ring step: query chunk `q` against key/value chunk `kv` of the held block.
struct BlockPair {
  int q, kv;
  bool causal;
};

/// The pairs of step `step` on cp rank `rank` (the file comment's table).
std::vector<BlockPair> pairsOf(int64_t step, int64_t rank, int64_t cp) {
  if (step == 0)
    return {{0, 0, true}, {1, 0, false}, {1, 1, true}};
  int64_t source = ((rank - step) % cp + cp) % cp;
  if (source < rank)
    return {{0, 0, false}, {1, 0, false}};
  return {{1, 0, false}, {1, 1, false}};
}

/// Names, shapes and ops of one block's ring.
class Ring {
public:
  Ring(OpWriter &w, const RingSite &site, llvm::StringRef sfx)
      : w(w), site(site), job(site.job), sfx(sfx.str()), chunk(job.cpChunk()),
        next((site.cpRank + 1) % job.cp), prev((site.cpRank + job.cp - 1) % job.cp) {}

  /// "block.3.attn." + leaf + the recomputation suffix.
  std::string name(const std::string &leaf) const {
    return blockName(site.block, "attn." + leaf) + sfx;
  }
  std::string chunkTensor(const std::string &leaf, int64_t width) {
    return w.activation(name(leaf), chunk, width);
  }
  int64_t width(char tensor) const {
    return (tensor == 'q' ? site.heads : site.kvHeads) * site.headDim;
  }
  Attrs blockAttrs(bool causal) const {
    return {{"causal", causal}, {"heads", site.heads}, {"kv_heads", site.kvHeads}};
  }
  Attrs peer(int64_t member) const {
    return {{"group", plan::spelling(plan::Group::CP).str()}, {"peer", member}};
  }

  /// Splits `x` [2c, b, width] into the rank's two chunks named after `leaf`.
  RingAttention::Chunks split(const std::string &x, const std::string &leaf, int64_t width);
  /// One posted exchange: every `sends` tensor goes to the next rank, every `recvs` tensor
  /// (declared with the shape of the send at the same position) comes from the previous.
  void exchange(const std::vector<std::string> &sends, const std::vector<std::string> &recvs);
  /// The forward ring from the chunks of `r`; fills its outputs.
  void forward(RingAttention &r);
  void backward(const RingAttention &r, const std::string &dOutput, const std::string &dq,
                const std::string &dk, const std::string &dv);

private:
  /// `parts` summed; the single part itself, so that no copy is needed.
  std::string sum(const std::vector<std::string> &parts, const std::string &target);
  /// The held block's keys and values at step `step` of the forward or backward ring.
  void receiveBlock(int64_t step, llvm::StringRef ring, RingAttention::Chunks &k,
                    RingAttention::Chunks &v, std::vector<std::string> &sends,
                    std::vector<std::string> &recvs);

  OpWriter &w;
  const RingSite &site;
  const Job &job;
  std::string sfx;
  int64_t chunk, next, prev;
};

RingAttention::Chunks Ring::split(const std::string &x, const std::string &leaf, int64_t width) {
  RingAttention::Chunks parts;
  for (int h = 0; h < 2; ++h)
    parts.part[h] = chunkTensor(leaf + ".chunk" + std::to_string(h), width);
  w.emit(OpKind::Split, {x}, {parts.part[0], parts.part[1]}, {{"dim", int64_t(0)}});
  return parts;
}

void Ring::exchange(const std::vector<std::string> &sends, const std::vector<std::string> &recvs) {
  for (size_t i = 0; i < recvs.size(); ++i)
    w.chunk.tensors[recvs[i]] = w.chunk.tensors.at(sends[i]);
  for (const std::string &s : sends)
    w.emit(OpKind::Send, {s}, {}, peer(next));
  for (const std::string &r : recvs)
    w.emit(OpKind::Recv, {}, {r}, peer(prev));
}

void Ring::receiveBlock(int64_t step, llvm::StringRef ring, RingAttention::Chunks &k,
                        RingAttention::Chunks &v, std::vector<std::string> &sends,
                        std::vector<std::string> &recvs) {
  for (RingAttention::Chunks *held : {&k, &v})
    for (int h = 0; h < 2; ++h) {
      sends.push_back(held->part[h]);
      held->part[h] = name(std::string(held == &k ? "k" : "v") + "." + ring.str() +
                           std::to_string(step) + ".chunk" + std::to_string(h));
      recvs.push_back(held->part[h]);
    }
}

std::string Ring::sum(const std::vector<std::string> &parts, const std::string &target) {
  std::string total = parts.front();
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string next = target + (i + 1 == parts.size() ? "" : ".sum" + std::to_string(i));
    w.chunk.tensors[next] = w.chunk.tensors.at(parts.front());
    w.emit(OpKind::ResidualAdd, {total, parts[i]}, {next});
    total = next;
  }
  return total;
}

void Ring::forward(RingAttention &r) {
  RingAttention::Chunks k = r.k, v = r.v;
  // The running merge of each query chunk's blocks: output and logsumexp.
  std::string y[2], lse[2];
  for (int64_t step = 0; step < job.cp; ++step) {
    if (step > 0) {
      std::vector<std::string> sends, recvs;
      receiveBlock(step, "ring", k, v, sends, recvs);
      exchange(sends, recvs);
    }
    for (const BlockPair &pair : pairsOf(step, site.cpRank, job.cp)) {
      std::string leaf = "ctx.chunk" + std::to_string(pair.q) + ".step" + std::to_string(step) +
                         ".kv" + std::to_string(pair.kv);
      std::string out = chunkTensor(leaf, width('q'));
      std::string rows = w.declare(name(leaf + ".lse"), {job.microBatch, site.heads, chunk},
                                   plan::DType::FP32);
      w.emit(OpKind::AttentionBlock, {r.q.part[pair.q], k.part[pair.kv], v.part[pair.kv]},
             {out, rows}, blockAttrs(pair.causal));
      std::string &acc = y[pair.q], &accLse = lse[pair.q];
      if (acc.empty()) {
        acc = out;
        accLse = rows;
        continue;
      }
      std::string merged = chunkTensor(leaf + ".merged", width('q'));
      std::string mergedLse = w.declare(name(leaf + ".merged.lse"),
                                        {job.microBatch, site.heads, chunk}, plan::DType::FP32);
      w.emit(OpKind::AttentionMerge, {acc, accLse, out, rows}, {merged, mergedLse});
      acc = merged;
      accLse = mergedLse;
    }
  }
  for (int h = 0; h < 2; ++h) {
    r.y.part[h] = y[h];
    r.lse.part[h] = lse[h];
  }
  r.output = w.activation(name("ctx"), 2 * chunk, width('q'));
  w.emit(OpKind::Concat, {y[0], y[1]}, {r.output}, {{"dim", int64_t(0)}});
}

void Ring::backward(const RingAttention &r, const std::string &dOutput, const std::string &dq,
                    const std::string &dk, const std::string &dv) {
  std::string dy[2];
  for (int h = 0; h < 2; ++h)
    dy[h] = w.gradOf(r.y.part[h]);
  w.emit(OpKind::Split, {dOutput}, {dy[0], dy[1]}, {{"dim", int64_t(0)}});

  RingAttention::Chunks k = r.k, v = r.v;
  std::vector<std::string> dqParts[2];
  // The accumulated dK and dV of the block this rank held at the last step, to pass on.
  RingAttention::Chunks dkHeld, dvHeld;
  for (int64_t step = 0; step < job.cp; ++step) {
    std::string at = "bwd" + std::to_string(step);
    RingAttention::Chunks dkIn, dvIn; // what arrived with this step's block
    if (step > 0) {
      std::vector<std::string> sends, recvs;
      receiveBlock(step, "bwd.ring", k, v, sends, recvs);
      for (RingAttention::Chunks *acc : {&dkHeld, &dvHeld})
        for (int h = 0; h < 2; ++h) {
          sends.push_back(acc->part[h]);
          recvs.push_back(name(std::string(acc == &dkHeld ? "k" : "v") + ".ring" +
                               std::to_string(step) + ".chunk" + std::to_string(h) + ".grad.in"));
          (acc == &dkHeld ? dkIn : dvIn).part[h] = recvs.back();
        }
      exchange(sends, recvs);
    }
    std::vector<std::string> dkParts[2], dvParts[2];
    for (const BlockPair &pair : pairsOf(step, site.cpRank, job.cp)) {
      std::string leaf = "chunk" + std::to_string(pair.q) + "." + at + ".kv" +
                         std::to_string(pair.kv) + ".grad";
      std::string dqPart = chunkTensor("q." + leaf, width('q'));
      std::string dkPart = chunkTensor("k." + leaf, width('k'));
      std::string dvPart = chunkTensor("v." + leaf, width('v'));
      w.emit(OpKind::AttentionBlockBwd,
             {r.q.part[pair.q], k.part[pair.kv], v.part[pair.kv], r.y.part[pair.q],
              r.lse.part[pair.q], dy[pair.q]},
             {dqPart, dkPart, dvPart}, blockAttrs(pair.causal));
      dqParts[pair.q].push_back(dqPart);
      dkParts[pair.kv].push_back(dkPart);
      dvParts[pair.kv].push_back(dvPart);
    }
    for (int h = 0; h < 2; ++h) {
      // A key chunk no query touched passes its accumulator on unchanged.
      if (step > 0) {
        dkParts[h].push_back(dkIn.part[h]);
        dvParts[h].push_back(dvIn.part[h]);
      }
      std::string held = std::to_string(step) + ".chunk" + std::to_string(h) + ".grad";
      dkHeld.part[h] = sum(dkParts[h], name("k.ring" + held));
      dvHeld.part[h] = sum(dvParts[h], name("v.ring" + held));
    }
  }
  // The last hop brings every accumulator home: this rank's own keys' and values' gradients.
  std::vector<std::string> sends, recvs;
  RingAttention::Chunks dkOwn, dvOwn;
  for (RingAttention::Chunks *acc : {&dkHeld, &dvHeld})
    for (int h = 0; h < 2; ++h) {
      sends.push_back(acc->part[h]);
      const RingAttention::Chunks &own = acc == &dkHeld ? r.k : r.v;
      recvs.push_back(plan::gradName(own.part[h]));
      (acc == &dkHeld ? dkOwn : dvOwn).part[h] = recvs.back();
    }
  exchange(sends, recvs);

  RingAttention::Chunks dqOwn;
  for (int h = 0; h < 2; ++h)
    dqOwn.part[h] = sum(dqParts[h], plan::gradName(r.q.part[h]));
  // Through RoPE back to the unrotated chunks, then the chunks back into the rank's rows.
  auto unrotate = [&](RingAttention::Chunks grads, const RingAttention::Chunks &input,
                      int64_t heads) {
    if (!site.rope)
      return grads;
    for (int h = 0; h < 2; ++h) {
      std::string dInput = w.gradOf(input.part[h]);
      w.emit(OpKind::RoPEBwd, {grads.part[h]}, {dInput},
             ropeAttrs(heads, job.cpChunkStart(site.cpRank, h), job.program.model.ropeTheta));
      grads.part[h] = dInput;
    }
    return grads;
  };
  dqOwn = unrotate(dqOwn, r.qIn, site.heads);
  dkOwn = unrotate(dkOwn, r.kIn, site.kvHeads);
  for (auto [grads, out] : {std::pair{dqOwn, dq}, {dkOwn, dk}, {dvOwn, dv}})
    w.emit(OpKind::SplitBwd, {grads.part[0], grads.part[1]}, {out}, {{"dim", int64_t(0)}});
}

} // namespace

RingAttention ringAttentionForward(OpWriter &w, const RingSite &site, const std::string &q,
                                   const std::string &k, const std::string &v,
                                   llvm::StringRef sfx) {
  Ring ring(w, site, sfx);
  RingAttention r;
  r.qIn = r.q = ring.split(q, "q", ring.width('q'));
  r.kIn = r.k = ring.split(k, "k", ring.width('k'));
  r.v = ring.split(v, "v", ring.width('v'));
  if (site.rope)
    for (auto [chunks, leaf, heads] :
         {std::tuple{&r.q, "q", site.heads}, std::tuple{&r.k, "k", site.kvHeads}})
      for (int h = 0; h < 2; ++h) {
        std::string rotated =
            ring.chunkTensor(std::string(leaf) + ".chunk" + std::to_string(h) + ".rope",
                             ring.width(leaf[0]));
        w.emit(OpKind::RoPE, {chunks->part[h]}, {rotated},
               ropeAttrs(heads, site.job.cpChunkStart(site.cpRank, h),
                         site.job.program.model.ropeTheta));
        chunks->part[h] = rotated;
      }
  ring.forward(r);
  return r;
}

RingAttention ringAttentionRecompute(OpWriter &w, const RingSite &site, const RingAttention &saved,
                                     llvm::StringRef sfx) {
  Ring ring(w, site, sfx);
  RingAttention r = saved;
  ring.forward(r);
  return r;
}

void ringAttentionBackward(OpWriter &w, const RingSite &site, const RingAttention &ring,
                           const std::string &dOutput, const std::string &dq,
                           const std::string &dk, const std::string &dv) {
  Ring(w, site, "").backward(ring, dOutput, dq, dk, dv);
}

void addChunkPositions(OpWriter &w, int64_t cpRank, const std::string &x, const std::string &out) {
  const Job &job = w.job;
  std::string parts[2], positioned[2];
  for (int h = 0; h < 2; ++h) {
    parts[h] = w.activation(x + ".chunk" + std::to_string(h), job.cpChunk(), job.hidden);
    positioned[h] = w.activation(out + ".chunk" + std::to_string(h), job.cpChunk(), job.hidden);
  }
  w.emit(OpKind::Split, {x}, {parts[0], parts[1]}, {{"dim", int64_t(0)}});
  for (int h = 0; h < 2; ++h)
    w.emit(OpKind::PositionEmbedding, {parts[h], PositionEmbedding.str()}, {positioned[h]},
           {{"offset", job.cpChunkStart(cpRank, h)}});
  w.emit(OpKind::Concat, {positioned[0], positioned[1]}, {out}, {{"dim", int64_t(0)}});
}

void addChunkPositionsBackward(OpWriter &w, int64_t cpRank, const std::string &dy,
                               const std::string &dx) {
  const Job &job = w.job;
  std::string parts[2], inputs[2];
  for (int h = 0; h < 2; ++h) {
    parts[h] = w.activation(dy + ".chunk" + std::to_string(h), job.cpChunk(), job.hidden);
    inputs[h] = w.activation(dx + ".chunk" + std::to_string(h), job.cpChunk(), job.hidden);
  }
  w.emit(OpKind::Split, {dy}, {parts[0], parts[1]}, {{"dim", int64_t(0)}});
  for (int h = 0; h < 2; ++h)
    w.emit(OpKind::PositionEmbeddingBwd, {parts[h]},
           {inputs[h], plan::gradName(PositionEmbedding)},
           {{"offset", job.cpChunkStart(cpRank, h)}});
  w.emit(OpKind::SplitBwd, {inputs[0], inputs[1]}, {dx}, {{"dim", int64_t(0)}});
}

} // namespace parc::lower
