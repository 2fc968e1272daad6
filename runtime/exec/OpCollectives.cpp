//===- OpCollectives.cpp - Collectives, split and the vocab-parallel loss -===//
//
// A tensor split or concatenated along dim d is viewed as [outer, size_d, inner] with outer
// the product of the dims before d and inner of those after; the communicator's all-gather and
// reduce-scatter work on flat member-major parts, so along any dim but the first the parts are
// rearranged through a scratch buffer.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/OpInterpreter.h"

#include "Devices.h"

#include <algorithm>
#include <stdexcept>

namespace parc::runtime {

using plan::OpKind;

namespace {
[[noreturn]] void opError(const std::string &message) { throw std::runtime_error(message); }

/// [outer, size, inner] around `dim`.
struct DimView {
  int64_t outer = 1, size = 1, inner = 1;
};

DimView viewAround(llvm::ArrayRef<int64_t> shape, int64_t dim) {
  if (dim < 0 || dim >= int64_t(shape.size()))
    opError("dim " + std::to_string(dim) + " is outside a tensor of rank " +
            std::to_string(shape.size()));
  DimView view;
  for (int64_t d = 0; d < dim; ++d)
    view.outer *= shape[size_t(d)];
  view.size = shape[size_t(dim)];
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d)
    view.inner *= shape[d];
  return view;
}

/// Copies part `part` ([outer, partSize, inner]) to or from the whole ([outer, wholeSize,
/// inner]) at offset `offset` along the middle dim, on the device.
template <typename D, typename T>
void copyPart(D &dev, T *whole, T *part, const DimView &wholeView, int64_t partSize, int64_t offset,
              bool intoWhole) {
  int64_t run = partSize * wholeView.inner, wholeRow = wholeView.size * wholeView.inner;
  T *window = whole + offset * wholeView.inner;
  if (intoWhole)
    dev.copyRows(window, wholeRow, part, run, run, wholeView.outer);
  else
    dev.copyRows(part, run, window, wholeRow, run, wholeView.outer);
}
} // namespace

template <typename D> void OpInterpreter<D>::executeCollective(Context &ctx) {
  const plan::Op &op = ctx.op;
  switch (op.kind) {
  case OpKind::AllReduce: {
    // Reduced in the input's storage when the input dies here, as it mostly does.
    Operand x = in(ctx, 0), y = outOver(ctx, 0, 0);
    if (x.numel() != y.numel())
      opError("all_reduce's output differs in size from its input");
    if (y.data != x.data)
      dev.copy(y.data, x.data, x.numel());
    comm.allReduce(group(op), y.data, size_t(y.numel()));
    return;
  }
  case OpKind::AllGather: {
    const std::vector<int64_t> &ranks = group(op);
    int64_t g = int64_t(ranks.size());
    Operand x = in(ctx, 0), y = out(ctx, 0, false);
    DimView part = viewAround(x.shape, op.intAttr("dim"));
    DimView whole = viewAround(y.shape, op.intAttr("dim"));
    if (whole.size != part.size * g || y.numel() != x.numel() * g)
      opError("all_gather's output is not the group's parts along dim " +
              std::to_string(op.intAttr("dim")));
    if (part.outer == 1) {
      comm.allGather(ranks, x.data, y.data, size_t(x.numel()));
      return;
    }
    Buffer<T> gathered(memory, MemoryCategory::Activations, size_t(y.numel()));
    comm.allGather(ranks, x.data, gathered.data(), size_t(x.numel()));
    for (int64_t r = 0; r < g; ++r)
      copyPart(dev, y.data, gathered.data() + r * x.numel(), whole, part.size, r * part.size,
               /*intoWhole=*/true);
    return;
  }
  case OpKind::ReduceScatter: {
    const std::vector<int64_t> &ranks = group(op);
    int64_t g = int64_t(ranks.size());
    Operand x = in(ctx, 0), y = out(ctx, 0, false);
    DimView whole = viewAround(x.shape, op.intAttr("dim"));
    DimView part = viewAround(y.shape, op.intAttr("dim"));
    if (whole.size != part.size * g || x.numel() != y.numel() * g)
      opError("reduce_scatter's output is not one of the group's parts along dim " +
              std::to_string(op.intAttr("dim")));
    if (whole.outer == 1) {
      comm.reduceScatter(ranks, x.data, y.data, size_t(y.numel()));
      return;
    }
    Buffer<T> memberMajor(memory, MemoryCategory::Activations, size_t(x.numel()));
    for (int64_t r = 0; r < g; ++r)
      copyPart(dev, x.data, memberMajor.data() + r * y.numel(), whole, part.size, r * part.size,
               /*intoWhole=*/false);
    comm.reduceScatter(ranks, memberMajor.data(), y.data, size_t(y.numel()));
    return;
  }
  case OpKind::Split: {
    Operand x = in(ctx, 0);
    int64_t dim = op.intAttr("dim");
    DimView whole = viewAround(x.shape, dim);
    int64_t offset = 0;
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      Operand partOut = out(ctx, i, false);
      DimView part = viewAround(partOut.shape, dim);
      if (part.outer != whole.outer || part.inner != whole.inner || offset + part.size > whole.size)
        opError("the parts do not tile the input along dim " + std::to_string(dim));
      copyPart(dev, x.data, partOut.data, whole, part.size, offset, /*intoWhole=*/false);
      offset += part.size;
    }
    if (offset != whole.size)
      opError("the parts cover " + std::to_string(offset) + " of " + std::to_string(whole.size) +
              " along dim " + std::to_string(dim));
    return;
  }
  case OpKind::SplitBwd:
  case OpKind::Concat: { // concat is split's backward run forward
    Operand dx = out(ctx, 0, false);
    int64_t dim = op.intAttr("dim");
    DimView whole = viewAround(dx.shape, dim);
    int64_t offset = 0;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      Operand partIn = in(ctx, i);
      DimView part = viewAround(partIn.shape, dim);
      if (part.outer != whole.outer || part.inner != whole.inner || offset + part.size > whole.size)
        opError("the part gradients do not tile the output along dim " + std::to_string(dim));
      copyPart(dev, dx.data, partIn.data, whole, part.size, offset, /*intoWhole=*/true);
      offset += part.size;
    }
    if (offset != whole.size)
      opError("the part gradients cover " + std::to_string(offset) + " of " +
              std::to_string(whole.size) + " along dim " + std::to_string(dim));
    return;
  }
  default:
    opError("op kind '" + plan::spelling(op.kind).str() + "' is not a collective");
  }
}

