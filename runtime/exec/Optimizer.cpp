//===- Optimizer.cpp - Global-norm clipping and the parameter update ------===//

#include "parc/Runtime/Optimizer.h"

#include "parc/Runtime/Kernels.h"

#include <algorithm>
#include <cmath>

namespace parc::runtime {

double learningRate(const plan::TrainSettings &train, int64_t step) {
  if (train.warmupSteps <= 0)
    return train.lr;
  return train.lr * std::min(1.0, double(step + 1) / double(train.warmupSteps));
}

template <typename T>
StepStats optimizerStep(ParamStore<T> &params, Communicator &comm, const plan::RankPlan &plan,
                        const plan::Instr &instr, int64_t step) {
  StepStats stats;
  for (typename ParamStore<T>::Param &param : params.all())
    if (param.shard->countsInGradNorm)
      stats.localSquares += cpu::squaredSum(param.grad + param.ownedBegin, param.ownedCount());
  double squares = stats.localSquares;
  for (plan::Group group : instr.normGroups) {
    const std::vector<int64_t> &ranks = plan.groups.get(group);
    if (!ranks.empty())
      comm.allReduce(ranks, &squares, 1);
  }
  stats.gradNorm = std::sqrt(squares);
  if (!std::isfinite(stats.gradNorm))
    return stats;

  const plan::TrainSettings &train = plan.train;
  if (train.gradClip > 0 && stats.gradNorm > train.gradClip) {
    stats.clipped = true;
    double factor = train.gradClip / (stats.gradNorm + 1e-6);
    for (typename ParamStore<T>::Param &param : params.all())
      cpu::scale(param.grad + param.ownedBegin, param.ownedCount(), factor);
  }

  stats.lr = learningRate(train, step);
  for (typename ParamStore<T>::Param &param : params.all()) {
    int64_t count = param.ownedCount();
    if (count == 0)
      continue;
    // Megatron exempts biases and norm weights from weight decay.
    double decay = param.shard->shape.size() >= 2 ? train.weightDecay : 0.0;
    T *weights = params.ownedWeights(param);
    const T *grad = param.grad + param.ownedBegin;
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
      config.step = step + 1;
      cpu::adamwStep(weights, grad, param.moment1.data(), param.moment2.data(), count, config);
    } else {
      if (train.momentum != 0 && !param.moment1.allocated())
        param.moment1 = params.optimizerBuffer(size_t(count));
      cpu::SGDConfig config;
      config.lr = stats.lr;
      config.momentum = train.momentum;
      config.weightDecay = decay;
      cpu::sgdStep(weights, grad, param.moment1.allocated() ? param.moment1.data() : nullptr, count,
                   config);
    }
  }
  params.clearGrads();
  stats.updated = true;
  return stats;
}

template StepStats optimizerStep(ParamStore<float> &, Communicator &, const plan::RankPlan &,
                                 const plan::Instr &, int64_t);
template StepStats optimizerStep(ParamStore<double> &, Communicator &, const plan::RankPlan &,
                                 const plan::Instr &, int64_t);

} // namespace parc::runtime
