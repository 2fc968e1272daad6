//===- LowerInternal.h - Pieces shared by the lowering files --------------===//
//
// Internal to compiler/Lower. The lowering builds each virtual stage once per tensor-parallel
// rank (its parameter shards and op lists depend on nothing else) and each stage's pipeline
// program once, then assembles rank plans from those pieces, so lowering every rank of a
// large job costs little more than copying.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_LOWERINTERNAL_H
#define PARC_LOWER_LOWERINTERNAL_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/ZeroPolicy.h"
#include "parc/Lower/Schedule.h"
#include "parc/Plan/Plan.h"
#include "parc/Sema/Program.h"

#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace parc::lower {

/// Megatron's init_method_std; output projections use it scaled by 1 / sqrt(2 * layers).
inline constexpr double InitStd = 0.02;

plan::DType toPlan(DType dtype);
/// The attributes of rope and rope_bwd: `offset` is the position of the first row.
inline std::map<std::string, plan::AttrValue> ropeAttrs(int64_t heads, int64_t offset,
                                                        double theta) {
  return {{"heads", heads}, {"offset", offset}, {"theta", theta}};
}
/// tp, pp, dp and cp as the plan names their groups (ep and expert_dp are groups of the
/// expert grid, no axis of the dense one).
plan::Group toPlan(Axis axis);

/// What every rank's lowering reads from the job, derived once.
struct Job {
  Job(const Program &program, const Mapping &mapping);

  const Program &program;
  const Mapping &mapping;
  PipelineConfig pipeline;
  int64_t tp, pp, dp, cp, layers;
  /// `seq` is the positions one rank holds: the whole sequence, or its two chunks of
  /// fullSeq / (2 cp) under context parallelism.
  int64_t seq, fullSeq, microBatch, hidden, paddedVocab;
  /// biases: on every linear layer; qkvBias: on the query, key and value projections.
  bool sequenceParallel, biases, qkvBias, tiedHead;
  Recompute recompute;
  plan::DType dtype, gradDtype;
  /// The group gradients are reduced over and ZeRO shards over: dp, or dp_cp with cp > 1.
  plan::Group gradGroup;
  int64_t gradRanks;
  /// Expert parallelism (MoE blocks): each ep rank holds experts / ep of every MoE block.
  int64_t ep;

  int64_t virtualStages() const { return pipeline.virtualStages(); }
  /// Sequence rows of the activations between tensor-parallel regions: split over the tp
  /// group under sequence parallelism.
  int64_t seqRows() const { return sequenceParallel ? seq / tp : seq; }
  /// Context parallelism: positions of one of the 2 x cp chunks, and where chunk `half` (0 or
  /// 1) of cp rank `cpRank` starts: chunks r and 2cp - 1 - r (Megatron-Core's load balance).
  int64_t cpChunk() const { return fullSeq / (2 * cp); }
  int64_t cpChunkStart(int64_t cpRank, int half) const {
    return plan::contextChunkStart(fullSeq, cp, cpRank, half);
  }
  /// Transformer blocks [first, last) of virtual stage `v`.
  std::pair<int64_t, int64_t> blocksOf(int64_t v) const { return mapping.partition.blocks[v]; }
  /// The activation virtual stage `v` hands to the next one.
  std::string outputOf(int64_t v) const;
};

/// The sizes of one transformer block as tensor-parallel rank `tpRank` holds it.
struct BlockDims {
  BlockDims(const Job &job, int64_t block, int64_t tpRank);

  int64_t heads, kvHeads, headDim, ffn;
  MLPKind mlp;
  MoESpec moe; // experts = 0: a dense MLP
  int64_t localHeads, localKvHeads, localFfn;
  /// tp ranks that share one key/value head when kv_heads < tp, else 1.
  int64_t kvReplicas;
  /// The first key/value head this rank holds.
  int64_t firstKvHead;

  /// Rows of the MLP's first projection: gate and up for SwiGLU.
};

/// "block.3." + leaf.
std::string blockName(int64_t block, llvm::StringRef leaf);
inline constexpr llvm::StringLiteral WordEmbedding = "embedding.word.weight";
inline constexpr llvm::StringLiteral PositionEmbedding = "embedding.position.weight";
inline constexpr llvm::StringLiteral HeadWeight = "head.weight";

/// Parameter shards in the order their chunk uses them (ParamLowering.cpp).
void addEmbeddingParams(const Job &job, int64_t tpRank, std::vector<plan::ParamShard> &out);
void addBlockParams(const Job &job, int64_t block, int64_t tpRank,
                    std::vector<plan::ParamShard> &out);
/// The final norm and the output projection; a tied head on a stage without the embedding
/// gets its own copy of the word embedding.
void addHeadParams(const Job &job, int64_t tpRank, bool ownsEmbedding,
                   std::vector<plan::ParamShard> &out);
/// Whether `name` is a MoE block's stacked experts ("block.3.moe.experts.up.weight").
bool isExpertParam(llvm::StringRef name);
/// A chunk's shards as ep rank `epRank` holds them: its experts / ep experts of every MoE
/// block (chunks are lowered as ep rank 0), and, when the dense gradients stay whole on every
/// rank (no ZeRO partition), the dense shards enter the gradient norm on ep rank 0 only, so
/// that the norm's sum over the ep group counts them once.
void placeOnExpertRank(const Job &job, int64_t epRank,
                       llvm::MutableArrayRef<plan::ParamShard> shards);

/// A ZeRO unit (ZeroPolicy.h) of a chunk: its kind and size, and the names of its shards.
struct LoweredUnit {
  ParamUnit unit;
  std::vector<std::string> params;
};

