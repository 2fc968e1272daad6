//===- Plan.h - The per-rank execution plan shared by compiler and runtime ===//
//
// The compiler lowers a .par file into one RankPlan per rank plus a Manifest; the runtime
// executes the plans and never reads a .par file. Everything the runtime needs is here as plain
// data: where the rank sits (coords, groups), the shards it owns, the op lists of its model
// chunks and the instruction list of one training step. docs/plan-format.md documents every
// field and the semantics a runtime must give them.
//
// These types are deliberately independent of the compiler's parc::Program: lib/ knows
// nothing of the compiler, and the plan format must stay readable when the language changes.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_PLAN_PLAN_H
#define PARC_PLAN_PLAN_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace parc::plan {

/// The value of every "format" field this code writes and the only one it reads.
inline constexpr llvm::StringLiteral FormatVersion = "parc-plan/1";

enum class DType { FP32, BF16, FP16, Int64 };
enum class Norm { LayerNorm, RMSNorm };
enum class MLP { GELU, SwiGLU };
enum class Position { Learned, RoPE };
enum class Schedule { GPipe, OneFOneB, Interleaved };
enum class Recompute { None, Selective, Full };
enum class Optimizer { Adam, SGD };
/// The process groups of a rank; "model" is tp x pp (one model replica), "embedding" the
/// first and last pipeline stage when the head is tied to the embedding, "cp" the context-
/// parallel ring and "dp_cp" data parallel with context (Megatron-Core's "dp-cp": the ranks
/// gradients are reduced over). "ep" exchanges the tokens of mixture-of-experts blocks and
/// "expert_dp" (the ranks holding the same experts) reduces the experts' gradients; both come
/// from Megatron-Core's expert grid (expertOrder). TP, PP, DP and CP also name the axes of
/// `parallel.order`.
enum class Group { TP, PP, DP, Model, Embedding, CP, DPCP, EP, ExpertDP };
inline constexpr std::array<Group, 9> kAllGroups = {
    Group::TP,        Group::PP, Group::DP,   Group::Model,   Group::Embedding,
    Group::CP,        Group::DPCP, Group::EP, Group::ExpertDP};
/// How a parameter is split over the tp group: column splits dim 0 (output features), row the
/// last dim (input features), vocab dim 0 of an embedding table; replicated is not split.
enum class ShardKind { Column, Row, Vocab, Replicated };
enum class InitKind { Normal, Zeros, Ones };

enum class OpKind {
  // Forward ops (also allowed in a backward list, where they recompute activations).
  Embedding,
  PositionEmbedding,
  LayerNorm,
  RMSNorm,
  MatMul,
  BiasAdd,
  RoPE,
  Attention,
  GELU,
  SwiGLU,
  ResidualAdd,
  Split,
  AllReduce,
  AllGather,
  ReduceScatter,
  CrossEntropy,
  // Backward-only ops: the gradient of their forward counterpart.
  EmbeddingBwd,
  PositionEmbeddingBwd,
  LayerNormBwd,
  RMSNormBwd,
  MatMulBwd,
  BiasAddBwd,
  RoPEBwd,
  AttentionBwd,
  GELUBwd,
  SwiGLUBwd,
  ResidualAddBwd,
  SplitBwd,
  CrossEntropyBwd,
  // Context parallelism (ring attention); appended so that the kinds above keep their codes.
  Send,              // forward or backward: point-to-point with a member of the cp group
  Recv,
  Concat,            // forward: the inverse of split
  AttentionBlock,    // forward: one query chunk against one key/value block, with logsumexp
  AttentionMerge,    // forward: two partial attentions of the same queries, merged
  AttentionBlockBwd, // backward of attention_block from the merged output and logsumexp
  // Mixture of experts. Every op routes from the router's logits [seq, batch, experts] itself
  // (softmax, top_k, the lower expert first on a tie), so no routing table travels between ops.
  MoeDispatch,     // forward: tokens' rows copied to their experts, grouped by expert
  ExpertMatMul,    // forward: each expert's rows times its weight
  MoeCombine,      // forward: each token's expert rows summed, weighted by the router
  MoeDispatchBwd,  // backward of moe_dispatch
  ExpertMatMulBwd, // backward of expert_matmul
  MoeCombineBwd,   // backward of moe_combine: the rows' and the logits' gradients
  MoeAuxLossBwd,   // backward: the load-balancing loss's gradient of the logits
  // Expert parallelism: the routed rows move between the members of the ep group.
  MoeCounts, // forward: rows per (ep member, expert of that member) of the routed tokens
  AllToAll,  // forward or backward: row blocks to each member of a group, counts exchanged first
};
/// The mixture-of-experts kinds, moe_dispatch to moe_counts.
inline bool isMixtureOfExperts(OpKind kind) {
  return kind >= OpKind::MoeDispatch && kind <= OpKind::MoeCounts;
}

