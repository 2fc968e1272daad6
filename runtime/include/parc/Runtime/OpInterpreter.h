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
#include "llvm/ADT/StringMap.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace parc::runtime {

/// Row counts [members, experts per member] of an expert-parallel exchange (moe_counts,
/// all_to_all): a handful of integers that the host needs to size the exchange, so they live
/// on the host whatever the device.
struct RowCounts {
  std::vector<int64_t> shape, values;
};

/// Every name a chunk's tensors go by (its tensor table, its ops' operands, the loss and the
/// batch), numbered once per plan: a ChunkEnv is then an array, so that defining a tensor in
/// the step loop allocates nothing and reading one hashes the name once.
class ChunkNames {
public:
  /// The slots of one op's inputs and outputs.
  struct OpSlots {
    llvm::SmallVector<int, 4> inputs, outputs;
  };
  /// The slots freed after one op (ChunkLiveness's names, numbered).
  using Freed = llvm::SmallVector<int, 2>;

  /// `chunk` outlives the names, and its op lists do not change.
  explicit ChunkNames(const plan::Chunk &chunk);
  /// The slot of `name`, or -1 when the chunk never names it.
  int slot(llvm::StringRef name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : int(it->second);
  }
  size_t size() const { return index.size(); }
  /// `lists` (ChunkLiveness's afterForward or afterBackward) by slot; names the chunk lacks
  /// hold nothing to free and are left out.
  std::vector<Freed> freed(const std::vector<std::vector<std::string>> &lists) const;
  /// The tensor table's entry for the name in `slot`, or null (a parameter, a gradient
  /// written into one, or a name the table lacks).
  const plan::TensorType *type(int slot) const {
    return slot < 0 ? nullptr : types[size_t(slot)];
  }
  /// Marks which slots name a parameter of `params` (a ParamStore) and which a parameter's
  /// gradient, by index into params.all(), so that the step loop finds an operand's parameter
  /// by slot instead of by name.
  template <typename Store> void bindParams(Store &params) {
    auto indexOf = [&](const auto *param) {
      return param ? int(param - params.all().data()) : -1;
    };
    valueParams.assign(index.size(), -1);
    gradParams.assign(index.size(), -1);
    for (const auto &entry : index) {
      valueParams[entry.second] = indexOf(params.find(entry.first()));
      gradParams[entry.second] = indexOf(params.gradOwner(entry.first()));
    }
  }
  /// Since bindParams: the index of the parameter in `slot`, or of the one whose gradient it
  /// is; -1 for none. Unbound (or slot -1): `unbound`, and the caller looks the name up.
  static constexpr int unbound = -2;
  int paramAt(int slot) const { return bound(valueParams, slot); }
  int gradOwnerAt(int slot) const { return bound(gradParams, slot); }
  /// The slots of op i of `ops` when `ops` is one of the chunk's own lists, else null (the
  /// caller then looks the names up).
  const OpSlots *slotsOf(llvm::ArrayRef<plan::Op> ops, size_t i) const {
    if (ops.data() == forwardOps && ops.size() == forward.size())
      return &forward[i];
    if (ops.data() == backwardOps && ops.size() == backward.size())
      return &backward[i];
    return nullptr;
  }

private:
  static int bound(const std::vector<int> &table, int slot) {
    return slot < 0 || table.empty() ? unbound : table[size_t(slot)];
  }

  llvm::StringMap<unsigned> index;
  std::vector<const plan::TensorType *> types;
  std::vector<int> valueParams, gradParams; // by slot, once bound
  const plan::Op *forwardOps = nullptr, *backwardOps = nullptr;
  std::vector<OpSlots> forward, backward;
};

