#include "parc/Cost/MemoryModel.h"
#include "parc/Cost/CostModel.h"
#include <gtest/gtest.h>

using namespace parc;

namespace {

ModelSpec gptModel(int64_t hidden, int64_t heads, int64_t blocks, int64_t vocab, int64_t seq,
                   bool tied) {
  ModelSpec m;
  m.name = "gpt";
  m.dtype = DType::BF16;
  m.vocab = vocab;
  m.seq = seq;
  m.hidden = hidden;
  m.heads = m.kvHeads = heads;
  m.ffn = 4 * hidden;
  LayerGroup embed;
  embed.kind = LayerGroup::Embedding;
  embed.name = "embed";
  LayerGroup block;
  block.kind = LayerGroup::Transformer;
  block.name = "block";
  block.count = blocks;
  block.heads = block.kvHeads = heads;
  block.ffn = 4 * hidden;
  LayerGroup head;
  head.kind = LayerGroup::LMHead;
  head.name = "head";
  if (tied)
    head.tiedTo = "embed";
  m.layers = {embed, block, head};
  return m;
}

ModelSpec llama70b() {
  ModelSpec m = gptModel(8192, 64, 80, 32000, 4096, false);
  m.kvHeads = m.layers[1].kvHeads = 8;
  m.ffn = m.layers[1].ffn = 28672;
  m.norm = Norm::RMSNorm;
  m.bias = LinearBias::None;
  m.mlp = m.layers[1].mlp = MLPKind::SwiGLU;
  m.position = Position::RoPE;
  return m;
}

/// Blocks split evenly over pp * chunks virtual stages, as checkMapping builds it.
Mapping evenMapping(const Program &p, int64_t chunks = 1) {
  const ParallelSpec &par = p.parallel;
  Mapping m;
  m.tp = par.tp;
  m.pp = par.pp;
  m.dp = par.dp;
  m.chunks = chunks;
  m.microBatch = par.microBatch;
  m.globalBatch = par.globalBatch;
  m.microbatches = par.globalBatch / (par.microBatch * par.dp);
  int64_t multiple = 128 * par.tp;
  m.paddedVocab = (p.model.vocab + multiple - 1) / multiple * multiple;
  m.layout = RankLayout(par.tp, par.pp, par.dp, par.order, p.cluster.gpusPerNode);
  m.partition.pp = par.pp;
  m.partition.chunks = chunks;
  int64_t per = p.model.numBlocks() / (par.pp * chunks);
  for (int64_t v = 0; v < par.pp * chunks; ++v)
    m.partition.blocks.push_back({v * per, (v + 1) * per});
  return m;
}

Program program(ModelSpec model, int64_t tp, int64_t pp, int64_t dp) {
  Program p;
  p.model = std::move(model);
  p.cluster.nodes = tp * pp * dp / 8 > 0 ? tp * pp * dp / 8 : 1;
  p.cluster.gpusPerNode = 8;
  p.cluster.gpuMemory = int64_t(80) << 30;
  p.cluster.gpuFlops = 312e12;
  p.cluster.gpuReserve = int64_t(1) << 30;
  p.cluster.intraNode = {300e9, 1e-6};
  p.cluster.interNode = {25e9, 5e-6};
  p.parallel.tp = tp;
  p.parallel.pp = pp;
  p.parallel.dp = dp;
  p.parallel.globalBatch = 64 * dp;
  return p;
}

} // namespace

TEST(MemoryModel, GPTBlockHasTwelveHSquaredPlusThirteenH) {
  ModelSpec m = gptModel(12288, 96, 96, 51200, 2048, true);
  int64_t h = 12288;
  ParamCount block = blockParams(m, m.layers[1]);
  EXPECT_EQ(block.total(), 12 * h * h + 13 * h);
  // Row-parallel biases (2h) and both LayerNorms (4h) are whole on every tp rank.
  EXPECT_EQ(block.replicated, 6 * h);
  EXPECT_EQ(block.perRank(8), (12 * h * h + 7 * h) / 8 + 6 * h);
}

TEST(MemoryModel, GPT3Has175BParameters) {
  ModelSpec m = gptModel(12288, 96, 96, 51200, 2048, true);
  int64_t n = totalParams(m, 51200);
  EXPECT_NEAR(double(n) / 1e9, 174.6, 0.05);
}

