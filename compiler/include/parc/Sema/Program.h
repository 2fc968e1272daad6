//===- Program.h - The resolved semantic model of a .par file -------------===//
//
// What every stage after the front end works on: one model, one cluster, one parallel mapping
// and the training settings, with values normalised to base units (bytes, bytes/s, seconds,
// FLOP/s) and the source range of every field kept for later diagnostics.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEMA_PROGRAM_H
#define PARC_SEMA_PROGRAM_H

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/SMLoc.h"
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace parc {

enum class DType { FP32, BF16, FP16 };
enum class Norm { LayerNorm, RMSNorm };
enum class MLPKind { GELU, SwiGLU };
enum class Position { Learned, RoPE };
enum class ScheduleKind { GPipe, OneFOneB, Interleaved };
enum class Recompute { None, Selective, Full };
enum class Optimizer { Adam, SGD };
enum class Axis { TP, DP, PP };

const char *toString(DType);
const char *toString(Norm);
const char *toString(MLPKind);
const char *toString(Position);
const char *toString(ScheduleKind);
const char *toString(Recompute);
const char *toString(Optimizer);
const char *toString(Axis);
int64_t bytesPerElement(DType);

/// One `layer` declaration. Transformer groups carry their own (possibly overridden) sizes.
struct LayerGroup {
  enum Kind { Embedding, Transformer, LMHead } kind = Transformer;
  std::string name;
  llvm::SMRange range;
  int64_t count = 1;
  int64_t heads = 0, kvHeads = 0, ffn = 0;
  MLPKind mlp = MLPKind::GELU;
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
  std::vector<LayerGroup> layers;

  int64_t numBlocks() const;
  bool tiedHead() const;
  /// The transformer block at global index `i` (0-based) belongs to this group.
  const LayerGroup &blockGroup(int64_t i) const;
};

struct LinkSpec {
  double bandwidth = 0; // bytes/s
  double latency = 0;   // seconds
};

struct ClusterSpec {
  std::string name;
  llvm::SMRange nameRange;
  int64_t nodes = 0, gpusPerNode = 0;
  int64_t gpuMemory = 0;  // bytes
  double gpuFlops = 0;    // FLOP/s
  int64_t gpuReserve = 0; // bytes kept for the CUDA context and fragmentation
  LinkSpec intraNode, interNode;
  bool hasInterNode = false;

  int64_t world() const { return nodes * gpusPerNode; }
};

struct ParallelSpec {
  llvm::SMRange headerRange;
  int64_t tp = 1, pp = 1, dp = 1;
  bool dpAuto = false;
  std::array<Axis, 3> order = {Axis::TP, Axis::DP, Axis::PP}; // fastest-varying first
  int64_t microBatch = 1, globalBatch = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int64_t chunks = 1; // virtual stages per pipeline rank (interleaved only)
  int zero = 0;
  Recompute recompute = Recompute::None;
  bool sequenceParallel = false;
  std::vector<int64_t> stageLayers; // explicit blocks per stage, or empty
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
