//===- Optimizer.h - The optimizer_step instruction -----------------------===//
//
// (0) Gradients divided by the loss scale (LossScaler.h). (1) The global gradient norm: the squares
// of the owned gradient elements of every shard that counts_in_grad_norm, summed over each of the
// instruction's norm_groups in turn. (2) Clipping to train.grad_clip. (3) AdamW or SGD on the owned
// range at the warm-up learning rate, with weight decay only on parameters of two or more
// dimensions. (4) Gradients cleared.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_OPTIMIZER_H
#define PARC_RUNTIME_OPTIMIZER_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/ParamStore.h"

namespace parc::runtime {

struct StepStats {
  double gradNorm = 0;     // global, identical on every rank
  double localSquares = 0; // this rank's share of gradNorm^2 before the reductions
  double lr = 0;           // the learning rate the update used
  bool clipped = false;
  /// False when the norm is not finite: then nothing was updated or cleared.
  bool updated = false;
  /// The loss scale of the step, and whether a dynamic one skipped it (LossScaler.h).
  double lossScale = 1;
  bool skipped = false;
};

/// The learning rate of 0-based update `update`: lr * min(1, (update + 1) / warmup_steps).
double learningRate(const plan::TrainSettings &train, int64_t update);

/// On the owned ranges of `params`, on their device. Devices that keep master weights
/// (half-precision storage) update those and round them into the weights. `update` counts
/// the updates applied before this one (skipped steps do not count); the gradients are
/// multiplied by `gradUnscale` first.
template <typename D>
StepStats optimizerStep(ParamStore<D> &params, Communicator &comm, const plan::RankPlan &plan,
                        const plan::Instr &instr, int64_t update, double gradUnscale = 1);

} // namespace parc::runtime

#endif