TEST(MemoryModel, Llama2With70BMatchesTheReleasedCheckpoint) {
  // 68,976,648,192 parameters in the released Llama-2-70B (no biases, RMSNorm, untied head).
  EXPECT_EQ(totalParams(llama70b(), 32000), 68976648192);
  EXPECT_FALSE(hasLinearBiases(llama70b()));
}

TEST(MemoryModel, QKVBiasHeadDimAndPositionTableCount) {
  // Qwen2-0.5B: biases on q, k and v only, a tied head; 494,032,768 parameters as
  // transformers counts them.
  ModelSpec qwen = llama70b();
  qwen.hidden = 896;
  qwen.heads = qwen.layers[1].heads = 14;
  qwen.kvHeads = qwen.layers[1].kvHeads = 2;
  qwen.ffn = qwen.layers[1].ffn = 4864;
  qwen.layers[1].count = 24;
  qwen.layers.back().tiedTo = "embed";
  qwen.bias = LinearBias::QKV;
  EXPECT_EQ(totalParams(qwen, 151936), 494032768);
  // A head wider than hidden / heads (Gemma-7B: 16 heads of 256 on hidden 3072) widens q, k, v
  // and the output projection.
  ModelSpec wide = qwen;
  wide.bias = LinearBias::None;
  wide.hidden = 3072;
  wide.heads = wide.kvHeads = wide.layers[1].heads = wide.layers[1].kvHeads = 16;
  wide.headDim = 256;
  EXPECT_EQ(headDim(wide, wide.layers[1]), 256);
  EXPECT_EQ(blockParams(wide, wide.layers[1]).sharded,
            3072 * 4096 * 2 + 3 * 3072 * int64_t(4864));
  // GPT-2: 1024 learned positions whatever the sequence trained on.
  ModelSpec gpt2 = gptModel(768, 12, 12, 50257, 512, true);
  gpt2.maxPositions = 1024;
  EXPECT_EQ(totalParams(gpt2, 50257), 124439808);
}

TEST(MemoryModel, KeyValueHeadsFewerThanTPRanksAreWholeOnEachRank) {
  ModelSpec m = llama70b(); // 64 query heads, 8 key/value heads of 128
  ParamCount block = blockParams(m, m.layers[1]);
  const int64_t h = 8192, d = 128;
  EXPECT_EQ(block.keyValue, 2 * h * 8 * d);
  // tp 4: two key/value heads a rank; tp 8: one; tp 16 and 64: still one whole head, which the
  // plans replicate over 2 and 8 ranks, not a fraction of one.
  EXPECT_EQ(block.perRank(4) - block.sharded / 4 - block.replicated, 2 * h * 2 * d);
  for (int64_t tp : {8, 16, 64})
    EXPECT_EQ(block.perRank(tp) - block.sharded / tp - block.replicated, 2 * h * d) << tp;
}

TEST(MemoryModel, BytesPerParameter) {
  Program p = program(gptModel(1024, 16, 4, 1024, 128, true), 1, 1, 1);
  EXPECT_DOUBLE_EQ(stateBytesPerParam(p).total(), 18); // bf16 + fp32 grads + 12 (Megatron)
  p.train.gradDtype = DType::BF16;
  EXPECT_DOUBLE_EQ(stateBytesPerParam(p).total(), 16); // the ZeRO paper's 2 + 2 + 12
  p.model.dtype = DType::FP32;
  p.train.gradDtype = DType::FP32;
  EXPECT_DOUBLE_EQ(stateBytesPerParam(p).total(), 16); // 4 + 4 + two moments
  p.model.dtype = DType::BF16;
  p.train.optimizer = Optimizer::SGD;
  EXPECT_DOUBLE_EQ(stateBytesPerParam(p).optimizer, 4); // master copy only
  p.train.momentum = 0.9;
  EXPECT_DOUBLE_EQ(stateBytesPerParam(p).optimizer, 8); // plus the momentum buffer
}

TEST(MemoryModel, ActivationsFollowKorthikantiTable2) {
  // Their setting: standard attention with dropout, 16-bit activations.
  ModelSpec m = gptModel(12288, 96, 96, 51200, 2048, true);
  m.attention = Attention::Standard;
  m.dropout = 0.1;
  const LayerGroup &block = m.layers[1];
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 1, Recompute::None, false),
                   sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::None, false),
                   sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::None, true),
                   sbh / t * (34 + 5 * a * s / h));
  // parc's selective recompute also rebuilds the attention's output (2sbh/t of their 24sbh/t),
  // and full recompute keeps the sequence-parallel slice of the block input.
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::Selective, false),
                   sbh * (10 + 22 / t));
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::Selective, true), sbh * 32 / t);
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::Full, false), 2 * sbh);
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::Full, true), 2 * sbh / t);
  // Linear in the microbatch size.
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 4, 8, Recompute::Selective, true),
                   4 * sbh * 32 / t);
}

TEST(MemoryModel, FlashAttentionKeepsOnlyTheRowLogsumexp) {
  // Without dropout no masks; FlashAttention keeps an fp32 logsumexp per row and head instead
  // of the 2as^2b probabilities.
  ModelSpec m = gptModel(12288, 96, 96, 51200, 2048, true);
  const LayerGroup &block = m.layers[1];
  const double s = 2048, h = 12288, a = 96, t = 8, sbh = s * h;
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 1, Recompute::None, false),
                   sbh * 32 + 4 * a * s);
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 8, Recompute::None, true),
                   sbh / t * 32 + 4 * a * s / t);
  m.attention = Attention::Standard;
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, block, 1, 1, Recompute::None, false),
                   sbh * 32 + 2 * a * s * s);
}

TEST(MemoryModel, GroupedQueryAttentionAndSwiGLUActivations) {
  ModelSpec m = llama70b();
  const double s = 4096, h = 8192, kv = 1024, f = 28672;
  // Norm and block inputs 8sbh, Q 2sbh (selective recompute rebuilds the attention's output),
  // K and V 4 s kv, SwiGLU gate, up and product 6 s f; all split with sequence parallelism.
  EXPECT_DOUBLE_EQ(blockActivationBytes(m, m.layers[1], 1, 8, Recompute::Selective, true),
                   s * (10 * h + 4 * kv + 6 * f) / 8);
}

TEST(MemoryModel, MicrobatchesInFlight) {
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::GPipe, 4, 0, 8, 1), std::vector<int64_t>{8});
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::OneFOneB, 4, 0, 8, 1), std::vector<int64_t>{4});
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::OneFOneB, 4, 3, 8, 1), std::vector<int64_t>{1});
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::OneFOneB, 4, 0, 2, 1), std::vector<int64_t>{2});
  // Megatron's warm-up on stage 0: 2 (pp - 1) + (chunks - 1) pp = 10 forwards, plus one.
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::Interleaved, 4, 0, 8, 2),
            (std::vector<int64_t>{7, 4}));
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::Interleaved, 4, 3, 8, 2),
            (std::vector<int64_t>{4, 1}));
  // With M == pp Megatron runs every forward first.
  EXPECT_EQ(microbatchesInFlight(ScheduleKind::Interleaved, 4, 3, 4, 2),
            (std::vector<int64_t>{4, 4}));
}

TEST(MemoryModel, MicrobatchesInFlightCountsMegatronsChunkOfEveryForward) {
  // Forward k of the warm-up runs chunk (k mod (pp x chunks)) / pp (get_model_chunk_id).
  for (int64_t pp : {2, 3, 4, 8})
    for (int64_t chunks : {2, 3, 4})
      for (int64_t microbatches : {pp, 2 * pp, 3 * pp, 8 * pp})
        for (int64_t stage = 0; stage < pp; ++stage) {
          int64_t total = microbatches * chunks;
          int64_t warmup = microbatches == pp ? total : 2 * (pp - stage - 1) + (chunks - 1) * pp;
          std::vector<int64_t> walked(size_t(chunks), 0);
          for (int64_t k = 0; k < std::min(warmup + 1, total); ++k)
            ++walked[size_t(k % (pp * chunks) / pp)];
          EXPECT_EQ(microbatchesInFlight(ScheduleKind::Interleaved, pp, stage, microbatches,
                                         chunks),
                    walked)
              << "pp " << pp << " chunks " << chunks << " M " << microbatches << " stage " << stage;
        }
}

