//===- Megatron.cpp - The checked job as a Megatron-LM launch script ------===//
//
// The arguments follow Megatron-LM's megatron/training/arguments.py (validate_args) and the
// configuration dataclasses its parser is generated from; scripts/interop-check.sh runs
// Megatron's own parse_args and validate_args on every exported script where a checkout is
// given. Megatron's defaults that differ from parc's (dropout 0.1, weight decay 0.01, a linear
// decay of the learning rate, the loss scale 2^32) are written out, so the script does not
// depend on them.
//
//===----------------------------------------------------------------------===//
#include "ExportChecks.h"
#include "parc/Interop/Export.h"

#include "llvm/Support/raw_ostream.h"

#include <cmath>

namespace parc {

namespace {
using namespace interop;

/// Arguments under a comment: a flag and its value, empty for a switch.
struct ArgGroup {
  explicit ArgGroup(std::string title) : title(std::move(title)) {}

  std::string title;
  std::vector<std::pair<std::string, std::string>> args;

  void add(llvm::StringRef flag, llvm::StringRef value = "") {
    args.emplace_back(flag.str(), value.str());
  }
  void add(llvm::StringRef flag, int64_t value) { add(flag, std::to_string(value)); }
};

class MegatronExport {
public:
  MegatronExport(const Program &program, const Mapping &mapping, DiagnosticEngine &diags)
      : program(program), model(program.model), par(program.parallel), mapping(mapping),
        check(program, "Megatron-LM", diags) {}

  std::optional<std::string> run(llvm::StringRef source);

private:
  void checkModel();
  void checkParallel();
  ArgGroup modelArgs() const;
  ArgGroup vocabArgs() const;
  ArgGroup parallelArgs() const;
  ArgGroup trainingArgs() const;
  /// Megatron's --pipeline-model-parallel-layout for blocks split unevenly: one '|'-separated
  /// entry per virtual stage in Megatron's order (virtual rank major), as parc numbers them.
  std::string pipelineLayout() const;
  bool evenPartition() const;
  bool fsdp() const { return par.zero >= 2; }
  std::string script(llvm::StringRef source, llvm::ArrayRef<ArgGroup> groups) const;

  const Program &program;
  const ModelSpec &model;
  const ParallelSpec &par;
  const Mapping &mapping;
  ExportChecker check;
};

void MegatronExport::checkModel() {
  for (const LayerGroup &g : model.layers) {
    if (g.kind != LayerGroup::Transformer)
      continue;
    if (g.heads != model.heads || g.kvHeads != model.kvHeads || g.ffn != model.ffn ||
        g.mlp != model.mlp)
      check.refuse(g, "layer '" + g.name +
                          "' overrides the model's sizes: Megatron-LM builds every transformer "
                          "layer alike from one --num-attention-heads, --num-query-groups, "
                          "--ffn-hidden-size and activation");
  }
  if (model.mlp == MLPKind::GeGLU)
    check.refuse("model.mlp", "mlp = geglu: Megatron-LM's gated MLP is SwiGLU (--swiglu); it has "
                              "no GeGLU");
  if (model.residual == Residual::Parallel)
    check.refuse("model.residual", "residual = parallel: Megatron-LM's GPT adds attention and MLP "
                                   "in sequence; it has no parallel residual");
  if (model.scaleEmbedding)
    check.refuse("model.scale_embedding",
                 "scale_embedding: Megatron-LM's GPT has no switch that scales the embeddings");
  if (model.position == Position::RoPE && model.ropeTheta != std::floor(model.ropeTheta))
    check.refuse("model.rope_theta", "rope_theta = " + cliNumber(model.ropeTheta) +
                                         ": Megatron-LM's --rotary-base takes an integer");
}

void MegatronExport::checkParallel() {
  check.checkOrder(/*tpPpDpAllowed=*/true);
  check.checkSchedule(/*interleavedAllowed=*/true);
  check.checkGradDtype();
  check.checkExperts();
  if (par.overlapParamGather && (par.zero == 0 || !par.overlapGradReduce))
    check.refuse("parallel.overlap_param_gather",
                 "overlap_param_gather: Megatron-LM overlaps the parameter all-gather only of a "
                 "sharded optimizer (zero >= 1) and only with overlap_grad_reduce");
  if (par.tpCommOverlap && (mapping.tp == 1 || !par.sequenceParallel))
    check.refuse("parallel.tp_comm_overlap",
                 "tp_comm_overlap: Megatron-LM overlaps tensor-parallel communication only "
                 "under sequence parallelism, with tp > 1");
}

ArgGroup MegatronExport::modelArgs() const {
  ArgGroup g{"The model: parc's " + model.name};
  g.add("--num-layers", model.numBlocks());
  g.add("--hidden-size", model.hidden);
  g.add("--ffn-hidden-size", model.ffn);
  g.add("--num-attention-heads", model.heads);
  if (model.kvHeads != model.heads) {
    g.add("--group-query-attention");
    g.add("--num-query-groups", model.kvHeads);
  }
  if (model.headDim)
    g.add("--kv-channels", model.headDim);
  g.add("--seq-length", model.seq);
  g.add("--max-position-embeddings", model.positions());
  g.add("--normalization", model.norm == Norm::RMSNorm ? "RMSNorm" : "LayerNorm");
  g.add("--norm-epsilon", cliNumber(model.normEps));
  if (model.mlp == MLPKind::SwiGLU)
    g.add("--swiglu");
  else if (model.gelu == GELUForm::Tanh)
    g.add("--openai-gelu");
  if (model.position == Position::RoPE) {
    g.add("--position-embedding-type", "rope");
    g.add("--rotary-base", int64_t(model.ropeTheta));
    g.add("--rotary-percent", cliNumber(model.rotaryFraction));
  } else {
    g.add("--position-embedding-type", "learned_absolute");
  }
  if (!model.tiedHead())
    g.add("--untie-embeddings-and-output-weights");
  if (model.bias != LinearBias::All)
    g.add("--disable-bias-linear");
  if (model.bias == LinearBias::QKV)
    g.add("--add-qkv-bias");
  g.add("--hidden-dropout", cliNumber(model.dropout));
  g.add("--attention-dropout", cliNumber(model.dropout));
  g.add("--attention-backend", model.attention == Attention::Flash ? "flash" : "unfused");
  g.add("--init-method-std", "0.02");
  return g;
}

ArgGroup MegatronExport::vocabArgs() const {
  ArgGroup g{"The vocabulary: the tokenizer's " + std::to_string(model.vocab) +
             " tokens, padded to " + std::to_string(mapping.paddedVocab) +
             " (a multiple of 128 x tp) as parc pads it"};
  g.add("--make-vocab-size-divisible-by", 128);
  g.add("--padded-vocab-size", mapping.paddedVocab);
  g.add("--tokenizer-type", "HuggingFaceTokenizer");
  g.add("--tokenizer-model", "\"$TOKENIZER_MODEL\"");
  return g;
}

bool MegatronExport::evenPartition() const {
  for (const auto &[first, last] : mapping.partition.blocks)
    if (last - first != model.numBlocks() / int64_t(mapping.partition.blocks.size()))
      return false;
  return true;
}

std::string MegatronExport::pipelineLayout() const {
  std::string layout;
  const auto &blocks = mapping.partition.blocks;
  for (size_t v = 0; v < blocks.size(); ++v) {
    layout += v ? "|" : "E";
    layout += "t*" + std::to_string(blocks[v].second - blocks[v].first);
    if (v + 1 == blocks.size())
      layout += "L";
  }
  return layout;
}

ArgGroup MegatronExport::parallelArgs() const {
  ArgGroup g{"Parallelism: tp " + std::to_string(mapping.tp) + " x pp " +
             std::to_string(mapping.pp) + " x dp " + std::to_string(mapping.dp) +
             (mapping.cp > 1 ? " x cp " + std::to_string(mapping.cp) : "") +
             ", ranks in parc's order " + par.orderText() + " (Megatron's " +
             (ppBeforeDp(par) ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp") + ")"};
  g.add("--tensor-model-parallel-size", mapping.tp);
  g.add("--pipeline-model-parallel-size", mapping.pp);
  if (mapping.cp > 1)
    g.add("--context-parallel-size", mapping.cp); // ring attention over p2p (--cp-comm-type p2p)
  if (ppBeforeDp(par) && mapping.pp > 1 && mapping.dp > 1)
    g.add("--use-tp-pp-dp-mapping");
  if (!evenPartition())
    g.add("--pipeline-model-parallel-layout", "\"" + pipelineLayout() + "\"");
  else if (mapping.chunks > 1)
    g.add("--num-layers-per-virtual-pipeline-stage",
          model.numBlocks() / (mapping.pp * mapping.chunks));
  if (par.sequenceParallel && mapping.tp > 1)
    g.add("--sequence-parallel");
  if (par.zero == 1) {
    g.add("--use-distributed-optimizer");
  } else if (fsdp()) {
    g.add("--use-megatron-fsdp");
    g.add("--use-distributed-optimizer");
    g.add("--data-parallel-sharding-strategy", par.zero == 2 ? "optim_grads" : "optim_grads_params");
    g.add("--ckpt-format", "fsdp_dtensor");
  }
  if (par.recompute == Recompute::Selective) {
    g.add("--recompute-granularity", "selective");
  } else if (par.recompute == Recompute::Full) {
    g.add("--recompute-granularity", "full");
    g.add("--recompute-method", "uniform");
    g.add("--recompute-num-layers", 1);
  }
  if (par.overlapGradReduce)
    g.add("--overlap-grad-reduce");
  if (par.overlapParamGather)
    g.add("--overlap-param-gather");
  if (par.tpCommOverlap)
    g.add("--tp-comm-overlap");
  return g;
}

ArgGroup MegatronExport::trainingArgs() const {
  const TrainSpec &t = program.train;
  ArgGroup g{"Training: batch, precision, optimizer, learning-rate schedule"};
  g.add("--micro-batch-size", mapping.microBatch);
  g.add("--global-batch-size", mapping.globalBatch);
  if (model.dtype == DType::BF16) {
    g.add("--bf16");
    g.add(t.gradDtype == DType::FP32 ? "--accumulate-allreduce-grads-in-fp32"
                                     : "--grad-reduce-in-bf16");
  } else if (model.dtype == DType::FP16) {
    // parrun's dynamic loss scale (LossScaler.h), which is DeepSpeed's; Megatron starts at 2^32.
    g.add("--fp16");
    if (t.gradDtype == DType::FP32)
      g.add("--accumulate-allreduce-grads-in-fp32");
    g.add("--initial-loss-scale", 65536);
    g.add("--min-loss-scale", 1);
    g.add("--loss-scale-window", 1000);
    g.add("--hysteresis", 2);
  }
  if (t.optimizer == Optimizer::Adam) {
    g.add("--optimizer", "adam");
    g.add("--adam-beta1", cliNumber(t.beta1));
    g.add("--adam-beta2", cliNumber(t.beta2));
    g.add("--adam-eps", cliNumber(t.eps));
  } else {
    g.add("--optimizer", "sgd");
    g.add("--sgd-momentum", cliNumber(t.momentum));
  }
  g.add("--weight-decay", cliNumber(t.weightDecay));
  g.add("--clip-grad", cliNumber(t.gradClip));
  g.add("--lr", cliNumber(t.lr));
  g.add("--min-lr", 0);
  g.add("--lr-decay-style", "constant");
  // Megatron's warm-up gives iteration k init + (lr - init) * k / W'; parc's lr * (k + 1) / W
  // is that with init = lr / W and W' = W - 1.
  if (t.warmupSteps > 1) {
    g.add("--lr-warmup-iters", t.warmupSteps - 1);
    g.add("--lr-warmup-init", cliNumber(firstWarmupRate(t)));
  }
  g.add("--train-iters", t.steps);
  g.add("--seed", t.seed);
  return g;
}

std::string MegatronExport::script(llvm::StringRef source,
                                   llvm::ArrayRef<ArgGroup> groups) const {
  const ClusterSpec &c = program.cluster;
  bool multiNode = c.nodes > 1;
  std::string out;
  llvm::raw_string_ostream os(out);
  os << "#!/usr/bin/env bash\n"
     << "# Megatron-LM pretraining of " << model.name << " on " << c.name << " (" << c.nodes
     << " x " << c.gpusPerNode << " GPUs),\n# written by parc --emit=megatron from " << source
     << ". Run it on every node; with --print-args\n# it prints Megatron's arguments instead.\n"
     << "set -euo pipefail\n\n"
     << "# Placeholders: set them before running.\n"
     << "MEGATRON_LM=${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (where "
        "pretrain_gpt.py is)}\n"
     << "DATA_PATH=${DATA_PATH:?set DATA_PATH to the prefix of a Megatron .bin/.idx dataset}\n"
     << "TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer of "
     << model.vocab << " tokens}\n";
  if (multiNode)
    os << "MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}\n"
       << "NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this node, 0 to " << c.nodes - 1
       << "}\n";
  else
    os << "MASTER_ADDR=${MASTER_ADDR:-localhost}\nNODE_RANK=${NODE_RANK:-0}\n";
  os << "MASTER_PORT=${MASTER_PORT:-6000}\n\n";
  if (fsdp())
    os << "# Megatron-FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1.\n"
       << "unset CUDA_DEVICE_MAX_CONNECTIONS\n\n";
  else if (mapping.tp > 1)
    os << "# Megatron asserts it with tensor parallelism on GPUs before Blackwell: one queue "
          "keeps\n# each tensor-parallel collective ahead of the GEMM that waits for it.\n"
       << "export CUDA_DEVICE_MAX_CONNECTIONS=1\n\n";
  os << "ARGS=(\n";
  for (const ArgGroup &g : groups) {
    os << "  # " << g.title << "\n";
    for (const auto &[flag, value] : g.args)
      os << "  " << flag << (value.empty() ? "" : " ") << value << "\n";
  }
  os << "  # Data: training only, no evaluation\n"
     << "  --data-path \"$DATA_PATH\"\n  --split 100,0,0\n  --eval-iters 0\n"
     << "  --log-interval 1\n)\n\n"
     << "if [[ \"${1:-}\" == --print-args ]]; then\n  printf '%s\\n' \"${ARGS[@]}\"\n"
     << "  exit 0\nfi\n"
     << "exec torchrun --nnodes " << c.nodes << " --nproc-per-node " << c.gpusPerNode
     << " --node-rank \"$NODE_RANK\" \\\n"
     << "  --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\\n"
     << "  \"$MEGATRON_LM/pretrain_gpt.py\" \"${ARGS[@]}\"\n";
  return os.str();
}

std::optional<std::string> MegatronExport::run(llvm::StringRef source) {
  checkModel();
  checkParallel();
  if (check.failed())
    return std::nullopt;
  return script(source, {modelArgs(), vocabArgs(), parallelArgs(), trainingArgs()});
}

} // namespace

std::optional<std::string> exportMegatron(const Program &program, const Mapping &mapping,
                                          llvm::StringRef source, DiagnosticEngine &diags) {
  return MegatronExport(program, mapping, diags).run(source);
}

} // namespace parc