/// One virtual stage as one tensor-parallel rank lowers it.
struct LoweredChunk {
  plan::Chunk chunk;
  std::vector<plan::ParamShard> params;
  /// The shards grouped into ZeRO units, in the order the backward finishes them (the order of
  /// MemoryModel's virtualStageUnits).
  std::vector<LoweredUnit> units;
  /// Replicated parameters whose gradients are partial over the tp group: those computed
  /// from sequence-parallel activations, summed by all_reduce_grads over tp.
  std::vector<std::string> tpPartialGrads;
};

/// ChunkLowering.cpp.
LoweredChunk lowerChunk(const Job &job, int64_t virtualStage, int64_t tpRank, int64_t cpRank);

/// Declares tensors in a chunk's table and appends ops to the list being built.
class OpWriter {
public:
  OpWriter(const Job &job, plan::Chunk &chunk) : job(job), chunk(chunk) {}

  std::string declare(const std::string &name, std::vector<int64_t> shape, plan::DType dtype) {
    chunk.tensors[name] = plan::TensorType{std::move(shape), dtype};
    return name;
  }
  /// An activation [rows, micro_batch, width] in the model dtype.
  std::string activation(const std::string &name, int64_t rows, int64_t width) {
    return declare(name, {rows, job.microBatch, width}, job.dtype);
  }
  /// Declares the gradient of `tensor` with its type.
  std::string gradOf(const std::string &tensor) {
    std::string grad = plan::gradName(tensor);
    chunk.tensors[grad] = chunk.tensors.at(tensor);
    return grad;
  }
  void emit(plan::OpKind kind, std::vector<std::string> inputs, std::vector<std::string> outputs,
            std::map<std::string, plan::AttrValue> attrs = {}) {
    ops->push_back(plan::Op{kind, std::move(inputs), std::move(outputs), std::move(attrs)});
  }

  const Job &job;
  plan::Chunk &chunk;
  std::vector<plan::Op> *ops = nullptr; // the forward or the backward list
};

/// The attention of one block under context parallelism (RingLowering.cpp): the rank's two
/// sequence chunks of queries meet every key/value block as the blocks travel the cp ring.
struct RingAttention {
  struct Chunks {
    std::string part[2]; // chunk 0 (cp rank r) and chunk 1 (2cp - 1 - r)
  };
  Chunks qIn, kIn;   // the rank's chunks of q and k before RoPE
  Chunks q, k, v;    // the inputs as the blocks read them (rotated with RoPE)
  Chunks y, lse;     // the merged attention and its row logsumexp, per query chunk
  std::string output; // y's chunks concatenated: what the output projection reads
};

/// Where one block's ring attention runs: its sizes on this rank and its place in the ring.
struct RingSite {
  const Job &job;
  int64_t block, cpRank;
  int64_t heads, kvHeads, headDim; // this tp rank's
  bool rope;
};

/// Splits q, k and v [seq, b, width] into the rank's chunks, rotates them at their positions
/// (RoPE), and runs the ring; `sfx` names a recomputation.
RingAttention ringAttentionForward(OpWriter &w, const RingSite &site, const std::string &q,
                                   const std::string &k, const std::string &v,
                                   llvm::StringRef sfx);
/// The ring again from the chunks `saved` kept (selective recompute).
RingAttention ringAttentionRecompute(OpWriter &w, const RingSite &site, const RingAttention &saved,
                                     llvm::StringRef sfx);
/// From the gradient of `ring.output`, the gradients of the unrotated q, k and v [seq, b,
/// width]: dK and dV travel the ring back to their owner.
void ringAttentionBackward(OpWriter &w, const RingSite &site, const RingAttention &ring,
                           const std::string &dOutput, const std::string &dq,
                           const std::string &dk, const std::string &dv);
/// Position-embedding ops over a rank's two chunks (learned positions under cp).
void addChunkPositions(OpWriter &w, int64_t cpRank, const std::string &x, const std::string &out);
void addChunkPositionsBackward(OpWriter &w, int64_t cpRank, const std::string &dy,
                               const std::string &dx);

/// What the step schedule of one rank needs besides its stage's pipeline program.
struct ScheduleInputs {
  const Job *job = nullptr;
  const StageProgram *program = nullptr;
  const std::vector<int64_t> *ppGroup = nullptr;
  /// Parameter names per chunk, in the chunk's order.
  std::vector<std::vector<std::string>> chunkParams;
  /// The ZeRO units and the op lists of each chunk (LoweredChunk).
  std::vector<const std::vector<LoweredUnit> *> chunkUnits;
  std::vector<const plan::Chunk *> chunks;
  std::vector<std::string> tpPartialGrads;
  /// The chunk that reads the batch (embedding or head), or -1.
  int64_t batchChunk = -1;
  bool inEmbeddingGroup = false;
};

/// ScheduleLowering.cpp.
std::vector<plan::Instr> lowerSchedule(const ScheduleInputs &inputs);

/// Runs `check(i)` for i in [0, count) on all cores; the first non-empty answer in index
/// order becomes the error.
llvm::Error firstFailure(size_t count, llvm::function_ref<std::string(size_t)> check);

/// Proves that the schedules of all ranks (indexed by rank) fit together: every transfer
/// meets its match, every collective its group, and nothing deadlocks (RankScheduleCheck.cpp).
llvm::Error checkRankSchedules(const Job &job, llvm::ArrayRef<plan::RankPlan> plans);

} // namespace parc::lower

#endif