TEST(MemoryModel, InterleavingCostsKorthikantiFactor) {
  // Stage 0 of an interleaved schedule holds 1 + (p - 1) / (p m) times the 1F1B activations.
  ModelSpec m = gptModel(4096, 32, 16, 51200, 2048, false);
  Program p = program(m, 1, 4, 1);
  p.parallel.schedule = ScheduleKind::OneFOneB;
  double oneF = estimateMemory(p, evenMapping(p)).stages[0].activations;
  p.parallel.schedule = ScheduleKind::Interleaved;
  p.parallel.chunks = 2;
  double inter = estimateMemory(p, evenMapping(p, 2)).stages[0].activations;
  double perBlock = blockActivationBytes(m, m.layers[1], 1, 1, Recompute::None, false);
  // Beside the blocks: the token ids per microbatch and the first backward's buffers; the
  // interleaved schedule also meets one more output waiting for its send (and its ids).
  double ids = 8 * 2048.0, transient =
      blockBackwardTransientBytes(m, m.layers[1], 1, 1, Recompute::None, false);
  double pending = 2 * 2048.0 * 4096 + ids;
  EXPECT_DOUBLE_EQ(oneF - 4 * ids - transient, 4 * 4 * perBlock);
  EXPECT_DOUBLE_EQ(inter - 7 * ids - transient - pending, 4 * 4 * perBlock * (1 + 3.0 / 8));
}

TEST(MemoryModel, ZeROPaperModelStates) {
  // Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, 16 bytes per parameter.
  ModelSpec m = gptModel(4096, 32, 36, 59392, 1024, true);
  Program p = program(m, 1, 1, 64);
  p.train.gradDtype = DType::BF16;
  Mapping mapping = evenMapping(p);
  const double psi = double(totalParams(m, mapping.paddedVocab));
  EXPECT_NEAR(psi / 1e9, 7.5, 0.005);
  const double expected[] = {16 * psi, 4 * psi + 12 * psi / 64, 2 * psi + 14 * psi / 64,
                             16 * psi / 64};
  const double paperGB[] = {120, 31.4, 16.6, 1.9};
  for (int zero = 0; zero <= 3; ++zero) {
    p.parallel.zero = zero;
    StageMemory s = estimateMemory(p, mapping).stages[0];
    EXPECT_DOUBLE_EQ(s.modelStates(), expected[zero]) << "zero " << zero;
    EXPECT_NEAR(s.modelStates() / 1e9, paperGB[zero], 0.05) << "zero " << zero;
    EXPECT_EQ(s.gathered > 0, zero == 3);
  }
}

TEST(MemoryModel, TiedHeadCopyLivesOnTheLastStage) {
  ModelSpec tied = gptModel(1024, 16, 8, 1024, 128, true);
  Program p = program(tied, 1, 2, 1);
  Mapping mapping = evenMapping(p);
  MemoryEstimate est = estimateMemory(p, mapping);
  int64_t blocks = 4 * blockParams(tied, tied.layers[1]).total();
  EXPECT_EQ(est.stages[0].paramsPerRank, blocks + 1024 * 1024 + 128 * 1024);
  EXPECT_EQ(est.stages[1].paramsPerRank, blocks + 1024 * 1024 + 2 * 1024);
  // One stage: the head reuses the embedding's matrix.
  Program single = program(tied, 1, 1, 1);
  MemoryEstimate one = estimateMemory(single, evenMapping(single));
  EXPECT_EQ(one.stages[0].paramsPerRank, totalParams(tied, 1024));
}

TEST(MemoryModel, GPT3FitsAsNarayananPublished) {
  Program p = program(gptModel(12288, 96, 96, 51200, 2048, true), 8, 16, 8);
  p.parallel.microBatch = 1;
  p.parallel.globalBatch = 1536;
  p.parallel.schedule = ScheduleKind::Interleaved;
  p.parallel.chunks = 2;
  p.parallel.zero = 1;
  p.parallel.recompute = Recompute::Selective;
  p.parallel.sequenceParallel = true;
  MemoryEstimate est = estimateMemory(p, evenMapping(p, 2));
  EXPECT_TRUE(est.fits());
  EXPECT_EQ(est.worst().stage, 0);
  EXPECT_LT(est.maxRankBytes(), 40.0 * (int64_t(1) << 30));
}

TEST(CostModel, NarayananFlopsFormula) {
  // Without recompute the model FLOPs are 72 B s l h^2 (1 + s / 6h + V / 12 l h).
  ModelSpec m = gptModel(12288, 96, 96, 51200, 2048, true);
  Program p = program(m, 8, 16, 8);
  p.parallel.globalBatch = 1536;
  Mapping mapping = evenMapping(p);
  CostEstimate cost = estimateCost(p, mapping);
  const double B = 1536, s = 2048, l = 96, h = 12288, V = 51200;
  double expected = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(cost.modelFlops / expected, 1.0, 1e-12);
  // Full recompute adds one forward of the blocks: Narayanan's 96 B s l h^2 (...).
  p.parallel.recompute = Recompute::Full;
  cost = estimateCost(p, mapping);
  double withRecompute = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(cost.hardwareFlops / withRecompute, 1.0, 1e-12);
  EXPECT_GT(cost.mfu, 0.0);
  EXPECT_LT(cost.mfu, 1.0);
}

TEST(CostModel, DataParallelVolumeByZeROStage) {
  // The ZeRO paper, section 7: stages 1 and 2 move what an all-reduce moves (2 psi); stage 3
  // moves 1.5 times as much (one microbatch per step).
  ModelSpec m = gptModel(1024, 16, 8, 1024, 128, true);
  Program p = program(m, 1, 1, 64);
  p.parallel.globalBatch = 64;
  p.train.gradDtype = DType::BF16;
  Mapping mapping = evenMapping(p);
  auto dpBytes = [&](int zero) {
    p.parallel.zero = zero;
    for (const GroupTraffic &g : estimateCost(p, mapping).traffic)
      if (g.kind == "dp")
        return g.bytesPerRank;
    return -1.0;
  };
  double base = dpBytes(0);
  EXPECT_DOUBLE_EQ(dpBytes(1), base);
  EXPECT_DOUBLE_EQ(dpBytes(2), base);
  EXPECT_DOUBLE_EQ(dpBytes(3), 1.5 * base);
}

TEST(ZeroPolicy, BucketsAreWholeUnitsWithTheEmbeddingAlone) {
  ParallelSpec parallel;
  parallel.zero = 2;
  parallel.bucketSize = 100;
  ZeroPolicy policy = zeroPolicy(parallel, 4);
  EXPECT_TRUE(policy.shardsGrads());
  EXPECT_FALSE(policy.shardsWeights());
  EXPECT_EQ(policy.gradReduction(), GradReduction::ReduceScatterPerMicrobatch);
  using K = ParamUnitKind;
  // Backward order: head, final norm, blocks 2, 1, 0 (their MLPs, say), positions, word
  // embedding.
  std::vector<ParamUnit> units = {{K::Head, -1, 500}, {K::FinalNorm, -1, 10},
                                  {K::MLP, 2, 60},  {K::MLP, 1, 60},
                                  {K::MLP, 0, 60},  {K::PositionEmbedding, -1, 7},
                                  {K::WordEmbedding, -1, 500}};
  std::vector<ZeroBucket> buckets = policy.buckets(units);
  // The head alone; norm + block 2 + block 1 reach 100; block 0 and the positions; the word
  // embedding alone. Each padded to a multiple of dp = 4.
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].elements, 500);
  EXPECT_EQ(buckets[1].elements, 130);
  EXPECT_EQ(buckets[1].perMember, 33);
  EXPECT_EQ(buckets[1].padded(4), 132);
  EXPECT_EQ(buckets[2].elements, 67);
  EXPECT_EQ(buckets[3].elements, 500);
  EXPECT_EQ(buckets[3].first, 6u);
  // Nothing to partition with one data-parallel rank.
  EXPECT_TRUE(zeroPolicy(parallel, 1).buckets(units).empty());
  parallel.zero = 1;
  EXPECT_EQ(zeroPolicy(parallel, 4).gradReduction(), GradReduction::ReduceScatterPerStep);
  parallel.zero = 3;
  EXPECT_TRUE(zeroPolicy(parallel, 4).gathersWeightsAroundUse());
  EXPECT_FALSE(zeroPolicy(parallel, 4).gathersWeightsAfterStep());
}