template <typename D> void OpInterpreter<D>::executeLoss(Context &ctx) {
  const plan::Op &op = ctx.op;
  const std::vector<int64_t> &ranks = group(op);
  Operand logits = in(ctx, 0);
  std::vector<int64_t> labelShape;
  const int64_t *labels = ids(ctx, 1, &labelShape);
  if (logits.shape.size() != 3 || labelShape.size() != 2 || labelShape[0] != logits.shape[1] ||
      labelShape[1] != logits.shape[0])
    opError("logits must be [seq, batch, vocab shard] and labels [batch, seq]");
  int64_t seq = logits.shape[0], batch = logits.shape[1], localVocab = logits.shape[2];
  int64_t rows = seq * batch, vocabOffset = op.intAttr("vocab_offset");
  // The columns of this shard that are vocabulary; the padding's are left out of the softmax.
  int64_t validVocab = std::clamp<int64_t>(op.intAttr("vocab") - vocabOffset, 0, localVocab);

  // The global row maximum and sum of exponentials over every shard of the vocabulary.
  Buffer<Stat> rowMax(memory, MemoryCategory::Activations, size_t(rows));
  Buffer<Stat> rowSum(memory, MemoryCategory::Activations, size_t(rows));
  dev.crossEntropyRowMax(rowMax.data(), logits.data, rows, localVocab, validVocab);
  comm.allReduce(ranks, rowMax.data(), size_t(rows), ReduceOp::Max);
  dev.crossEntropySumExp(rowSum.data(), logits.data, rowMax.data(), rows, localVocab, validVocab);
  comm.allReduce(ranks, rowSum.data(), size_t(rows));

  if (op.kind == OpKind::CrossEntropy) {
    Buffer<Stat> target(memory, MemoryCategory::Activations, size_t(rows));
    dev.crossEntropyTargetLogit(target.data(), logits.data, labels, seq, batch, localVocab,
                                vocabOffset);
    comm.allReduce(ranks, target.data(), size_t(rows));
    Operand lossOut = out(ctx, 0, false);
    if (lossOut.numel() != 1)
      opError("the loss must be a scalar");
    loss = dev.crossEntropyLoss(lossOut.data, rowMax.data(), rowSum.data(), target.data(), rows);
    return;
  }
  // The gradient is written over the logits when they die here (as flash-attn's xentropy with
  // inplace_backward and Megatron's vocab-parallel cross entropy do): the kernel reads each
  // element before it writes it, and the row statistics are already reduced.
  Operand dloss = in(ctx, 2), dlogits = outOver(ctx, 0, 0);
  if (dloss.numel() != 1 || dlogits.numel() != logits.numel())
    opError("cross_entropy_bwd needs a scalar loss gradient and logits-sized output");
  dev.crossEntropyBackward(dlogits.data, logits.data, labels, rowMax.data(), rowSum.data(),
                           dev.readScalar(dloss.data) * lossScale, seq, batch, localVocab,
                           vocabOffset, validVocab);
}

#define PARC_INSTANTIATE(D)                                                                        \
  template void OpInterpreter<D>::executeCollective(Context &);                                    \
  template void OpInterpreter<D>::executeLoss(Context &);
PARC_FOR_EACH_DEVICE(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime
