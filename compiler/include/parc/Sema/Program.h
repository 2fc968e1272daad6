//===- Program.h - The resolved semantic model of a .par file -------------===//
//
// What every stage after the front end works on: one model, one cluster, one parallel mapping
// and the training settings, with values normalised to base units (bytes, bytes/s, seconds,
// FLOP/s) and the source range of every field kept for later diagnostics.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEMA_PROGRAM_H
#define PARC_SEMA_PROGRAM_H

#include "parc/Support/RankGrid.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/SMLoc.h"
#include <array>
#include <cstdint>
#include <climits>
#include <string>
#include <vector>

namespace parc {

enum class DType { FP32, BF16, FP16 };
enum class Norm { LayerNorm, RMSNorm };
/// GELU and the two gated units: SwiGLU (silu(gate) * up) and GeGLU (gelu(gate) * up).
enum class MLPKind { GELU, SwiGLU, GeGLU };
/// GELU exactly (erf, PyTorch's default and Megatron's; gelu_approx = none) or its tanh
/// approximation (GPT-2's "gelu_new", Megatron's --openai-gelu).
enum class GELUForm { Exact, Tanh };
enum class Position { Learned, RoPE };
/// Which linear layers add a bias: all of them (GPT-2), only the query/key/value projections
/// (Qwen2; Megatron's --disable-bias-linear --add-qkv-bias) or none (Llama).
enum class LinearBias { All, QKV, None };
/// Sequential: x + attn(ln1(x)), then + mlp(ln2(.)); parallel (GPT-NeoX, GPT-J):
/// x + attn(ln1(x)) + mlp(ln2(x)).
enum class Residual { Sequential, Parallel };
enum class ScheduleKind { GPipe, OneFOneB, Interleaved };
enum class Recompute { None, Selective, Full };
enum class Optimizer { Adam, SGD };
enum class Attention { Flash, Standard };
/// GPUs with a datasheet row (GPUKinds.h); Generic is a GPU described only by its fields.
enum class GPUKind { Generic, A100_40GB, A100_80GB, H100_SXM, H100_PCIe, H200, B200, L40S };
/// How the GPUs of one node reach each other: NVLink through NVSwitch (every pair at the full
/// per-GPU bandwidth) or PCIe through the host's switches.
enum class IntraNodeKind { NVLink, PCIe };

const char *toString(DType);
const char *toString(Norm);
const char *toString(MLPKind);
const char *toString(GELUForm);
const char *toString(Position);
const char *toString(LinearBias);
const char *toString(Residual);
/// The spellings of MLPKind, in enum order (the schema's words and toString's).
llvm::ArrayRef<llvm::StringRef> mlpKindWords();
MLPKind mlpKindOf(llvm::StringRef word);
/// Gated units have two input projections (gate and up).
inline bool isGated(MLPKind m) { return m != MLPKind::GELU; }
const char *toString(ScheduleKind);
const char *toString(Recompute);
const char *toString(Optimizer);
const char *toString(Attention);
const char *toString(GPUKind);
const char *toString(IntraNodeKind);
int64_t bytesPerElement(DType);

/// A mixture-of-experts MLP (Shazeer et al. 2017, Mixtral, DeepSeek): a softmax router sends
/// each token to `topK` of `experts` expert MLPs and sums their outputs, weighted by the
/// router's probabilities; shared experts see every token. `experts == 0` is a dense MLP.
struct MoESpec {
  int64_t experts = 0;
  int64_t topK = 2;
  int64_t ffn = 0;           // hidden size of one expert (moe_ffn)
  int64_t sharedExperts = 0; // their MLP has sharedExperts * ffn columns (DeepSeek)
  bool normalizeTopK = true; // the top-k weights sum to 1 (Mixtral, Megatron-Core)
  double auxLoss = 0.01;     // coefficient of the load-balancing loss (Switch Transformer)
  double capacity = 0;       // capacity factor; 0 is dropless