enum class InstrKind {
  LoadBatch,
  Forward,
  Backward,
  SendAct,
  RecvAct,
  SendGrad,
  RecvGrad,
  AllReduceGrads,
  ReduceScatterGrads,
  AllGatherParams,
  ReleaseParams,
  OptimizerStep
};

/// The JSON spelling of each enumerator ("bf16", "1f1b", "matmul_bwd", "send_act", ...) and its
/// inverse. Named `spelling` rather than `toString` so that it never competes with the
/// compiler's toString overloads for parc::DType and friends.
llvm::ArrayRef<llvm::StringLiteral> spellings(DType);
llvm::ArrayRef<llvm::StringLiteral> spellings(Norm);
llvm::ArrayRef<llvm::StringLiteral> spellings(MLP);
llvm::ArrayRef<llvm::StringLiteral> spellings(Position);
llvm::ArrayRef<llvm::StringLiteral> spellings(Schedule);
llvm::ArrayRef<llvm::StringLiteral> spellings(Recompute);
llvm::ArrayRef<llvm::StringLiteral> spellings(Optimizer);
llvm::ArrayRef<llvm::StringLiteral> spellings(Group);
llvm::ArrayRef<llvm::StringLiteral> spellings(ShardKind);
llvm::ArrayRef<llvm::StringLiteral> spellings(InitKind);
llvm::ArrayRef<llvm::StringLiteral> spellings(OpKind);
llvm::ArrayRef<llvm::StringLiteral> spellings(InstrKind);

template <typename E> llvm::StringRef spelling(E value) {
  return spellings(E{})[static_cast<size_t>(value)];
}
template <typename E> std::optional<E> parseSpelling(llvm::StringRef text) {
  llvm::ArrayRef<llvm::StringLiteral> names = spellings(E{});
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == text)
      return static_cast<E>(i);
  return std::nullopt;
}

/// Context parallelism cuts the sequence into 2 x cp chunks of seq / (2 cp) positions; cp rank
/// r holds chunks r and 2cp - 1 - r, in that order (Megatron-Core's balance of the causal
/// mask). The first position of the rank's chunk `half` (0 or 1).
inline int64_t contextChunkStart(int64_t seq, int64_t cp, int64_t cpRank, int half) {
  return (half == 0 ? cpRank : 2 * cp - 1 - cpRank) * (seq / (2 * cp));
}

/// "rank-00000.json": at least five digits so that a directory listing sorts by rank.
std::string rankFileName(int64_t rank);
/// The name under which the gradient of parameter or activation `tensor` appears in op lists.
std::string gradName(llvm::StringRef tensor);

//===----------------------------------------------------------------------===//
// Where a rank sits
//===----------------------------------------------------------------------===//

struct Coords {
  int64_t tp = 0, pp = 0, dp = 0, cp = 0;
};

