//===- OpInterpreter.h - Runs a chunk's forward and backward op lists -----===//
//
// An op list is run top to bottom on the tensors of one (chunk, microbatch): the operands are
// that ChunkEnv's tensors or this rank's parameters, and every output is allocated with the
// shape of the chunk's tensor table. Writes to a parameter gradient ("w.grad") add to the
// parameter's gradient buffer, directly where the kernel accumulates (dweight, dbias, matmul's
// GradWrite::Add) and through a scratch buffer otherwise. Collectives run over the group the
// op names, through the communicator.
//
// Liveness: after each op the tensors it was the last user of are freed, except those a later
// pass needs (the forward keeps what the backward reads, the chunk's output until it is sent
// and the loss; the backward keeps the input gradient until it is sent).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_OPINTERPRETER_H
#define PARC_RUNTIME_OPINTERPRETER_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/MoEKernels.h"
#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/ParamStore.h"
#include "parc/Runtime/Profiler.h"

#include "llvm/ADT/STLFunctionalExtras.h"

#include <string>
#include <unordered_map>
#include <vector>

namespace parc::runtime {

/// Row counts [members, experts per member] of an expert-parallel exchange (moe_counts,
/// all_to_all): a handful of integers that the host needs to size the exchange, so they live
/// on the host whatever the device.
struct RowCounts {
  std::vector<int64_t> shape, values;
};

/// The tensors of one (chunk, microbatch) between its forward and its backward.
/// Hashed, not ordered: every operand and output of every op is looked up here, and nothing
/// walks the tensors in order.
template <typename T> struct ChunkEnv {
  std::unordered_map<std::string, Tensor<T>> values;
  std::unordered_map<std::string, Tensor<int64_t>> ids; // tokens and labels
  std::unordered_map<std::string, RowCounts> counts;

  bool has(const std::string &name) const {
    return values.count(name) || ids.count(name) || counts.count(name);
  }
  void erase(const std::string &name) {
    values.erase(name);
    ids.erase(name);
    counts.erase(name);
  }
};

/// For each op of a chunk's lists, the names to free once it ran.
struct ChunkLiveness {
  std::vector<std::vector<std::string>> afterForward, afterBackward;
  /// Forward tensors the backward reads (kept until the backward frees them).
  std::vector<std::string> readByBackward;

  static ChunkLiveness analyze(const plan::Chunk &chunk);
};

/// D is the rank's device (CpuDevice.h): every kernel runs and every output lives there.
template <typename D> class OpInterpreter {
public:
  using T = typename D::Value;
  using Stat = typename D::Stat;
  using Grad = typename D::Grad;

  OpInterpreter(const plan::RankPlan &plan, ParamStore<D> &params, Communicator &comm)
      : plan(plan), params(params), comm(comm), dev(params.device()), memory(dev.memory()) {}

  /// Runs `ops` of `chunk` on `env`, freeing after op i the names in freeAfter[i]. Errors
  /// (std::runtime_error, CommError) name the op: "forward[12] (matmul -> block.0.attn.q.mm)".
  /// `afterOp(i)`, when given, runs once op i and its gradient accumulation are queued;
  /// `beforeOp(i)` before op i reads its operands.
  void run(const plan::Chunk &chunk, bool backward, llvm::ArrayRef<plan::Op> ops,
           const std::vector<std::vector<std::string>> &freeAfter, ChunkEnv<T> &env,
           llvm::function_ref<void(size_t)> afterOp = nullptr,
           llvm::function_ref<void(size_t)> beforeOp = nullptr);

  /// The value of the last cross_entropy op run, on the host.
  double lastLoss() const { return loss; }
  /// The loss scale (LossScaler.h) that cross_entropy_bwd multiplies its loss gradient by: on
  /// the host scalar, so that the scale need not fit the element type (fp16 ends at 65504).
  void setLossScale(double scale) { lossScale = scale; }
  /// Times every op into `target` (null: none); Profiler.h.
  void setProfile(OpProfile *target) { profile = target; }

  /// An operand's storage and shape, which stays with its tensor or parameter (an operand
  /// lives within one op), so that reading one allocates nothing.
  struct Operand {
    T *data = nullptr;
    llvm::ArrayRef<int64_t> shape;
    int64_t numel() const;
  };
  struct PendingGrad {
    Buffer<T> scratch;
    Grad *grad;
  };
  struct Context {
    const plan::Chunk &chunk;
    const plan::Op &op;
    ChunkEnv<T> &env;
    /// The names freed once the op has run (their last use is this op): an op may write its
    /// output over one of them.
    llvm::ArrayRef<std::string> freedAfter;
    std::vector<PendingGrad> pending;
  };

private:
  void execute(Context &ctx);
  void executeCompute(Context &ctx);
  void executeBackward(Context &ctx);
  void executeCollective(Context &ctx);
  void executeLoss(Context &ctx);
  /// Ring attention's blocks, merge and block backward (OpRing.cpp).
  void executeRingAttention(Context &ctx);
  /// The mixture-of-experts ops (OpMoE.cpp); expertMatMul runs expert_matmul and its
  /// backward with the routing of their logits.
  void executeMoE(Context &ctx);
  /// expert_matmul and its backward over consecutive row blocks, block b holding
  /// blocks[b].second rows of expert blocks[b].first.
  void expertMatMul(Context &ctx, llvm::ArrayRef<std::pair<int64_t, int64_t>> blocks);
  /// The expert-parallel token exchange (OpMoE.cpp).
  void allToAll(Context &ctx);
  /// The send and recv ops [first, last) of `ops`, posted together as one exchange with the
  /// cp group's members (OpRing.cpp). Message n from one rank to another within a run has tag
  /// n on both sides.
  void exchangeRun(const plan::Chunk &chunk, llvm::ArrayRef<plan::Op> ops, size_t first,
                   size_t last, ChunkEnv<T> &env);

  Operand in(Context &ctx, size_t i);
  const int64_t *ids(Context &ctx, size_t i, std::vector<int64_t> *shape = nullptr);
  /// Input i as row counts; outCounts writes output i, as the tensor table declares it.
  const RowCounts &counts(Context &ctx, size_t i);
  RowCounts &outCounts(Context &ctx, size_t i);
  /// The output's storage: the parameter gradient itself when `kernelAdds` and the output is
  /// one, a scratch buffer added to it after the op when not, otherwise a new tensor. A kernel
  /// that adds into its output or leaves part of it unwritten (`kernelAdds`) gets zeros; one
  /// that overwrites all of it gets memory that may hold anything (Init::Overwritten).
  Operand out(Context &ctx, size_t i, bool kernelAdds);
  /// Output `o` in the storage of input `i` when that input is an activation of the same
  /// shape whose last use is this op (it is renamed to the output); a new tensor otherwise.
  Operand outOver(Context &ctx, size_t o, size_t i);
  /// Adds the op just run (and its gradient accumulation) to the profile.
  void record(Context &ctx, const StopWatch &watch);
  const std::vector<int64_t> &group(const plan::Op &op) const;

  const plan::RankPlan &plan;
  ParamStore<D> &params;
  Communicator &comm;
  D &dev;
  MemoryTracker &memory;
  double loss = 0;
  double lossScale = 1;
  OpProfile *profile = nullptr;
};

extern template class OpInterpreter<CpuDevice<float>>;
extern template class OpInterpreter<CpuDevice<double>>;

} // namespace parc::runtime

#endif
