//===- DeepSpeed.cpp - The checked job as a DeepSpeed config --------------===//
//
// The keys are DeepSpeed's (deepspeed/runtime/config.py, zero/config.py, precision_config.py,
// lr_schedules.py); scripts/interop-check.sh builds DeepSpeedConfig from every export with the
// job's data-parallel size and replays its learning-rate schedule against parc's. The model
// and the tensor/pipeline split are Megatron-DeepSpeed's, whose arguments the "comment" field
// carries.
//
//===----------------------------------------------------------------------===//
#include "ExportChecks.h"
#include "parc/Interop/Export.h"

#include "llvm/Support/JSON.h"

#include <cstdio>

namespace parc {

namespace {
using namespace interop;
namespace json = llvm::json;

/// DeepSpeed's defaults for the buckets (zero/config.py), written out: parc's plans set none.
constexpr int64_t kReduceBucket = 500000000, kAllgatherBucket = 500000000;
constexpr int64_t kPrefetchBucket = 50000000, kPersistenceThreshold = 100000;

/// Reals as short as they are exact to 15 digits (0.0003, not 0.00029999999999999997).
std::string jsonNumber(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.15g", v);
  return buffer;
}
void number(json::OStream &j, llvm::StringRef key, double v) {
  j.attributeBegin(key);
  j.rawValue(jsonNumber(v));
  j.attributeEnd();
}

class DeepSpeedExport {
public:
  DeepSpeedExport(const Program &program, const Mapping &mapping, DiagnosticEngine &diags)
      : program(program), par(program.parallel), train(program.train), mapping(mapping),
        check(program, "DeepSpeed", diags) {}

  std::optional<std::string> run(llvm::StringRef configPath);

private:
  void checkJob();
  void zeroOptimization(json::OStream &j) const;
  void precision(json::OStream &j) const;
  void optimizer(json::OStream &j) const;
  void scheduler(json::OStream &j) const;
  std::string megatronDeepSpeedArgs(llvm::StringRef configPath) const;

  const Program &program;
  const ParallelSpec &par;
  const TrainSpec &train;
  const Mapping &mapping;
  ExportChecker check;
};

void DeepSpeedExport::checkJob() {
  // Megatron-DeepSpeed's topology is DeepSpeed's PipeModelDataParallelTopology: model (tp)
  // fastest, then data, then pipe.
  check.checkOrder(/*tpPpDpAllowed=*/false);
  check.checkSchedule(/*interleavedAllowed=*/false);
  check.checkGradDtype();
  if (mapping.cp > 1)
    check.refuse("parallel.cp", "cp = " + std::to_string(mapping.cp) +
                                    ": Megatron-DeepSpeed has no ring-attention context "
                                    "parallelism (its Ulysses sequence parallelism splits the "
                                    "heads instead); use cp = 1 or --emit=megatron");
  check.checkExperts();
  if (mapping.pp > 1 && par.zero >= 2)
    check.refuse("parallel.zero", "zero = " + std::to_string(par.zero) +
                                      " with pp = " + std::to_string(mapping.pp) +
                                      ": DeepSpeed's pipeline engine runs ZeRO stages 0 and 1 "
                                      "only");
  if (!mapping.partition.blocks.empty()) {
    int64_t first = mapping.partition.blocks.front().second - mapping.partition.blocks.front().first;
    for (const auto &[begin, end] : mapping.partition.blocks)
      if (end - begin != first) {
        check.refuse("parallel.stage_layers",
                     "the stages hold different numbers of blocks: Megatron-DeepSpeed's "
                     "pipeline splits the layers evenly");
        break;
      }
  }
  if (par.overlapParamGather && par.zero < 3)
    check.refuse("parallel.overlap_param_gather",
                 "overlap_param_gather: DeepSpeed overlaps parameter gathering only under "
                 "ZeRO-3 (its prefetch)");
  if (par.tpCommOverlap)
    check.refuse("parallel.tp_comm_overlap",
                 "tp_comm_overlap: Megatron-DeepSpeed has no tensor-parallel communication "
                 "overlap");
}

void DeepSpeedExport::zeroOptimization(json::OStream &j) const {
  j.attribute("stage", par.zero);
  if (par.zero == 0)
    return;
  j.attribute("overlap_comm", par.overlapGradReduce || par.overlapParamGather);
  j.attribute("contiguous_gradients", true);
  j.attribute("reduce_scatter", true);
  j.attribute("reduce_bucket_size", kReduceBucket);
  if (par.zero < 3) {
    j.attribute("allgather_bucket_size", kAllgatherBucket);
  } else {
    j.attribute("stage3_prefetch_bucket_size", kPrefetchBucket);
    j.attribute("stage3_param_persistence_threshold", kPersistenceThreshold);
  }
}

void DeepSpeedExport::precision(json::OStream &j) const {
  DType dtype = program.model.dtype;
  if (dtype == DType::BF16)
    j.attributeObject("bf16", [&] { j.attribute("enabled", true); });
  if (dtype == DType::FP16)
    // parrun's dynamic loss scale (LossScaler.h), which is DeepSpeed's default.
    j.attributeObject("fp16", [&] {
      j.attribute("enabled", true);
      j.attribute("loss_scale", 0);
      j.attribute("initial_scale_power", 16);
      j.attribute("loss_scale_window", 1000);
      j.attribute("hysteresis", 2);
      j.attribute("min_loss_scale", 1);
    });
  if (dtype != DType::FP32)
    j.attributeObject("data_types",
                      [&] { j.attribute("grad_accum_dtype", toString(train.gradDtype)); });
}

void DeepSpeedExport::optimizer(json::OStream &j) const {
  bool adam = train.optimizer == Optimizer::Adam;
  j.attribute("type", adam ? "AdamW" : "SGD");
  j.attributeObject("params", [&] {
    // The first update runs at the warm-up's first rate (see scheduler()).
    number(j, "lr", firstWarmupRate(train));
    if (adam) {
      j.attributeArray("betas", [&] {
        j.rawValue(jsonNumber(train.beta1));
        j.rawValue(jsonNumber(train.beta2));
      });
      number(j, "eps", train.eps);
    } else {
      number(j, "momentum", train.momentum);
    }
    number(j, "weight_decay", train.weightDecay);
  });
}

/// parc's rate for update k (from 0) is lr * min(1, (k + 1) / W). WarmupLR gives
/// min + (max - min) * min(1, i / N) once the iteration i it has seen is at least 0, and never
/// steps below N = 2: started at i = 0 (last_batch_iteration), update 0 keeps the optimizer's
/// rate lr / W and update k >= 1 gets lr * (k + 1) / W with min = lr / W and N = W - 1 (with
/// W = 2, min = lr).
void DeepSpeedExport::scheduler(json::OStream &j) const {
  const int64_t w = train.warmupSteps;
  j.attribute("type", "WarmupLR");
  j.attributeObject("params", [&] {
    number(j, "warmup_min_lr", w <= 2 ? train.lr : firstWarmupRate(train));
    number(j, "warmup_max_lr", train.lr);
    j.attribute("warmup_num_steps", w <= 2 ? 2 : w - 1);
    j.attribute("warmup_type", "linear");
    if (w > 1)
      j.attribute("last_batch_iteration", 0);
  });
}

std::string DeepSpeedExport::megatronDeepSpeedArgs(llvm::StringRef configPath) const {
  std::string args = "Megatron-DeepSpeed: --deepspeed --deepspeed_config " + configPath.str() +
                     " --zero-stage " + std::to_string(par.zero) +
                     " --tensor-model-parallel-size " + std::to_string(mapping.tp) +
                     " --pipeline-model-parallel-size " + std::to_string(mapping.pp);
  if (mapping.pp == 1)
    args += " --no-pipeline-parallel";
  if (par.sequenceParallel && mapping.tp > 1)
    args += " --sequence-parallel";
  if (par.recompute == Recompute::Selective)
    args += " --recompute-granularity selective";
  else if (par.recompute == Recompute::Full)
    args += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  args += " --micro-batch-size " + std::to_string(mapping.microBatch) + " --global-batch-size " +
          std::to_string(mapping.globalBatch) + " --seed " + std::to_string(train.seed);
  return args + "; the model's arguments as in parc --emit=megatron";
}

std::optional<std::string> DeepSpeedExport::run(llvm::StringRef configPath) {
  checkJob();
  if (check.failed())
    return std::nullopt;
  std::string out;
  llvm::raw_string_ostream os(out);
  json::OStream j(os, 2);
  j.object([&] {
    j.attribute("train_batch_size", mapping.globalBatch);
    j.attribute("train_micro_batch_size_per_gpu", mapping.microBatch);
    j.attribute("gradient_accumulation_steps", mapping.microbatches);
    j.attributeObject("zero_optimization", [&] { zeroOptimization(j); });
    precision(j);
    number(j, "gradient_clipping", train.gradClip);
    j.attributeObject("optimizer", [&] { optimizer(j); });
    j.attributeObject("scheduler", [&] { scheduler(j); });
    if (train.optimizer == Optimizer::SGD && par.zero > 0)
      j.attribute("zero_allow_untested_optimizer", true); // torch's SGD under ZeRO
    j.attribute("steps_per_print", 1);
    j.attribute("comment", megatronDeepSpeedArgs(configPath));
  });
  return os.str() + "\n";
}

} // namespace

std::optional<std::string> exportDeepSpeed(const Program &program, const Mapping &mapping,
                                           llvm::StringRef configPath, DiagnosticEngine &diags) {
  return DeepSpeedExport(program, mapping, diags).run(configPath);
}

} // namespace parc