/// Each list holds the global ranks of this rank's group in group order (a member's position
/// is its coordinate along that axis; in dp_cp, cp + cp_size * dp with the default order).
/// `embedding` is empty when the rank is in none.
struct Groups {
  std::vector<int64_t> tp, pp, dp, model, embedding, cp, dpCp, ep, expertDp;

  const std::vector<int64_t> &get(Group group) const;
  std::vector<int64_t> &get(Group group);
};

//===----------------------------------------------------------------------===//
// Summaries of the job, identical in every rank plan and in the manifest
//===----------------------------------------------------------------------===//

struct ModelSummary {
  std::string name;
  DType dtype = DType::BF16;
  int64_t vocab = 0, paddedVocab = 0, seq = 0, hidden = 0, heads = 0, kvHeads = 0, headDim = 0,
          ffn = 0;
  int64_t layers = 0; // transformer blocks in the whole model
  Norm norm = Norm::LayerNorm;
  MLP mlp = MLP::GELU;
  Position position = Position::Learned;
  bool tiedEmbeddings = false;
};

struct ClusterSummary {
  std::string name;
  int64_t nodes = 1, gpusPerNode = 1;
};

struct ParallelSummary {
  int64_t tp = 1, pp = 1, dp = 1, cp = 1;
  int64_t ep = 1; // expert parallelism, carved from dp x cp (never an axis of `order`)
  /// The four axes tp, cp, dp and pp, fastest-varying first (Megatron-Core's order string).
  std::vector<Group> order = {Group::TP, Group::CP, Group::DP, Group::PP};
  int64_t chunks = 1;                                             // model chunks per pipeline rank
  int64_t microBatch = 1;                                         // sequences per microbatch
  int64_t microbatches = 1; // M per step and data-parallel replica
  int64_t globalBatch = 1;  // micro_batch * M * dp
  Schedule schedule = Schedule::OneFOneB;
  int64_t zero = 0;
  int64_t bucketSize = 40000000; // parameters per ZeRO bucket (the schedule's lists are them)
  Recompute recompute = Recompute::None;
  bool sequenceParallel = false;
};

struct TrainSettings {
  Optimizer optimizer = Optimizer::Adam;
  double lr = 3e-4;
  std::array<double, 2> betas = {0.9, 0.95};
  double eps = 1e-8, momentum = 0.0, weightDecay = 0.0, gradClip = 1.0;
  int64_t steps = 10, seed = 1234, warmupSteps = 0;
  DType gradDtype = DType::FP32;
};

//===----------------------------------------------------------------------===//
// Parameters, tensors and ops
//===----------------------------------------------------------------------===//

struct Slice {
  int64_t offset = 0, size = 0;
};

struct Init {
  InitKind kind = InitKind::Normal;
  double std = 0.0; // normal only
  /// Normal only: when positive, only rows [0, rows) of dim 0 of the global tensor are drawn
  /// and the rest are zeros: the vocabulary's padding of an embedding or head, which the loss
  /// leaves out, so it stays zero. 0: every row is drawn.
  int64_t rows = 0;
};

/// One tensor shard this rank owns. `slice[d]` is the part of global dim d it holds.
struct ParamShard {
  std::string name; // "block.3.attn.qkv.weight"
  std::vector<int64_t> shape;
  std::vector<Slice> slice;
  DType dtype = DType::BF16;
  ShardKind kind = ShardKind::Replicated;
  Init init;
  /// Whether this shard's gradient enters the global gradient norm. False for the duplicates
  /// that would otherwise be counted twice: a replicated tensor on tp rank > 0, the tied
  /// embedding's copy on the last stage.
  bool countsInGradNorm = true;

  std::vector<int64_t> localShape() const;
};

struct TensorType {
  std::vector<int64_t> shape; // [] is a scalar
  DType dtype = DType::FP32;
};

using AttrValue = std::variant<bool, int64_t, double, std::string>;