/// The tensors of one (chunk, microbatch) between its forward and its backward, by name: a
/// name holds values, token ids (tokens and labels) or row counts, or nothing.
template <typename T> class ChunkEnv {
public:
  /// `names` outlives the environment.
  explicit ChunkEnv(const ChunkNames &names) : names(&names), entries(names.size()) {}

  const ChunkNames &chunkNames() const { return *names; }

  /// The tensor `name` holds, or null when it holds none of that kind.
  Tensor<T> *value(llvm::StringRef name) { return valueAt(names->slot(name)); }
  Tensor<int64_t> *ids(llvm::StringRef name) {
    Entry *entry = find(names->slot(name), Kind::Ids);
    return entry ? &entry->host->ids : nullptr;
  }
  RowCounts *counts(llvm::StringRef name) {
    Entry *entry = find(names->slot(name), Kind::Counts);
    return entry ? &entry->host->counts : nullptr;
  }
  /// What `name` holds from now on, empty if it held nothing of that kind; the name must be
  /// one of the chunk's (std::runtime_error otherwise).
  Tensor<T> &setValue(llvm::StringRef name) { return set(name, names->slot(name), Kind::Value).value; }
  Tensor<int64_t> &setIds(llvm::StringRef name) {
    return set(name, names->slot(name), Kind::Ids).host->ids;
  }
  RowCounts &setCounts(llvm::StringRef name) {
    return set(name, names->slot(name), Kind::Counts).host->counts;
  }
  bool has(llvm::StringRef name) const { return hasAt(names->slot(name)); }
  void erase(llvm::StringRef name) { eraseAt(names->slot(name)); }
  void clear() {
    for (Entry &entry : entries)
      reset(entry);
  }

  /// The same by slot (ChunkNames), for the interpreter, which knows each op's; slot -1 is a
  /// name the chunk lacks.
  Tensor<T> *valueAt(int slot) {
    Entry *entry = find(slot, Kind::Value);
    return entry ? &entry->value : nullptr;
  }
  Tensor<T> &setValueAt(llvm::StringRef name, int slot) { return set(name, slot, Kind::Value).value; }
  bool hasAt(int slot) const { return slot >= 0 && entries[size_t(slot)].kind != Kind::None; }
  void eraseAt(int slot) {
    if (slot >= 0)
      reset(entries[size_t(slot)]);
  }

private:
  enum class Kind : uint8_t { None, Value, Ids, Counts };
  /// What only a chunk's batch and expert exchanges hold: out of line, so that the entries
  /// every op reads stay a third of the size (an environment of eight ranks is read cold
  /// after each switch of rank).
  struct HostEntry {
    Tensor<int64_t> ids;
    RowCounts counts;
  };
  struct Entry {
    Kind kind = Kind::None;
    Tensor<T> value;
    std::unique_ptr<HostEntry> host; // kept once made: a spare environment reuses it
  };
  /// The entry in `slot` when it holds `kind`, else null.
  Entry *find(int slot, Kind kind) {
    if (slot < 0 || entries[size_t(slot)].kind != kind)
      return nullptr;
    return &entries[size_t(slot)];
  }
  Entry &set(llvm::StringRef name, int slot, Kind kind) {
    if (slot < 0)
      throw std::runtime_error("'" + name.str() + "' is not a tensor of this chunk");
    Entry &entry = entries[size_t(slot)];
    if (entry.kind != kind) {
      reset(entry);
      entry.kind = kind;
      if (kind != Kind::Value && !entry.host)
        entry.host = std::make_unique<HostEntry>();
    }
    return entry;
  }
  /// Frees what the entry holds; only its kind's member holds anything.
  static void reset(Entry &entry) {
    switch (entry.kind) {
    case Kind::None:
      return;
    case Kind::Value:
      entry.value = Tensor<T>();
      break;
    case Kind::Ids:
      entry.host->ids = Tensor<int64_t>();
      break;
    case Kind::Counts:
      entry.host->counts = RowCounts();
      break;
    }
    entry.kind = Kind::None;
  }

  const ChunkNames *names;
  std::vector<Entry> entries;
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

  /// Runs `ops` of `chunk` on `env`, freeing after op i the slots in freeAfter[i]. Errors
  /// (std::runtime_error, CommError) name the op: "forward[12] (matmul -> block.0.attn.q.mm)".
  /// `afterOp(i)`, when given, runs once op i and its gradient accumulation are queued;
  /// `beforeOp(i)` before op i reads its operands.
  void run(const plan::Chunk &chunk, bool backward, llvm::ArrayRef<plan::Op> ops,
           const std::vector<ChunkNames::Freed> &freeAfter, ChunkEnv<T> &env,
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
    /// The slots freed once the op has run (their last use is this op): an op may write its
    /// output over one of them.
    llvm::ArrayRef<int> freedAfter;
    std::vector<PendingGrad> pending;
    /// The slots of the op's names in `env` when known (ChunkNames::slotsOf).
    const ChunkNames::OpSlots *slots = nullptr;
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
  /// The parameter an input in `slot` reads (Value), or the one whose gradient an output in
  /// `slot` writes (Gradient); null for none. By slot once the names are bound, by name before.
  enum class ParamUse { Value, Gradient };
  typename ParamStore<D>::Param *paramAt(Context &ctx, int slot, llvm::StringRef name,
                                         ParamUse use);
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
  int outputSlot(Context &ctx, size_t i) const;
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