TEST(ZeroPolicy, ZeroThreeGathersABucketForEachRunOfReads) {
  ParallelSpec parallel;
  parallel.zero = 3;
  parallel.bucketSize = 1; // every unit a bucket
  ZeroPolicy policy = zeroPolicy(parallel, 4);
  using K = ParamUnitKind;
  // Two blocks and a tied head on the embedding's chunk, in backward order.
  std::vector<ParamUnit> units = {{K::MLP, 1, 80},       {K::Attention, 1, 40},
                                  {K::MLP, 0, 80},       {K::Attention, 0, 40},
                                  {K::PositionEmbedding, -1, 8}, {K::WordEmbedding, -1, 100}};
  // Forward: word, positions, attention 0, MLP 0, attention 1, MLP 1, and the word embedding
  // again for the head.
  const ModelSpec model; // read only for MoE blocks
  auto gathers = [&](const ZeroPolicy &p, bool fullRecompute) {
    return gathersAroundUse(model, {p, units, p, {}, true, /*tiedHead=*/true}, fullRecompute);
  };
  ChunkGathers chunk = gathers(policy, /*fullRecompute=*/false);
  ZeroGathers g = chunk.dense;
  EXPECT_EQ(g.forward.collectives, 7);
  EXPECT_EQ(g.forward.elements, 100 + 8 + 40 + 80 + 40 + 80 + 100);
  EXPECT_EQ(chunk.peak, 100); // one bucket at a time: the word embedding is the largest
  // Backward: the head's word embedding, then MLP 1, attention 1, MLP 0, attention 0; the
  // embeddings' backward reads no weight.
  EXPECT_EQ(g.backward.collectives, 5);
  EXPECT_EQ(g.backward.elements, 100 + 240);
  // A full recompute reads each block forward first: word | A1 M1 M1 A1 | A0 M0 M0 A0. Each MLP
  // is read twice in a row (one gather), each attention twice with the MLP between.
  g = gathers(policy, /*fullRecompute=*/true).dense;
  EXPECT_EQ(g.backward.collectives, 7);
  EXPECT_EQ(g.backward.elements, 100 + 2 * (40 + 80 + 40));
  // One bucket for the blocks and positions: a run never ends inside it.
  parallel.bucketSize = 1000;
  chunk = gathers(zeroPolicy(parallel, 4), true);
  g = chunk.dense;
  EXPECT_EQ(chunk.peak, 248);
  EXPECT_EQ(g.forward.collectives, 3);
  EXPECT_EQ(g.forward.elements, 100 + 248 + 100);
  EXPECT_EQ(g.backward.collectives, 2);
  EXPECT_EQ(g.backward.elements, 100 + 248);
  // Zero 2 and 3 hold a gradient bucket whole from its first write to its last: a tied head
  // writes the word embedding's first and the embedding's backward last, so it stays whole
  // beside each other bucket (the largest, an MLP); untied, it is written once, at the end.
  parallel.bucketSize = 1;
  ZeroPolicy each = zeroPolicy(parallel, 4);
  EXPECT_EQ(gradientPeak(model, {each, units, each, {}, true, /*tiedHead=*/true}), 100 + 80);
  EXPECT_EQ(gradientPeak(model, {each, units, each, {}, true, /*tiedHead=*/false}), 100);
  // Without ZeRO 3 nothing is gathered around use.
  parallel.zero = 2;
  EXPECT_EQ(gathers(zeroPolicy(parallel, 4), true).dense.forward.collectives, 0);
}

namespace {
/// Mixtral 8x7B: Mistral 7B's blocks with 8 SwiGLU experts of 14336 columns, 2 per token.
ModelSpec mixtral() {
  ModelSpec m = llama70b();
  m.hidden = 4096;
  m.heads = 32;
  LayerGroup &block = m.layers[1];
  block.count = 32;
  block.heads = 32;
  block.kvHeads = m.kvHeads = 8;
  block.ffn = m.ffn = 14336;
  block.moe.experts = 8;
  block.moe.topK = 2;
  block.moe.ffn = 14336;
  return m;
}
} // namespace

TEST(MemoryModel, MixtralCountsAsHuggingFace) {
  ModelSpec m = mixtral();
  // transformers' count of MixtralForCausalLM (scripts/interop/hf_count.py).
  EXPECT_EQ(totalParams(m, 32000), 46702792704);
  // Two of the eight experts: 32 x 6 x 4096 x 14336 parameters fewer.
  EXPECT_EQ(activeParams(m, 32000), 46702792704 - 32 * int64_t(6) * 3 * 4096 * 14336);
  ParamCount block = blockParams(m, m.layers[1]);
  EXPECT_EQ(block.expert, 8 * int64_t(3) * 4096 * 14336);
  EXPECT_EQ(block.replicated, 8 * 4096 + 2 * 4096); // the router and two RMSNorms
  // ep 4 and tp 2: two whole experts per rank, each halved.
  EXPECT_EQ(block.expertPerRank(2, 4), 2 * int64_t(3) * 4096 * 14336 / 2);
  EXPECT_EQ(block.perRank(2, 4), block.densePerRank(2) + block.expertPerRank(2, 4));
}

