//===- ParamLowering.cpp - The parameter shards of each rank --------------===//
//
// Also the job facts (Job, BlockDims) that every lowering file reads.
//
// Megatron-LM's tensor-parallel layouts, with weights stored [out, in]:
//  * attention: separate q, k and v projections, column-parallel by whole heads. Each tp rank
//    holds heads / tp query heads and kv_heads / tp key/value heads. When kv_heads < tp, the
//    tp / kv_heads ranks whose query heads share a key/value head each hold a copy of it
//    (same slice of k and v); the op lists sum their gradient contributions (ChunkLowering).
//    Separate tensors keep every shard a contiguous slice whose global layout does not
//    depend on tp, so shards initialise exactly as in an unsharded run.
//  * the MLP's first projection is column-parallel; SwiGLU has two of them, gate and up, kept
//    as separate tensors rather than Megatron's fused [2 * ffn, hidden] whose global row
//    order depends on tp: separate, each shard is a contiguous slice of a tp-independent
//    tensor, so every mapping initialises to the single-rank weights.
//  * output projections (attention out, MLP down) are row-parallel; their biases are
//    replicated and added after the tp reduction.
//  * word embedding and an untied head are vocab-parallel over the padded vocab; norms and the
//    learned position embedding are replicated.
// Linear layers have biases as model.bias says (MemoryModel's hasLinearBiases and hasQKVBias),
// so the shards add up to the memory model's parameter counts.
//
//===----------------------------------------------------------------------===//
#include "LowerInternal.h"

#include "parc/Cost/MemoryModel.h"

#include <cmath>

namespace parc::lower {

plan::DType toPlan(DType dtype) {
  switch (dtype) {
  case DType::FP32:
    return plan::DType::FP32;
  case DType::BF16:
    return plan::DType::BF16;
  case DType::FP16:
    return plan::DType::FP16;
  }
  return plan::DType::FP32;
}

plan::Group toPlan(Axis axis) {
  return axis == Axis::TP   ? plan::Group::TP
         : axis == Axis::PP ? plan::Group::PP
         : axis == Axis::CP ? plan::Group::CP
                            : plan::Group::DP;
}

Job::Job(const Program &program, const Mapping &mapping)
    : program(program), mapping(mapping), tp(mapping.tp), pp(mapping.pp), dp(mapping.dp),
      cp(mapping.cp), layers(program.model.numBlocks()), seq(program.model.seq / mapping.cp),
      fullSeq(program.model.seq), microBatch(mapping.microBatch),
      hidden(program.model.hidden), paddedVocab(mapping.paddedVocab),
      sequenceParallel(program.parallel.sequenceParallel), biases(hasLinearBiases(program.model)),
      qkvBias(hasQKVBias(program.model)), tiedHead(program.model.tiedHead()),
      recompute(program.parallel.recompute),
      dtype(toPlan(program.model.dtype)), gradDtype(toPlan(program.train.gradDtype)),
      gradGroup(mapping.cp > 1 ? plan::Group::DPCP : plan::Group::DP),
      gradRanks(mapping.gradientRanks()), ep(mapping.ep) {
  pipeline.kind = program.parallel.schedule;
  pipeline.stages = mapping.pp;
  pipeline.microbatches = mapping.microbatches;
  pipeline.chunks = mapping.chunks;
}

std::string Job::outputOf(int64_t v) const {
  // The feasibility rules give every virtual stage at least one block.
  return blockName(blocksOf(v).second - 1, "out");
}

BlockDims::BlockDims(const Job &job, int64_t block, int64_t tpRank) {
  const LayerGroup &group = job.program.model.blockGroup(block);
  heads = group.heads;
  kvHeads = group.kvHeads;
  headDim = parc::headDim(job.program.model, group);
  ffn = group.ffn;
  mlp = group.mlp;
  moe = group.moe;
  localHeads = heads / job.tp;
  localFfn = ffn / job.tp;
  kvReplicas = kvHeads < job.tp ? job.tp / kvHeads : 1;
  localKvHeads = kvHeads < job.tp ? 1 : kvHeads / job.tp;
  firstKvHead = kvHeads < job.tp ? tpRank / kvReplicas : tpRank * localKvHeads;
}

std::string blockName(int64_t block, llvm::StringRef leaf) {
  return "block." + std::to_string(block) + "." + leaf.str();
}

namespace {

/// Builds shards with the model dtype; each helper names how the tensor is split.
class ShardBuilder {
public:
  ShardBuilder(const Job &job, int64_t tpRank, std::vector<plan::ParamShard> &out)
      : job(job), tpRank(tpRank), out(out) {}