  bool enabled() const { return experts > 0; }
  bool dropless() const { return capacity <= 0; }
  int64_t sharedFfn() const { return sharedExperts * ffn; }
  /// ", experts = 8, top_k = 2, ..." as a layer override writes them; "" for a dense MLP.
  std::string fieldsText() const;
};

/// One `layer` declaration. Transformer groups carry their own (possibly overridden) sizes.
struct LayerGroup {
  enum Kind { Embedding, Transformer, LMHead } kind = Transformer;
  std::string name;
  llvm::SMRange range;
  int64_t count = 1;
  int64_t heads = 0, kvHeads = 0, ffn = 0;
  MLPKind mlp = MLPKind::GELU;
  MoESpec moe;
  std::string tiedTo; // lm_head only: the embedding layer it shares weights with
};

struct ModelSpec {
  std::string name;
  llvm::SMRange nameRange;
  DType dtype = DType::BF16;
  int64_t vocab = 0, seq = 0, hidden = 0, heads = 0, kvHeads = 0, ffn = 0;
  Norm norm = Norm::LayerNorm;
  MLPKind mlp = MLPKind::GELU;
  Position position = Position::Learned;
  /// FlashAttention keeps no s x s scores; standard attention (Megatron's fused softmax) does.
  Attention attention = Attention::Flash;
  double dropout = 0; // hidden and attention dropout probability; 0 keeps no masks
  /// The width of one attention head as written, or 0: hidden / heads of each layer.
  int64_t headDim = 0;
  LinearBias bias = LinearBias::All;
  GELUForm gelu = GELUForm::Exact;
  Residual residual = Residual::Sequential;
  double normEps = 1e-5;
  double ropeTheta = 10000;     // base of the rotary frequencies
  double rotaryFraction = 1;    // share of each head's dimensions that rotate
  int64_t maxPositions = 0;     // rows of a learned position table, at least seq; 0: seq
  bool scaleEmbedding = false;  // embeddings times sqrt(hidden) (Gemma)
  std::vector<LayerGroup> layers;

  int64_t numBlocks() const;
  /// Positions the model has: max_positions, or seq where it was not set.
  int64_t positions() const { return maxPositions > 0 ? maxPositions : seq; }
  bool tiedHead() const;
  /// The transformer block at global index `i` (0-based) belongs to this group.
  const LayerGroup &blockGroup(int64_t i) const;
  /// True when some transformer block has a mixture-of-experts MLP.
  bool hasExperts() const;
};

struct LinkSpec {
  double bandwidth = 0; // bytes/s, one direction: of one GPU (intra-node) or one NIC (inter-node)
  double latency = 0;   // seconds
};

/// Dense peak FLOP/s of one GPU per operand type; 0 where neither the file nor a datasheet
/// gives one.
struct PeakFlops {
  double bf16 = 0, fp16 = 0, fp32 = 0, tf32 = 0;
  double of(DType d) const { return d == DType::BF16 ? bf16 : d == DType::FP16 ? fp16 : fp32; }
};

struct ClusterSpec {
  std::string name;
  llvm::SMRange nameRange;
  int64_t nodes = 0, gpusPerNode = 0;
  GPUKind gpuKind = GPUKind::Generic;
  int64_t gpuMemory = 0;        // bytes
  double gpuFlops = 0;          // FLOP/s: the dense peak for the model's dtype
  PeakFlops gpuPeak;            // per dtype, as written or from the datasheet
  double gpuMemoryBandwidth = 0; // bytes/s of HBM; 0 when unknown (the cost model assumes one)
  int64_t gpuSMs = 0;            // streaming multiprocessors; 0 when unknown
  int64_t gpuReserve = 0;        // bytes kept for the CUDA context and fragmentation
  LinkSpec intraNode, interNode;
  IntraNodeKind intraNodeKind = IntraNodeKind::NVLink;
  int64_t nicsPerNode = 0; // inter-node adapters (rails) per node; interNode is one of them
  bool hasInterNode = false;

  int64_t world() const { return nodes * gpusPerNode; }
};

/// What `auto` leaves open for one field: any legal value, or those `auto(a, b, ...)` lists,
/// within the bounds `auto(>= lo, <= hi)` states. Enumerations are their enumerators' codes.
struct Choices {
  bool open = false;
  std::vector<int64_t> values; // empty: any
  int64_t lo = 0, hi = INT64_MAX;