TEST(MemoryModel, ExpertRowsBalancedAndDroplessBound) {
  MoESpec moe;
  moe.experts = 8;
  moe.topK = 2;
  // 4096 tokens: 8192 rows balanced whatever ep; dropless, at ep 8 every token of the 8 ranks
  // may pick this rank's one expert (once), at ep 2 both of a token's picks may land here.
  EXPECT_EQ(expertRows(moe, 4096, 8).expected, 8192);
  EXPECT_EQ(expertRows(moe, 4096, 8).bound, 8 * 4096);
  EXPECT_EQ(expertRows(moe, 4096, 2).bound, 2 * 4096 * 2);
  // A capacity factor of 1.25 keeps ceil(1.25 x 4096 x 2 / 8) = 1280 rows per expert.
  moe.capacity = 1.25;
  EXPECT_EQ(expertRows(moe, 4096, 8).bound, 8 * 1280);
}

TEST(MemoryModel, ExpertStatesShardOverExpertDataParallel) {
  ModelSpec m = gptModel(256, 4, 4, 1024, 64, false);
  m.layers[1].moe.experts = 8;
  m.layers[1].moe.topK = 2;
  m.layers[1].moe.ffn = 512;
  Program p = program(m, 1, 1, 8);
  p.parallel.zero = 1;
  p.parallel.bucketSize = int64_t(1) << 40; // one bucket per family
  Mapping mapping = evenMapping(p);
  const StateBytesPerParam perParam = stateBytesPerParam(p);
  const ParamCount block = blockParams(m, m.layers[1]);
  const int64_t denseParams = totalParams(m, 1024) - 4 * block.expert;
  for (int64_t ep : {1, 2, 8}) {
    mapping.ep = ep;
    mapping.layout = RankLayout(1, 1, 8, p.parallel.order, p.cluster.gpusPerNode, 1, ep);
    p.parallel.ep = ep;
    StageMemory s = estimateMemory(p, mapping).stages[0];
    const int64_t experts = 4 * block.expert / ep, edp = 8 / ep;
    EXPECT_EQ(s.expertParamsPerRank, experts) << "ep " << ep;
    EXPECT_EQ(s.paramsPerRank, denseParams + experts) << "ep " << ep;
    // Dense states shard over dp 8, the experts' over the dp / ep ranks holding them.
    double owned = double((denseParams + 7) / 8) + double((experts + edp - 1) / edp);
    EXPECT_DOUBLE_EQ(s.optimizer, owned * perParam.optimizer) << "ep " << ep;
  }
}

TEST(MemoryModel, ExpertBackwardAtTheDroplessBound) {
  // Mixtral's blocks at ep 8: 2 x seq rows balanced, 8 x seq at most. What the extra rows
  // add in the backward is its widest expert moment per row: SwiGLU's gate and up gradients
  // (2 ffn), which come after the rows' gradient (h) and the activated rows have died; the
  // down projection's input gradient beside the rows' gradient (ffn + h) for a GELU expert.
  ModelSpec m = mixtral();
  const LayerGroup &block = m.layers[1];
  const double e = double(bytesPerElement(m.dtype)), extraRows = 6.0 * double(m.seq);
  const double h = 4096, ffn = 14336;
  const ExpertLoad worst{true, 8};
  auto extra = [&](const LayerGroup &b) {
    return std::make_pair(
        blockActivationBytes(m, b, 1, 1, Recompute::None, false, false, worst) -
            blockActivationBytes(m, b, 1, 1, Recompute::None, false),
        blockBackwardTransientBytes(m, b, 1, 1, Recompute::None, false, false, worst) -
            blockBackwardTransientBytes(m, b, 1, 1, Recompute::None, false));
  };
  auto [kept, transient] = extra(block);
  EXPECT_DOUBLE_EQ(kept, e * extraRows * (h + 3 * ffn)); // the rows, gate, up, activated
  EXPECT_DOUBLE_EQ(transient, e * extraRows * 2 * ffn);
  LayerGroup gelu = block;
  gelu.mlp = MLPKind::GELU;
  std::tie(kept, transient) = extra(gelu);
  EXPECT_DOUBLE_EQ(kept, e * extraRows * (h + 2 * ffn)); // the rows, up, activated
  EXPECT_DOUBLE_EQ(transient, e * extraRows * (ffn + h));
}