  void replicated(std::string name, std::vector<int64_t> shape, plan::Init init) {
    // Every tp rank holds the same tensor; only the first counts it in the gradient norm.
    add(std::move(name), std::move(shape), plan::ShardKind::Replicated, -1, {}, init, tpRank == 0);
  }
  /// Split along the output features (column: dim 0, dim 1 of stacked experts [experts, out,
  /// in]) or the last dim (row): this rank holds [offset, offset+size).
  void split(std::string name, std::vector<int64_t> shape, plan::ShardKind kind, int64_t offset,
             int64_t size, plan::Init init, bool countsInGradNorm = true) {
    int64_t rank = int64_t(shape.size());
    int64_t dim = kind == plan::ShardKind::Row ? rank - 1 : std::max<int64_t>(0, rank - 2);
    add(std::move(name), std::move(shape), kind, dim, {offset, size}, init, countsInGradNorm);
  }

  /// Stacked experts [experts, out, in] split over tp as `kind` says and over ep along dim 0:
  /// the experts / ep of ep rank 0 (placeOnExpertRank moves them to the rank's own).
  void experts(std::string name, std::vector<int64_t> shape, plan::ShardKind kind,
               int64_t offset, int64_t size, plan::Init init) {
    int64_t local = shape[0] / job.ep;
    split(std::move(name), std::move(shape), kind, offset, size, init);
    out.back().slice[0] = {0, local};
  }

  /// The weight (and, with LayerNorm, the bias) of a norm over `hidden` features.
  void norm(const std::string &prefix) {
    replicated(prefix + ".weight", {job.hidden}, ones());
    if (job.program.model.norm == Norm::LayerNorm)
      replicated(prefix + ".bias", {job.hidden}, zeros());
  }

  /// A column-parallel linear layer [rows, in] whose rows [offset, offset + size) are here.
  void column(const std::string &prefix, int64_t rows, int64_t in, int64_t offset, int64_t size,
              bool bias, bool countsInGradNorm = true) {
    split(prefix + ".weight", {rows, in}, plan::ShardKind::Column, offset, size, normal(InitStd),
          countsInGradNorm);
    if (bias)
      split(prefix + ".bias", {rows}, plan::ShardKind::Column, offset, size, zeros(),
            countsInGradNorm);
  }

  /// A row-parallel output projection [out, in] over input columns [offset, offset + size).
  void row(const std::string &prefix, int64_t out, int64_t in, int64_t offset, int64_t size) {
    double scaledStd = InitStd / std::sqrt(2.0 * double(job.layers));
    split(prefix + ".weight", {out, in}, plan::ShardKind::Row, offset, size, normal(scaledStd));
    if (job.biases)
      replicated(prefix + ".bias", {out}, zeros());
  }

  static plan::Init normal(double std) { return {plan::InitKind::Normal, std}; }
  static plan::Init ones() { return {plan::InitKind::Ones, 0}; }
  static plan::Init zeros() { return {plan::InitKind::Zeros, 0}; }

private:
  void add(std::string name, std::vector<int64_t> shape, plan::ShardKind kind, int64_t splitDim,
           plan::Slice part, plan::Init init, bool countsInGradNorm) {
    plan::ParamShard shard;
    shard.name = std::move(name);
    for (int64_t d = 0; d < int64_t(shape.size()); ++d)
      shard.slice.push_back(d == splitDim ? part : plan::Slice{0, shape[d]});
    shard.shape = std::move(shape);
    shard.dtype = job.dtype;
    shard.kind = kind;
    shard.init = init;
    shard.countsInGradNorm = countsInGradNorm;
    out.push_back(std::move(shard));
  }

