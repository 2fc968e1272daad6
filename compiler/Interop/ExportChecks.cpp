//===- ExportChecks.cpp - What both exporters refuse, and how they say it --===//
#include "ExportChecks.h"

#include <cstdio>

namespace parc::interop {

void ExportChecker::refuse(llvm::StringRef field, const llvm::Twine &why) {
  llvm::SMRange fallback =
      field.startswith("model.") ? program.model.nameRange : program.parallel.headerRange;
  diags.error(program.rangeOf(field, fallback), why);
  refused = true;
}

void ExportChecker::refuse(const LayerGroup &layer, const llvm::Twine &why) {
  diags.error(layer.range, why);
  refused = true;
}

bool ppBeforeDp(const ParallelSpec &par) {
  for (Axis a : par.order.axes())
    if (a == Axis::PP || a == Axis::DP)
      return a == Axis::PP;
  return false;
}

void ExportChecker::checkOrder(bool tpPpDpAllowed) {
  const ParallelSpec &par = program.parallel;
  // The launchers' orders, less their size-1 axes: tp, then cp, then dp and pp.
  std::vector<Axis> named;
  for (Axis a : par.order.namedAxes())
    if (a != Axis::EP && (a != Axis::CP || par.cp > 1))
      named.push_back(a);
  std::vector<Axis> expected = {Axis::TP};
  if (par.cp > 1)
    expected.push_back(Axis::CP);
  bool pipelineFirst = ppBeforeDp(par);
  expected.push_back(pipelineFirst ? Axis::PP : Axis::DP);
  expected.push_back(pipelineFirst ? Axis::DP : Axis::PP);
  if (named == expected && (!pipelineFirst || tpPpDpAllowed))
    return;
  refuse("parallel.order",
         "order = " + par.orderText() + " is not a rank order " + launcher +
             " builds: it places tensor-parallel ranks fastest, then " +
             (par.cp > 1 ? "context-parallel, then " : "") +
             (tpPpDpAllowed ? (par.cp > 1 ? "data-parallel (tp-cp-dp-pp, Megatron's tp-cp-ep-dp-pp) "
                                            "or pipeline (tp-cp-pp-dp, --use-tp-pp-dp-mapping)"
                                          : "data-parallel (tp-dp-pp, Megatron's tp-cp-ep-dp-pp) "
                                            "or pipeline (tp-pp-dp, --use-tp-pp-dp-mapping)")
                            : "data-parallel, then pipeline (tp-dp-pp)"));
}

void ExportChecker::checkSchedule(bool interleavedAllowed) {
  const ParallelSpec &par = program.parallel;
  if (par.pp > 1 && par.schedule == ScheduleKind::GPipe)
    refuse("parallel.schedule",
           "schedule = gpipe: " + launcher +
               " pipelines one forward and one backward at a time (1F1B); it has no GPipe "
               "schedule, whose memory differs; use schedule = 1f1b");
  if (par.schedule == ScheduleKind::Interleaved && !interleavedAllowed)
    refuse("parallel.schedule", "schedule = interleaved: " + launcher +
                                    " has no interleaved pipeline schedule; use schedule = 1f1b");
}

void ExportChecker::checkGradDtype() {
  DType model = program.model.dtype, grad = program.train.gradDtype;
  if (grad == DType::FP32 || grad == model)
    return;
  refuse("train.grad_dtype", std::string("grad_dtype = ") + toString(grad) + " with a " +
                                 toString(model) + " model: " + launcher +
                                 " keeps the main gradients in fp32 or in the model's dtype");
}

void ExportChecker::checkExperts() {
  for (const LayerGroup &g : program.model.layers)
    if (g.kind == LayerGroup::Transformer && g.moe.enabled())
      refuse(g, "layer '" + g.name + "' is a mixture of experts, which parc does not export to " +
                    launcher + " yet; its launch file would train a dense model");
}

std::string cliNumber(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.10g", v);
  return buffer;
}

double firstWarmupRate(const TrainSpec &train) {
  return train.warmupSteps > 1 ? train.lr / double(train.warmupSteps) : train.lr;
}

} // namespace parc::interop
