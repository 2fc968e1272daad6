#include "Schema.h"
#include "parc/Sema/GPUKinds.h"

#include "parc/Support/Limits.h"

namespace parc::sema {

const FieldSpec *BlockSchema::field(llvm::StringRef name) const {
  for (const FieldSpec &f : fields)
    if (f.name == name)
      return &f;
  return nullptr;
}

const BlockSchema *BlockSchema::nestedSchema(llvm::StringRef name) const {
  for (const BlockSchema *b : nested)
    if (b->kind == name)
      return b;
  return nullptr;
}

std::vector<llvm::StringRef> BlockSchema::fieldNames() const {
  std::vector<llvm::StringRef> out;
  for (const FieldSpec &f : fields)
    out.push_back(f.name);
  return out;
}

std::vector<llvm::StringRef> BlockSchema::nestedNames() const {
  std::vector<llvm::StringRef> out;
  for (const BlockSchema *b : nested)
    out.push_back(b->kind);
  return out;
}

namespace {
using FT = FieldType;
const std::vector<llvm::StringRef> kDTypes = {"fp32", "bf16", "fp16"};

/// A count of at most `max` (docs/language.md, Limits; parc/Support/Limits.h).
FieldSpec count(llvm::StringRef name, bool required, llvm::StringRef def, int64_t max) {
  return {name, FT::Count, required, def, {}, {}, max};
}
FieldSpec quantity(llvm::StringRef name, Dimension dim, bool required,
                   llvm::StringRef def = "") {
  return {name, FT::Quantity, required, def, dim, {}};
}
FieldSpec enumeration(llvm::StringRef name, std::vector<llvm::StringRef> words,
                      llvm::StringRef def) {
  return {name, FT::Enum, def.empty(), def, {}, std::move(words)};
}
FieldSpec real(llvm::StringRef name, llvm::StringRef def) {
  return {name, FT::Real, false, def, {}, {}};
}
FieldSpec flag(llvm::StringRef name, llvm::StringRef def = "false") {
  return {name, FT::Bool, false, def, {}, {}};
}
FieldSpec natural(llvm::StringRef name, llvm::StringRef def, int64_t max) {
  return {name, FT::Natural, false, def, {}, {}, max};
}
/// The mixture-of-experts fields: the model's defaults for every transformer layer, and what
/// `transformer(...)` may override (with no defaults there: an unwritten override inherits).
std::vector<FieldSpec> moeFields(bool withDefaults) {
  auto def = [&](llvm::StringRef text) { return withDefaults ? text : llvm::StringRef(); };
  std::vector<FieldSpec> fields = {
      natural("experts", def("0"), limits::MaxExperts),
      count("top_k", false, def("2"), limits::MaxExperts),
      count("moe_ffn", false, def("ffn"), limits::MaxFFN),
      natural("shared_experts", def("0"), limits::MaxSharedExperts),
      {"router", FT::Enum, false, def("softmax"), {}, {"softmax"}},
      flag("normalize_top_k", def("true")),
      real("aux_loss", def("0.01")),
      {"capacity", FT::RealOrWord, false, def("dropless"), {}, {"dropless"}},
  };
  return fields;
}
/// A parallel field the search may choose (`auto`).
FieldSpec searchable(FieldSpec spec) {
  spec.searchable = true;
  return spec;
}
/// An enumeration without a default: the field may be left out.
FieldSpec optionalEnum(llvm::StringRef name, std::vector<llvm::StringRef> words) {
  return {name, FT::Enum, false, "", {}, std::move(words)};
}
std::vector<llvm::StringRef> mlpWords() {
  llvm::ArrayRef<llvm::StringRef> words = mlpKindWords();
  return {words.begin(), words.end()};
}
std::vector<llvm::StringRef> gpuKindWords() {
  std::vector<llvm::StringRef> words;
  for (const GPUDatasheet &row : gpuDatasheets())
    words.push_back(row.spelling);
  return words;
}
} // namespace

const BlockSchema &schemaFor(ast::Block::Kind kind) {
  static const BlockSchema model = [] {
    BlockSchema schema{"model",
      {
          enumeration("dtype", kDTypes, ""),
          count("vocab", true, "", limits::MaxVocab),
          count("seq", true, "", limits::MaxSeq),
          count("hidden", true, "", limits::MaxHidden),
          count("heads", true, "", limits::MaxHeads),
          count("kv_heads", false, "heads", limits::MaxHeads),
          count("ffn", true, "", limits::MaxFFN),
          enumeration("norm", {"layernorm", "rmsnorm"}, "layernorm"),
          enumeration("mlp", mlpWords(), "gelu"),
          enumeration("position", {"learned", "rope"}, "learned"),
          enumeration("attention", {"flash", "standard"}, "flash"),
          real("dropout", "0"),
          // What a Hugging Face config can say beyond the above (docs/interop.md).
          count("head_dim", false, "", limits::MaxHeadDim),
          optionalEnum("bias", {"all", "qkv", "none"}),
          enumeration("gelu_approx", {"none", "tanh"}, "none"),
          enumeration("residual", {"sequential", "parallel"}, "sequential"),
          real("norm_eps", "1e-5"),
          real("rope_theta", "10000"),
          real("rotary_fraction", "1"),
          count("max_positions", false, "seq", limits::MaxSeq),
          flag("scale_embedding"),
      },
      {}};
    for (FieldSpec &f : moeFields(true))
      schema.fields.push_back(std::move(f));
    return schema;
  }();
  // Fields a datasheet can fill are optional here; Sema completes them from `kind` and
  // reports the ones still missing (completeFromDatasheet).
  static const BlockSchema gpu{
      "gpu",
      {
          optionalEnum("kind", gpuKindWords()),
          quantity("memory", Dimension::size(), false),
          quantity("flops", Dimension::flopRate(), false),
          quantity("flops_bf16", Dimension::flopRate(), false),
          quantity("flops_fp16", Dimension::flopRate(), false),
          quantity("flops_fp32", Dimension::flopRate(), false),
          quantity("flops_tf32", Dimension::flopRate(), false),
          quantity("memory_bandwidth", Dimension::bandwidth(), false),
          count("sms", false, "", limits::MaxGpuSMs),
          {"reserve", FT::Quantity, false, "1 GiB", Dimension::size(), {}, 0, /*allowZero=*/true},
      },
      {}};
  static const BlockSchema intraNode{"intra_node",
                                     {
                                         enumeration("kind", {"nvlink", "pcie"}, "nvlink"),
                                         quantity("bandwidth", Dimension::bandwidth(), false),
                                         quantity("latency", Dimension::time(), false),
                                     },
                                     {}};
  static const BlockSchema interNode{"inter_node",
                                     {
                                         quantity("bandwidth", Dimension::bandwidth(), true),
                                         quantity("latency", Dimension::time(), true),
                                         count("nics", false, "", limits::MaxGpusPerNode),
                                     },
                                     {}};
  static const BlockSchema cluster{"cluster",
                                   {count("nodes", true, "", limits::MaxNodes),
                                    count("gpus_per_node", true, "", limits::MaxGpusPerNode)},
                                   {&gpu, &intraNode, &interNode}};
  static const BlockSchema parallel{
      "parallel",
      {
          searchable(count("tp", false, "1", limits::MaxWorld)),
          searchable(count("pp", false, "1", limits::MaxWorld)),
          searchable({"dp", FT::CountOrAuto, false, "auto", {}, {}, limits::MaxWorld}),
          searchable(count("cp", false, "1", limits::MaxWorld)),
          searchable(count("ep", false, "1", limits::MaxWorld)),
          searchable({"order", FT::Order, false, "tp-cp-ep-dp-pp", {}, {}}),
          searchable(count("micro_batch", false, "1", limits::MaxMicroBatch)),
          count("global_batch", true, "", limits::MaxGlobalBatch),
          searchable({"schedule", FT::Schedule, false, "1f1b", {}, {}}),
          searchable({"zero", FT::Natural, false, "0", {}, {}, 3}),
          searchable(enumeration("recompute", {"none", "selective", "full"}, "none")),
          searchable({"sequence_parallel", FT::Bool, false, "false", {}, {}}),
          {"stage_layers", FT::CountList, false, "", {}, {}},
          flag("overlap_grad_reduce"),
          flag("overlap_param_gather"),
          flag("tp_comm_overlap"),
          count("bucket_size", false, "40000000", limits::MaxBucketSize),
      },
      {}};
  static const BlockSchema train{
      "train",
      {
          enumeration("optimizer", {"adam", "sgd"}, "adam"),
          real("lr", "3e-4"),
          count("steps", false, "10", 0),
          {"seed", FT::Natural, false, "1234", {}, {}},
          real("weight_decay", "0"),
          real("grad_clip", "1.0"),
          real("beta1", "0.9"),
          real("beta2", "0.95"),
          real("eps", "1e-8"),
          real("momentum", "0"),
          {"warmup_steps", FT::Natural, false, "0", {}, {}},
          enumeration("grad_dtype", kDTypes, "fp32"),
          real("tokens", ""),
      },
      {}};
  switch (kind) {
  case ast::Block::Model:
    return model;
  case ast::Block::Cluster:
    return cluster;
  case ast::Block::Parallel:
    return parallel;
  case ast::Block::Train:
  case ast::Block::Nested:
    break;
  }
  return train;
}

const BlockSchema &layerOverrideSchema() {
  static const BlockSchema overrides = [] {
    BlockSchema schema{"transformer",
                       {
                           count("heads", false, "", limits::MaxHeads),
                           count("kv_heads", false, "", limits::MaxHeads),
                           count("ffn", false, "", limits::MaxFFN),
                           enumeration("mlp", mlpWords(), "gelu"),
                       },
                       {}};
    for (FieldSpec &f : moeFields(false))
      schema.fields.push_back(std::move(f));
    return schema;
  }();
  return overrides;
}

llvm::ArrayRef<llvm::StringRef> layerKinds() {
  static const llvm::StringRef kinds[] = {"embedding", "transformer", "lm_head"};
  return kinds;
}

} // namespace parc::sema