  const Job &job;
  int64_t tpRank;
  std::vector<plan::ParamShard> &out;
};

/// The rows past the vocabulary (Megatron's padding to 128 x tp) start at zero; the loss
/// leaves their logits out, so they get no gradient and the model does not depend on tp.
plan::Init vocabInit(const Job &job) {
  plan::Init init = ShardBuilder::normal(InitStd);
  if (job.program.model.vocab < job.paddedVocab)
    init.rows = job.program.model.vocab;
  return init;
}

void addWordEmbedding(const Job &job, int64_t tpRank, bool countsInGradNorm,
                      std::vector<plan::ParamShard> &out) {
  int64_t rows = job.paddedVocab / job.tp;
  ShardBuilder(job, tpRank, out)
      .split(WordEmbedding.str(), {job.paddedVocab, job.hidden}, plan::ShardKind::Vocab,
             tpRank * rows, rows, vocabInit(job), countsInGradNorm);
}

/// A MoE block's MLP (MemoryModel's blockParams): the router [experts, hidden] without a
/// bias, replicated (every tp rank routes the whole sequence alike), the shared experts as a
/// dense MLP of shared_experts x moe_ffn columns, then the experts stacked [experts, out, in]
/// without biases, last so that they form a ZeRO unit of their own. Expert tensor parallelism
/// is tp: gate and up are column-parallel over moe_ffn, down row-parallel; expert
/// parallelism splits the stacked experts along dim 0.
void addMoEParams(const Job &job, int64_t block, const BlockDims &dims, int64_t tpRank,
                  ShardBuilder &shards) {
  const int64_t h = job.hidden, e = dims.moe.experts, f = dims.moe.ffn, lf = f / job.tp;
  shards.replicated(blockName(block, "moe.router.weight"), {e, h}, ShardBuilder::normal(InitStd));
  if (int64_t shared = dims.moe.sharedFfn()) {
    int64_t local = shared / job.tp;
    if (isGated(dims.mlp))
      shards.column(blockName(block, "moe.shared.gate"), shared, h, tpRank * local, local,
                    job.biases);
    shards.column(blockName(block, "moe.shared.up"), shared, h, tpRank * local, local,
                  job.biases);
    shards.row(blockName(block, "moe.shared.down"), h, shared, tpRank * local, local);
  }
  auto experts = [&](llvm::StringRef leaf, std::vector<int64_t> shape, plan::ShardKind kind,
                     double std) {
    shards.experts(blockName(block, "moe.experts." + leaf.str() + ".weight"), std::move(shape),
                   kind, tpRank * lf, lf, ShardBuilder::normal(std));
  };
  if (isGated(dims.mlp))
    experts("gate", {e, f, h}, plan::ShardKind::Column, InitStd);
  experts("up", {e, f, h}, plan::ShardKind::Column, InitStd);
  experts("down", {e, h, f}, plan::ShardKind::Row, InitStd / std::sqrt(2.0 * double(job.layers)));
}

} // namespace

void addEmbeddingParams(const Job &job, int64_t tpRank, std::vector<plan::ParamShard> &out) {
  addWordEmbedding(job, tpRank, /*countsInGradNorm=*/true, out);
  if (job.program.model.position == Position::Learned)
    ShardBuilder(job, tpRank, out)
        .replicated(PositionEmbedding.str(), {job.program.model.positions(), job.hidden},
                    ShardBuilder::normal(InitStd));
}

void addBlockParams(const Job &job, int64_t block, int64_t tpRank,
                    std::vector<plan::ParamShard> &out) {
  BlockDims dims(job, block, tpRank);
  ShardBuilder shards(job, tpRank, out);
  int64_t d = dims.headDim, h = job.hidden;
  shards.norm(blockName(block, "ln1"));
  shards.column(blockName(block, "attn.q"), dims.heads * d, h, tpRank * dims.localHeads * d,
                dims.localHeads * d, job.qkvBias);
  // A key/value head held by several tp ranks enters the gradient norm once.
  bool kvCounts = tpRank % dims.kvReplicas == 0;
  for (llvm::StringRef kv : {"attn.k", "attn.v"})
    shards.column(blockName(block, kv), dims.kvHeads * d, h, dims.firstKvHead * d,
                  dims.localKvHeads * d, job.qkvBias, kvCounts);
  shards.row(blockName(block, "attn.proj"), h, dims.heads * d, tpRank * dims.localHeads * d,
             dims.localHeads * d);
  shards.norm(blockName(block, "ln2"));
  if (dims.moe.enabled()) {
    addMoEParams(job, block, dims, tpRank, shards);
    return;
  }
  if (isGated(dims.mlp))
    shards.column(blockName(block, "mlp.gate"), dims.ffn, h, tpRank * dims.localFfn,
                  dims.localFfn, job.biases);
  shards.column(blockName(block, "mlp.up"), dims.ffn, h, tpRank * dims.localFfn, dims.localFfn,
                job.biases);
  shards.row(blockName(block, "mlp.down"), h, dims.ffn, tpRank * dims.localFfn, dims.localFfn);
}

bool isExpertParam(llvm::StringRef name) {
  int64_t block = 0;
  return name.consume_front("block.") && !name.consumeInteger(10, block) &&
         name.startswith(".moe.experts.");
}

void placeOnExpertRank(const Job &job, int64_t epRank,
                       llvm::MutableArrayRef<plan::ParamShard> shards) {
  if (job.ep == 1)
    return;
  bool denseWhole = !zeroPolicy(job.program.parallel, job.gradRanks).partitioned();
  for (plan::ParamShard &shard : shards) {
    if (isExpertParam(shard.name))
      shard.slice[0].offset = epRank * shard.slice[0].size;
    else if (denseWhole && epRank != 0)
      shard.countsInGradNorm = false;
  }
}

void addHeadParams(const Job &job, int64_t tpRank, bool ownsEmbedding,
                   std::vector<plan::ParamShard> &out) {
  ShardBuilder(job, tpRank, out).norm("final_norm");
  if (!job.tiedHead) {
    int64_t rows = job.paddedVocab / job.tp;
    ShardBuilder(job, tpRank, out)
        .split(HeadWeight.str(), {job.paddedVocab, job.hidden}, plan::ShardKind::Vocab,
               tpRank * rows, rows, vocabInit(job));
  } else if (!ownsEmbedding) {
    // Megatron's word_embeddings copy on the last stage: same name, so it initialises like
    // the original; the embedding-group all-reduce keeps the two in step, and only the
    // original counts in the gradient norm.
    addWordEmbedding(job, tpRank, /*countsInGradNorm=*/false, out);
  }
}

} // namespace parc::lower
