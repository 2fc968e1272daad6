//===- Optimizer.cpp - Global-norm clipping and the parameter update ------===//

#include "parc/Runtime/Optimizer.h"

#include "Devices.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace parc::runtime {

double learningRate(const plan::TrainSettings &train, int64_t update) {
  if (train.warmupSteps <= 0)
    return train.lr;
  return train.lr * std::min(1.0, double(update + 1) / double(train.warmupSteps));
}

template <typename D>
StepStats optimizerStep(ParamStore<D> &params, Communicator &comm, const plan::RankPlan &plan,
                        const plan::Instr &instr, int64_t update, double gradUnscale) {
  using T = typename D::Value;
  using Grad = typename D::Grad;
  using Param = typename ParamStore<D>::Param;
  D &dev = params.device();
  StepStats stats;
  // What this rank updates: the owned range of each shard's gradient. A range nothing wrote
  // (no reduce-scatter reached its partition) is an error in the plan, not a zero.
  std::vector<Grad *> owned;
  for (Param &param : params.all()) {
    owned.push_back(params.ownedGrad(param));
    if (param.ownedCount() > 0 && !owned.back())
      throw std::runtime_error("optimizer_step: the gradient of '" + param.shard->name +
                               "' was never reduced in this step");
  }
  if (gradUnscale != 1)
    for (size_t i = 0; i < owned.size(); ++i)
      if (owned[i])
        dev.scale(owned[i], params.all()[i].ownedCount(), gradUnscale);
  std::vector<std::pair<const Grad *, int64_t>> normed;
  for (size_t i = 0; i < owned.size(); ++i)
    if (params.all()[i].shard->countsInGradNorm && owned[i])
      normed.emplace_back(owned[i], params.all()[i].ownedCount());
  stats.localSquares = dev.squaredSum(normed);
  double squares = stats.localSquares;
  for (plan::Group group : instr.normGroups) {
    const std::vector<int64_t> &ranks = plan.groups.get(group);
    if (!ranks.empty())
      dev.allReduceHost(comm, ranks, &squares, 1);
  }
  stats.gradNorm = std::sqrt(squares);
  if (!std::isfinite(stats.gradNorm))
    return stats;

  const plan::TrainSettings &train = plan.train;
  // The clipping factor is applied as the step reads each gradient (the gradients are cleared
  // after it), not by a pass of its own over them.
  double clipScale = 1.0;
  if (train.gradClip > 0 && stats.gradNorm > train.gradClip) {
    stats.clipped = true;
    clipScale = train.gradClip / (stats.gradNorm + 1e-6);
  }

  stats.lr = learningRate(train, update);
  for (size_t i = 0; i < owned.size(); ++i) {
    Param &param = params.all()[i];
    int64_t count = param.ownedCount();
    if (count == 0)
      continue;
    // Megatron exempts biases and norm weights from weight decay.
    double decay = param.shard->shape.size() >= 2 ? train.weightDecay : 0.0;
    T *weights = params.ownedWeights(param);
    const Grad *grad = owned[i];
    if (D::KeepsMasterWeights && !param.master.allocated()) {
      param.master = params.optimizerBuffer(size_t(count));
      dev.initMaster(param.master.data(), weights, count);
    }
    if (train.optimizer == plan::Optimizer::Adam) {
      if (!param.moment1.allocated()) {
        param.moment1 = params.optimizerBuffer(size_t(count));
        param.moment2 = params.optimizerBuffer(size_t(count));
      }
      cpu::AdamWConfig config;
      config.lr = stats.lr;
      config.beta1 = train.betas[0];
      config.beta2 = train.betas[1];
      config.eps = train.eps;
      config.weightDecay = decay;
      config.step = update + 1;
      config.gradScale = clipScale;
      dev.adamwStep(weights, param.master.data(), grad, param.moment1.data(), param.moment2.data(),
                    count, config);
    } else {
      if (train.momentum != 0 && !param.moment1.allocated())
        param.moment1 = params.optimizerBuffer(size_t(count));
      cpu::SGDConfig config;
      config.lr = stats.lr;
      config.momentum = train.momentum;
      config.weightDecay = decay;
      config.gradScale = clipScale;
      dev.sgdStep(weights, param.master.data(), grad,
                  param.moment1.allocated() ? param.moment1.data() : nullptr, count, config);
    }
  }
  params.clearGrads();
  stats.updated = true;
  return stats;
}

#define PARC_INSTANTIATE(D)                                                                        \
  template StepStats optimizerStep(ParamStore<D> &, Communicator &, const plan::RankPlan &,        \
                                   const plan::Instr &, int64_t, double);
PARC_FOR_EACH_DEVICE(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime
