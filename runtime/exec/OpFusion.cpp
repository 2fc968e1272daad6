//===- OpFusion.cpp - Elementwise pairs into one op -----------------------===//

#include "parc/Runtime/OpFusion.h"

#include "llvm/ADT/STLExtras.h"

#include <optional>

namespace parc::runtime {

namespace {
using plan::OpKind;

/// The indices of the ops of `ops` that read `name`.
std::vector<size_t> readers(llvm::ArrayRef<plan::Op> ops, const std::string &name) {
  std::vector<size_t> result;
  for (size_t i = 0; i < ops.size(); ++i)
    if (llvm::is_contained(ops[i].inputs, name))
      result.push_back(i);
  return result;
}

bool writes(llvm::ArrayRef<plan::Op> ops, const std::string &name) {
  return llvm::any_of(ops,
                      [&](const plan::Op &op) { return llvm::is_contained(op.outputs, name); });
}

/// The one reader of `name` in `ops` when there is exactly one and it is of `kind`.
std::optional<size_t> soleReader(llvm::ArrayRef<plan::Op> ops, const std::string &name,
                                 OpKind kind) {
  std::vector<size_t> found = readers(ops, name);
  if (found.size() != 1 || ops[found.front()].kind != kind)
    return std::nullopt;
  return found.front();
}

/// Tries to fuse the bias_add at forward[i] with its gelu; true when it did.
bool fuseBiasGELUAt(plan::Chunk &chunk, size_t i) {
  const plan::Op &biasAdd = chunk.forward[i];
  if (biasAdd.kind != OpKind::BiasAdd || biasAdd.inputs.size() != 2 || biasAdd.outputs.size() != 1)
    return false;
  const std::string &y = biasAdd.outputs[0];
  if (y == chunk.output || writes(chunk.backward, y))
    return false;
  std::optional<size_t> gelu = soleReader(chunk.forward, y, OpKind::GELU);
  std::optional<size_t> geluBwd = soleReader(chunk.backward, y, OpKind::GELUBwd);
  if (!gelu || !geluBwd || chunk.forward[*gelu].inputs.size() != 1)
    return false;
  const plan::Op &gradOp = chunk.backward[*geluBwd];
  if (gradOp.inputs.size() != 2 || gradOp.inputs[0] != y || gradOp.outputs.size() != 1)
    return false;
  std::optional<size_t> biasBwd = soleReader(chunk.backward, gradOp.outputs[0], OpKind::BiasAddBwd);
  if (!biasBwd || *biasBwd < *geluBwd || chunk.backward[*biasBwd].outputs.size() != 2)
    return false;
  // x + bias is recomputed where bias_add_bwd ran; nothing between may overwrite x or bias.
  for (size_t k = *geluBwd; k <= *biasBwd; ++k)
    for (const std::string &input : biasAdd.inputs)
      if (llvm::is_contained(chunk.backward[k].outputs, input))
        return false;

  plan::Op fusedBackward = chunk.backward[*biasBwd];
  fusedBackward.kind = OpKind::GELUBwd;
  fusedBackward.inputs = {biasAdd.inputs[0], biasAdd.inputs[1], gradOp.inputs[1]};
  chunk.backward[*biasBwd] = std::move(fusedBackward);
  chunk.backward.erase(chunk.backward.begin() + *geluBwd);

  chunk.forward[*gelu].inputs = biasAdd.inputs;
  chunk.forward.erase(chunk.forward.begin() + i);
  return true;
}

/// Tries to fuse the residual_add at forward[i] into the norm that reads its sum next.
bool fuseResidualNormAt(plan::Chunk &chunk, size_t i) {
  const plan::Op &add = chunk.forward[i];
  if (add.kind != OpKind::ResidualAdd || add.inputs.size() != 2 || add.outputs.size() != 1)
    return false;
  const std::string &sum = add.outputs[0];
  std::vector<size_t> found = readers(chunk.forward, sum);
  auto next = llvm::find_if(found, [&](size_t j) { return j > i; });
  if (next == found.end())
    return false;
  plan::Op &norm = chunk.forward[*next];
  size_t normInputs = norm.kind == OpKind::LayerNorm ? 3 : norm.kind == OpKind::RMSNorm ? 2 : 0;
  if (!normInputs || norm.inputs.size() != normInputs || norm.inputs[0] != sum ||
      norm.outputs.size() != 1)
    return false;
  std::vector<std::string> inputs = add.inputs;
  inputs.insert(inputs.end(), norm.inputs.begin() + 1, norm.inputs.end());
  norm.inputs = std::move(inputs);
  norm.outputs.insert(norm.outputs.begin(), sum);
  chunk.forward.erase(chunk.forward.begin() + i);
  return true;
}

/// Applies `fuseOne` at every forward position until none is left to fuse.
template <typename Fuse> int64_t fuseAll(plan::Chunk &chunk, Fuse fuseOne) {
  int64_t fused = 0;
  for (size_t i = 0; i < chunk.forward.size();) {
    if (fuseOne(chunk, i)) {
      ++fused;
      continue; // forward[i] is now the op after the removed one
    }
    ++i;
  }
  return fused;
}
} // namespace

int64_t fuseResidualNorm(plan::Chunk &chunk) { return fuseAll(chunk, fuseResidualNormAt); }

int64_t fuseBiasGELU(plan::Chunk &chunk) { return fuseAll(chunk, fuseBiasGELUAt); }

} // namespace parc::runtime