  bool allows(int64_t v) const;
};

/// The fields a parallel block leaves to the search. `dp = auto` alone is no search: dp is
/// derived from the world, as Megatron does; `dp = auto(...)` constrains that derivation.
struct SearchSpace {
  Choices tp, pp, dp, cp, ep, microBatch, zero, recompute, sequenceParallel, order;
  Choices schedule; // ScheduleKind codes; interleaved also takes its chunks from `chunks`
  Choices chunks;   // interleaved(chunks = auto ...)

  /// True when some field other than dp is open: the program names a set of mappings.
  bool searches() const;
  /// Those fields, as the parallel block spells them (`chunks` when only they are open).
  std::vector<std::string> openFields() const;
};

/// The rank orders the search tries, indexed by SearchSpace::order codes: the 24 that name
/// tp, cp, dp and pp, then the 6 that leave cp out (legal only with cp = 1).
const std::vector<RankOrder> &allOrders();
/// The code of `order` in allOrders(); an order that names ep (of size 1 until expert
/// parallelism exists) has the code of the same order without it.
int64_t orderCode(const RankOrder &order);

struct ParallelSpec {
  llvm::SMRange headerRange;
  std::string name; // `parallel NAME for ...`; empty when unnamed
  int64_t tp = 1, pp = 1, dp = 1;
  /// Context parallelism: the sequence split over cp ranks (ring attention).
  int64_t cp = 1;
  /// Expert parallelism: each MoE block's experts split over ep ranks carved from dp x cp.
  int64_t ep = 1;
  bool dpAuto = false;
  RankOrder order; // as written, fastest-varying first; Megatron-Core's tp-cp-ep-dp-pp default
  int64_t microBatch = 1, globalBatch = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int64_t chunks = 1; // virtual stages per pipeline rank (interleaved only)
  int zero = 0;
  Recompute recompute = Recompute::None;
  bool sequenceParallel = false;
  std::vector<int64_t> stageLayers; // explicit blocks per stage, or empty
  /// Megatron-LM's overlap switches (all off by default there, as here): the data-parallel
  /// gradient reduction behind the backward, the distributed optimizer's parameter all-gather
  /// behind the next forward, and the tensor-parallel collectives behind the GEMMs.
  bool overlapGradReduce = false, overlapParamGather = false, tpCommOverlap = false;
  /// Parameters per ZeRO bucket (ZeroPolicy.h); Megatron-LM's DDP default of 40M elements.
  int64_t bucketSize = 40000000;
  /// The fields written `auto`; the concrete fields above then hold a placeholder.
  SearchSpace space;

  /// "1f1b", "interleaved(chunks = 2)": the schedule as the language writes it.
  std::string scheduleText() const;

  /// The order as it reads (tp-dp-pp, tp-cp-dp-pp): cp and ep appear only when larger than 1.
  std::string orderText() const { return order.str(axisSizes(tp, cp, 1, 1, pp)); }
};

struct TrainSpec {
  bool declared = false;
  Optimizer optimizer = Optimizer::Adam;
  double lr = 3e-4;
  int64_t steps = 10;
  int64_t seed = 1234;
  double weightDecay = 0.0, gradClip = 1.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, momentum = 0.0;
  int64_t warmupSteps = 0;
  DType gradDtype = DType::FP32; // main-gradient precision (Megatron accumulates in fp32)
  double tokens = 0; // tokens to train on, for the time-to-train estimate; 0 when not given
};

struct Program {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelSpec parallel;
  TrainSpec train;
  /// Where each field was written: "model.heads", "cluster.gpu.memory", "parallel.tp",
  /// "train.lr". A field left at its default has no entry; callers fall back to the block.
  llvm::StringMap<llvm::SMRange> fieldRanges;

  llvm::SMRange rangeOf(llvm::StringRef field, llvm::SMRange fallback) const {
    auto it = fieldRanges.find(field);
    return it == fieldRanges.end() ? fallback : it->second;
  }
};

} // namespace parc

#endif