enum class AttrType { Bool, Int, Number, Group };

struct AttrSpec {
  llvm::StringLiteral name;
  AttrType type;
};

/// The fixed signature of an op kind: operand counts (AtLeastTwo for split's results and
/// split_bwd's operands), the attributes it must carry, no more and no fewer, and what each
/// operand must be. Roles, one letter per operand (the last repeats for AtLeastTwo):
///   inputs:  'v' a value (an activation or a parameter, never a gradient), 'p' a parameter,
///            'i' token ids (int64), 'c' row counts (int64, written by moe_counts or
///            all_to_all), 'r' the router's logits (a value) or row counts, 'g' a gradient,
///            'u' a value or a gradient, all of the op's 'u' inputs alike (a forward op in a
///            backward list may combine gradients);
///   outputs: 'v' a value, 'c' row counts, 'u' the role of the 'u' inputs (a gradient may be
///            a parameter's),
///            'g' a gradient that is no parameter's, 'P' a weight's gradient (a parameter's,
///            or a tensor a later op sums into one), a digit j the gradient of input j (when
///            input j is a parameter, its gradient or such a tensor, never another's).
struct OpInfo {
  static constexpr int AtLeastTwo = -2;
  int inputs = 1, outputs = 1;
  bool backwardOnly = false;
  llvm::ArrayRef<AttrSpec> attrs;
  llvm::StringLiteral inputRoles = "", outputRoles = "";

  /// The role letter of input or output `i`.
  char inputRole(size_t i) const { return roleAt(inputRoles, i); }
  char outputRole(size_t i) const { return roleAt(outputRoles, i); }

private:
  static char roleAt(llvm::StringRef roles, size_t i) {
    return roles[i < roles.size() ? i : roles.size() - 1];
  }
};
const OpInfo &opInfo(OpKind kind);
llvm::StringRef spelling(AttrType type);

struct Op {
  OpKind kind = OpKind::MatMul;
  std::vector<std::string> inputs, outputs;
  std::map<std::string, AttrValue> attrs;

  // Typed access to an attribute of opInfo(kind); a plan that passed the reader has them all.
  bool boolAttr(llvm::StringRef name) const;
  int64_t intAttr(llvm::StringRef name) const;
  double numberAttr(llvm::StringRef name) const;
  Group groupAttr(llvm::StringRef name) const;
};

/// One model chunk (virtual pipeline stage) of this rank.
struct Chunk {
  int64_t index = 0;        // position in RankPlan::chunks
  int64_t virtualStage = 0; // index * pp + pipeline stage
  /// Transformer blocks [firstBlock, lastBlock], both inclusive; a chunk without blocks has
  /// lastBlock == firstBlock - 1.
  int64_t firstBlock = 0, lastBlock = -1;
  bool hasEmbedding = false; // virtual stage 0: reads "tokens"
  bool hasHead = false;      // last virtual stage: final norm, logits, writes "loss"
  std::string input;         // activation from the previous virtual stage, "" on stage 0
  std::string output;        // activation to the next virtual stage, "" on the last
  std::map<std::string, TensorType> tensors;
  std::vector<Op> forward, backward;

  int64_t numBlocks() const { return lastBlock - firstBlock + 1; }
};

//===----------------------------------------------------------------------===//
// The step schedule
//===----------------------------------------------------------------------===//

/// One instruction of the training step. Which operands are meaningful depends on `op`;
/// the others keep their defaults (-1, empty) and are not written.
struct Instr {
  InstrKind op = InstrKind::Forward;
  int64_t chunk = -1, microbatch = -1;
  int64_t peer = -1;               // transfers: the other rank
  Group group = Group::DP;         // grad and param collectives
  bool average = false;            // grad collectives: divide the sum by the group size
  /// ZeRO instructions next to a compute (all_gather_params before it, release_params and
  /// reduce_scatter_grads after it) that run inside it: the k-th gather of a list just before
  /// the first op of the k-th run of ops reading its params (readRuns), the k-th release after
  /// that run's last op, the last gather and release spanning the runs left; a reduce-scatter
  /// after the last op writing their gradients.
  bool within = false;
  std::vector<std::string> params; // grad and param collectives, release_params
  std::vector<Group> normGroups;   // optimizer_step: groups the squared norm sums over

  static Instr loadBatch(int64_t microbatch);
  static Instr compute(InstrKind op, int64_t chunk, int64_t microbatch);
  static Instr transfer(InstrKind op, int64_t peer, int64_t chunk, int64_t microbatch);
  static Instr gradCollective(InstrKind op, Group group, bool average,
                              std::vector<std::string> params, bool within = false);
  static Instr allGatherParams(Group group, std::vector<std::string> params, bool within = false);
  static Instr releaseParams(std::vector<std::string> params, bool within = false);
  static Instr optimizerStep(std::vector<Group> normGroups);
};

/// What an averaging grad collective (Instr::average) over `group` divides the sum by: the
/// data-parallel replicas whose gradients it sums. That is the group's size, except for
/// expert_dp, dp x cp: each expert's gradient already sums the tokens of its ep group.
struct RankPlan;
int64_t averagingDivisor(const RankPlan &plan, Group group);

bool isTransfer(InstrKind op);
bool isCompute(InstrKind op);
bool usesParams(InstrKind op);
/// The instructions that may run inside an adjacent compute (Instr::within).
bool mayRunWithin(InstrKind op);

/// A ZeRO parameter list gathered within a compute: its names and the group it is partitioned
/// over.
struct GatheredList {
  const std::vector<std::string> *params = nullptr;
  Group group = Group::DP;
};
/// Ops [first, last] of a compute, both inclusive.
struct OpRun {
  size_t first = 0, last = 0;
};
/// The runs of `ops` that read each list of `lists` (the all_gather_params within one compute):
/// a run of a list ends where an op reads another list of the same group, so the lists of one
/// group are whole one at a time. The compute gathers a list once per run (Instr::within).
std::vector<std::vector<OpRun>> readRuns(llvm::ArrayRef<Op> ops,
                                         llvm::ArrayRef<GatheredList> lists);

/// The lists the all_gather_params within a compute gather (the run of them right before
/// schedule[compute]), each once in schedule order, with how many gathers each has.
struct WithinGathers {
  std::vector<GatheredList> lists;
  std::vector<int64_t> gathers; // per list
  /// The list of `params`, or -1.
  int64_t indexOf(const std::vector<std::string> &params) const;
};
WithinGathers gatheredWithin(llvm::ArrayRef<Instr> schedule, size_t compute);

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

/// The compiler's memory model for this rank, in bytes at the model's dtype (the runtime
/// compares what it actually held against it).
struct PredictedMemory {
  int64_t weights = 0, grads = 0, optimizer = 0, activations = 0, reserve = 0;
};

struct RankPlan {
  std::string planId;
  int64_t world = 1, rank = 0, node = 0, localRank = 0;
  Coords coords;
  Groups groups;
  ModelSummary model;
  ClusterSummary cluster;
  ParallelSummary parallel;
  TrainSettings train;
  std::vector<ParamShard> params;
  std::vector<Chunk> chunks;
  std::vector<Instr> schedule;
  PredictedMemory predictedMemory;

  const ParamShard *findParam(llvm::StringRef name) const;
};

struct RankEntry {
  int64_t rank = 0, node = 0, localRank = 0;
  Coords coords;
  std::string file; // relative to the manifest's directory
};

struct Manifest {
  std::string planId;
  int64_t world = 1;
  ModelSummary model;
  ClusterSummary cluster;
  ParallelSummary parallel;
  TrainSettings train;
  std::vector<RankEntry> ranks; // indexed by rank
};

} // namespace parc::plan

#endif
