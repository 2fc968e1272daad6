//===- HFConfig.cpp - A Hugging Face config.json as a .par model block ---===//
//
// One reader per family of transformers architectures: the Llama family (Llama, Mistral,
// Qwen2, Gemma, Mixtral), GPT-2 and GPT-NeoX. Each reads the
// keys of its configuration class with transformers' defaults for the keys a file leaves out,
// so that the block describes the model transformers would build from the same file.
//
//===----------------------------------------------------------------------===//
#include "HFConfigInternal.h"

#include "parc/Support/CheckedInt.h"
#include "parc/Support/FileInput.h"
#include "parc/Support/Limits.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <cmath>

namespace parc {

namespace {
using namespace hf;

/// The fields of the block in the language's order (docs/language.md), whatever order the
/// readers set them in.
constexpr llvm::StringLiteral kFieldOrder[] = {
    "dtype",    "vocab",      "seq",        "hidden",          "heads",         "kv_heads",
    "head_dim", "ffn",        "norm",       "norm_eps",        "mlp",           "gelu_approx",
    "position", "rope_theta", "rotary_fraction", "max_positions", "bias", "residual",
    "scale_embedding", "dropout", "experts", "top_k", "normalize_top_k", "aux_loss"};

//===----------------------------------------------------------------------===//
// Pieces every family shares
//===----------------------------------------------------------------------===//

void readDType(ModelBuilder &b) {
  Config &c = b.config;
  llvm::StringRef key = c.get("torch_dtype") ? "torch_dtype" : "dtype";
  std::optional<std::string> dtype = c.word(key);
  c.accept({"torch_dtype", "dtype"});
  static const std::pair<llvm::StringRef, llvm::StringRef> names[] = {
      {"bfloat16", "bf16"}, {"float16", "fp16"}, {"float32", "fp32"}};
  for (auto [hf, par] : names)
    if (dtype && *dtype == hf)
      return b.set("dtype", par, key.str() + " = " + hf.str());
  if (dtype)
    return c.error(key, "'" + key + "' = " + *dtype +
                            " is not a training dtype parc has; use bfloat16, float16 or float32");
  b.set("dtype", "bf16", "not in the config: mixed precision in bf16");
}

/// Dropout probabilities: parc's one `dropout` is the hidden and the attention dropout.
void readDropout(ModelBuilder &b, std::initializer_list<llvm::StringRef> keys) {
  std::optional<double> common;
  llvm::StringRef first;
  for (llvm::StringRef key : keys) {
    double p = b.config.number(key).value_or(0);
    if (!common) {
      common = p;
      first = key;
    } else if (p != *common) {
      return b.config.error(key, "'" + key + "' = " + formatNumber(p) + " differs from '" +
                                     first + "' = " + formatNumber(*common) +
                                     ": parc has one dropout probability for all of them");
    }
  }
  std::string from;
  for (llvm::StringRef key : keys)
    from += (from.empty() ? "" : ", ") + key.str();
  if (common && *common > 0)
    b.set("dropout", formatNumber(*common), from);
}

void readInitializerRange(ModelBuilder &b) {
  std::optional<double> std = b.config.number("initializer_range");
  if (std && *std != 0.02)
    b.config.warning("initializer_range",
                     "initializer_range = " + formatNumber(*std) +
                         ": parc initialises weights with a standard deviation of 0.02");
}

/// `seq` and `max_positions` from the longest sequence the model takes; the training length
/// is the user's to choose, so the block says where its seq came from.
void readPositions(ModelBuilder &b, llvm::StringRef key) {
  int64_t positions = b.config.required(key);
  b.set("seq", positions, key.str() + "; set the training sequence length here");
  b.set("max_positions", positions, key);
}

/// RoPE's base and rotated share, from rope_theta / rope_scaling (transformers 4) or
/// rope_parameters (transformers 5). Scaled frequencies are another model.
void readRope(ModelBuilder &b, double theta, llvm::StringRef thetaKey, double fraction,
              llvm::StringRef fractionKey) {
  Config &c = b.config;
  std::string thetaFrom = thetaKey.str() + " left out: " + formatNumber(theta);
  std::string fractionFrom = fractionKey.str() + " left out: " + formatNumber(fraction);
  if (std::optional<double> t = c.number(thetaKey))
    theta = *t, thetaFrom = thetaKey.str();
  if (std::optional<double> f = fractionKey.empty() ? std::nullopt : c.number(fractionKey))
    fraction = *f, fractionFrom = fractionKey.str();
  for (llvm::StringRef key : {"rope_scaling", "rope_parameters"}) {
    const llvm::json::Object *rope = c.objectAt(key);
    if (!rope)
      continue;
    auto type = rope->getString("rope_type");
    if (!type)
      type = rope->getString("type");
    if (type && *type != "default")
      return c.error(key, "'" + key + "' has rope_type = " + *type +
                              ": parc's rotary embedding has no frequency scaling");
    if (auto t = rope->getNumber("rope_theta"))
      theta = *t, thetaFrom = key.str() + ".rope_theta";
    if (auto f = rope->getNumber("partial_rotary_factor"))
      fraction = *f, fractionFrom = key.str() + ".partial_rotary_factor";
  }
  b.set("position", "rope", "rotary embeddings");
  b.set("rope_theta", formatNumber(theta), thetaFrom);
  if (fraction != 1)
    b.set("rotary_fraction", formatNumber(fraction), fractionFrom);
}

/// The keys that hold a family's sizes; `ffn` empty when the family derives it.
struct SizeKeys {
  llvm::StringRef vocab, positions, hidden, heads, ffn, layers, norm, normEps;
};

/// dtype, the sizes, and the norm: what every family says in its own words.
void readSizes(ModelBuilder &b, const SizeKeys &k) {
  Config &c = b.config;
  readDType(b);
  b.set("vocab", c.required(k.vocab), k.vocab);
  readPositions(b, k.positions);
  b.set("hidden", c.required(k.hidden), k.hidden);
  b.set("heads", c.required(k.heads), k.heads);
  b.set("kv_heads", b.value("heads"), "multi-head attention");
  if (!k.ffn.empty())
    b.set("ffn", c.required(k.ffn), k.ffn);
  b.model.layers = c.required(k.layers);
  b.model.layersFrom = k.layers.str();
  b.set("norm", k.norm, k.norm == "rmsnorm" ? "RMSNorm" : "LayerNorm");
  if (std::optional<double> eps = c.number(k.normEps))
    b.set("norm_eps", formatNumber(*eps), k.normEps);
}

void readTied(ModelBuilder &b, bool byDefault) {
  std::optional<bool> tied = b.config.flag("tie_word_embeddings");
  b.model.tied = tied.value_or(byDefault);
  b.model.tiedFrom = tied ? "tie_word_embeddings = " + std::string(*tied ? "true" : "false")
                          : "tie_word_embeddings left out: " +
                                std::string(byDefault ? "tied" : "untied") + " by default";
}

/// A switch whose other value changes the model in a way parc cannot say.
void requireFlag(Config &c, llvm::StringRef key, bool expected, llvm::StringRef why) {
  std::optional<bool> v = c.flag(key);
  if (v && *v != expected)
    c.error(key, "'" + key + "' = " + (*v ? "true" : "false") + ": " + why);
}

/// Keys no architecture's math depends on.
void acceptCommonKeys(Config &c) {
  c.accept({"architectures", "model_type", "_name_or_path", "transformers_version",
            "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "return_dict",
            "output_attentions", "output_hidden_states", "tokenizer_class", "torchscript",
            "task_specific_params", "_attn_implementation_autoset", "id2label", "label2id"});
}

//===----------------------------------------------------------------------===//
// The Llama family: Llama, Mistral, Qwen2, Gemma, Mixtral
//===----------------------------------------------------------------------===//

/// What every member of the family has: RMSNorm, rotary embeddings, a gated MLP.
void readLlamaCore(ModelBuilder &b) {
  Config &c = b.config;
  readSizes(b, {"vocab_size", "max_position_embeddings", "hidden_size", "num_attention_heads",
                "intermediate_size", "num_hidden_layers", "rmsnorm", "rms_norm_eps"});
  if (std::optional<int64_t> kv = c.count("num_key_value_heads"))
    b.set("kv_heads", *kv, "num_key_value_heads");
  int64_t hidden = b.integer("hidden"), heads = b.integer("heads");
  std::optional<int64_t> headDim = c.count("head_dim");
  if (headDim && heads && (hidden % heads != 0 || *headDim != hidden / heads))
    b.set("head_dim", *headDim, "head_dim");
  readRope(b, 10000, "rope_theta", 1, "");
  readDropout(b, {"attention_dropout"});
  readInitializerRange(b);
}

/// The MLP's activation, `key` of the config: a gated MLP takes SiLU (SwiGLU) or a GELU
/// (GeGLU), an ungated one a GELU. Gemma's legacy "gelu" means the tanh approximation.
void readActivation(ModelBuilder &b, llvm::StringRef key, llvm::StringRef byDefault, bool gated,
                    bool legacyGeluIsTanh = false) {
  std::string act = b.config.word(key).value_or(byDefault.str());
  std::string from = key.str() + " = " + act;
  if (gated && (act == "silu" || act == "swish"))
    return b.set("mlp", "swiglu", from);
  static const std::pair<llvm::StringRef, bool> gelus[] = {
      {"gelu", false}, {"gelu_new", true}, {"gelu_fast", true}, {"gelu_pytorch_tanh", true}};
  for (auto [name, tanh] : gelus) {
    if (act != name)
      continue;
    bool legacy = act == "gelu" && legacyGeluIsTanh;
    b.set("mlp", gated ? "geglu" : "gelu", from);
    b.set("gelu_approx", tanh || legacy ? "tanh" : "none",
          from + (legacy ? " (Gemma's legacy name of the tanh approximation, as transformers "
                           "reads it)"
                         : ""));
    return;
  }
  b.config.error(key, "'" + key + "' = " + act + " has no parc equivalent; the MLP takes " +
                          (gated ? "silu, " : "") +
                          "gelu, gelu_new, gelu_fast or gelu_pytorch_tanh");
}

/// q, k, v and o share one switch (attention_bias), the MLP another (mlp_bias).
void readAttentionBias(ModelBuilder &b, bool hasMLPKey) {
  Config &c = b.config;
  bool attention = c.flag("attention_bias").value_or(false);
  bool mlp = hasMLPKey && c.flag("mlp_bias").value_or(false);
  if (attention != mlp)
    return c.error(attention ? "attention_bias" : "mlp_bias",
                   std::string("biases on ") + (attention ? "the attention" : "the MLP") +
                       " only have no parc equivalent: bias takes all, qkv or none");
  b.set("bias", attention ? "all" : "none",
        hasMLPKey ? "attention_bias, mlp_bias" : "attention_bias");
}

/// Sliding-window attention equals full causal attention up to the window: the block keeps
/// seq within it and says so.
void limitToWindow(ModelBuilder &b, llvm::StringRef key, int64_t window) {
  if (window >= b.integer("max_positions"))
    return;
  b.set("seq", window, key.str() + ": where sliding-window attention equals parc's full one");
  b.config.warning(key, "'" + key + "' = " + std::to_string(window) +
                            " is not represented: parc attends over the whole causal context, "
                            "so the block sets seq = " +
                            std::to_string(window) +
                            ", where the two agree; a longer seq is a different model");
  b.note("sliding-window attention (" + key.str() + " = " + std::to_string(window) +
         ") is not represented: keep seq <= " + std::to_string(window));
}

void readLlama(ModelBuilder &b) {
  readLlamaCore(b);
  readActivation(b, "hidden_act", "silu", true);
  readAttentionBias(b, true);
  if (std::optional<int64_t> tp = b.config.count("pretraining_tp"); tp && *tp != 1)
    b.config.warning("pretraining_tp", "pretraining_tp = " + std::to_string(*tp) +
                                           " splits transformers' matmuls to mimic Megatron's "
                                           "rounding; parc computes them whole");
  readTied(b, false);
}

/// Mistral's blocks, which Mixtral shares: Llama's with SiLU, no biases and a sliding window
/// that must cover the sequence.
void readMistralBlocks(ModelBuilder &b, llvm::StringRef noBiases) {
  readLlamaCore(b);
  readActivation(b, "hidden_act", "silu", true);
  b.set("bias", "none", noBiases);
  if (std::optional<int64_t> window = b.config.count("sliding_window"))
    limitToWindow(b, "sliding_window", *window);
}

void readMistral(ModelBuilder &b) {
  readMistralBlocks(b, "Mistral has no biases");
  readTied(b, false);
}

void readQwen2(ModelBuilder &b) {
  Config &c = b.config;
  readLlamaCore(b);
  readActivation(b, "hidden_act", "silu", true);
  b.set("bias", "qkv", "Qwen2's q, k and v projections have biases");
  bool sliding = c.flag("use_sliding_window").value_or(false);
  c.accept({"sliding_window", "max_window_layers"}); // both apply only with use_sliding_window
  requireFlag(c, "use_mrope", false, "multimodal rotary embeddings have no parc equivalent");
  if (sliding)
    c.error("use_sliding_window", "use_sliding_window = true (sliding-window attention above "
                                  "max_window_layers) has no parc equivalent");
  if (const llvm::json::Value *types = c.get("layer_types")) {
    const llvm::json::Array *list = types->getAsArray();
    bool full = list && llvm::all_of(*list, [](const llvm::json::Value &t) {
                  return t.getAsString() == llvm::StringRef("full_attention");
                });
    if (!full)
      c.error("layer_types", "layer_types other than full_attention have no parc equivalent");
  }
  readTied(b, false);
}

void readGemma(ModelBuilder &b) {
  Config &c = b.config;
  readLlamaCore(b);
  // transformers before 4.42 read hidden_activation; later releases hidden_act, where
  // Gemma's "gelu" means the tanh approximation.
  readActivation(b, c.get("hidden_activation") ? "hidden_activation" : "hidden_act",
                 "gelu_pytorch_tanh", true, true);
  c.accept({"hidden_act", "hidden_activation"});
  readAttentionBias(b, false);
  b.set("scale_embedding", "true", "Gemma scales the embeddings by sqrt(hidden_size)");
  b.note("Gemma's RMSNorm scales by (1 + weight): parc's weight is 1 + Gemma's, the same "
         "function; a checkpoint converts by adding one to every norm weight");
  readTied(b, true);
}

/// Mixtral: Mistral's blocks with a sparse MoE MLP of num_local_experts SwiGLU experts as
/// wide as intermediate_size, num_experts_per_tok of them per token, their softmax weights
/// renormalised to sum to one (MixtralSparseMoeBlock), no capacity limit, no biases.
void readMixtral(ModelBuilder &b) {
  Config &c = b.config;
  readMistralBlocks(b, "Mixtral has no biases");
  c.accept({"sliding_window"});
  std::optional<int64_t> experts = c.count("num_local_experts");
  b.set("experts", experts.value_or(8),
        experts ? "num_local_experts" : "num_local_experts left out: 8");
  std::optional<int64_t> topK = c.count("num_experts_per_tok");
  b.set("top_k", topK.value_or(2), topK ? "num_experts_per_tok" : "num_experts_per_tok left "
                                                                  "out: 2");
  b.set("normalize_top_k", "true", "Mixtral renormalises the top-k routing weights");
  std::optional<double> aux = c.number("router_aux_loss_coef");
  b.set("aux_loss", formatNumber(aux.value_or(0.001)),
        aux ? "router_aux_loss_coef" : "router_aux_loss_coef left out: 0.001");
  // transformers adds the load-balancing loss only when the router's logits are returned.
  c.accept({"output_router_logits"});
  if (!c.flag("output_router_logits").value_or(false))
    b.note("output_router_logits = false: transformers trains without the load-balancing "
           "loss; parc adds it with the coefficient aux_loss (set aux_loss = 0 to match)");
  if (std::optional<double> jitter = c.number("router_jitter_noise"); jitter && *jitter != 0)
    c.error("router_jitter_noise", "'router_jitter_noise' = " + formatNumber(*jitter) +
                                       ": parc's router has no multiplicative jitter");
  readTied(b, false);
}

//===----------------------------------------------------------------------===//
// GPT-2 and GPT-NeoX
//===----------------------------------------------------------------------===//

void readGPT2(ModelBuilder &b) {
  Config &c = b.config;
  readSizes(b, {"vocab_size", "n_positions", "n_embd", "n_head", "", "n_layer", "layernorm",
                "layer_norm_epsilon"});
  c.accept({"n_ctx"}); // the old name of n_positions
  std::optional<int64_t> inner = c.count("n_inner");
  std::optional<int64_t> fourTimes = checkedMul(4, b.integer("hidden"));
  if (!inner && !fourTimes)
    c.error("n_embd", "'n_embd' = " + b.value("hidden") +
                          ": without n_inner the MLP is 4 * n_embd wide, which overflows");
  b.set("ffn", inner.value_or(fourTimes.value_or(0)),
        inner ? "n_inner" : "n_inner left out: 4 * n_embd");
  readActivation(b, "activation_function", "gelu_new", false);
  b.set("position", "learned", "learned positions (wpe)");
  b.set("bias", "all", "every Conv1D has a bias");
  readDropout(b, {"resid_pdrop", "embd_pdrop", "attn_pdrop"});
  readInitializerRange(b);
  requireFlag(c, "scale_attn_weights", true, "attention without the 1 / sqrt(head) scale");
  requireFlag(c, "scale_attn_by_inverse_layer_idx", false,
              "attention scaled by the layer index has no parc equivalent");
  requireFlag(c, "add_cross_attention", false, "cross-attention layers have no parc equivalent");
  // Upcasting reorders the same math for fp16; the summary keys describe GPT2DoubleHeadsModel.
  c.accept({"reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
            "summary_proj_to_labels", "summary_first_dropout"});
  readTied(b, true);
}

void readGPTNeoX(ModelBuilder &b) {
  Config &c = b.config;
  readSizes(b, {"vocab_size", "max_position_embeddings", "hidden_size", "num_attention_heads",
                "intermediate_size", "num_hidden_layers", "layernorm", "layer_norm_eps"});
  readActivation(b, "hidden_act", "gelu", false);
  // transformers' defaults: a quarter of each head rotates, with base 10000.
  readRope(b, 10000, c.get("rope_theta") ? "rope_theta" : "rotary_emb_base", 0.25, "rotary_pct");
  c.accept({"rope_theta", "rotary_emb_base"});
  requireFlag(c, "attention_bias", true,
              "an attention without biases beside an MLP with them has no parc equivalent");
  b.set("bias", "all", "attention_bias and the MLP's biases");
  if (c.flag("use_parallel_residual").value_or(true))
    b.set("residual", "parallel", "use_parallel_residual");
  readDropout(b, {"hidden_dropout", "attention_dropout"});
  c.accept({"classifier_dropout", "is_decoder"}); // sequence classification only
  readInitializerRange(b);
  readTied(b, false);
}

struct Family {
  llvm::StringLiteral architecture, modelType;
  void (*read)(ModelBuilder &);
};

constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", readLlama},
    {"MistralForCausalLM", "mistral", readMistral},
    {"Qwen2ForCausalLM", "qwen2", readQwen2},
    {"GemmaForCausalLM", "gemma", readGemma},
    {"GPT2LMHeadModel", "gpt2", readGPT2},
    {"GPTNeoXForCausalLM", "gpt_neox", readGPTNeoX},
    {"MixtralForCausalLM", "mixtral", readMixtral},
};

/// The block's name: the file's stem as an identifier, or the model's when the file is
/// transformers' own config.json.
std::string blockName(llvm::StringRef path, Config &c, const Family &family) {
  std::string stem = llvm::sys::path::stem(path).str();
  if (stem == "config")
    stem = llvm::sys::path::filename(c.word("_name_or_path").value_or(family.modelType.str())).str();
  std::string name;
  for (char ch : stem)
    name += std::isalnum(static_cast<unsigned char>(ch)) ? char(std::tolower(ch)) : '_';
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])))
    name = "m_" + name;
  return name;
}

/// The family named by `architectures` (or, without it, by `model_type`).
const Family *familyOf(Config &c) {
  std::string arch;
  llvm::StringRef key = "architectures";
  if (const llvm::json::Value *list = c.get(key)) {
    const llvm::json::Array *archs = list->getAsArray();
    if (!archs || archs->size() != 1 || !(*archs)[0].getAsString()) {
      c.error(key, "'architectures' must name one architecture");
      return nullptr;
    }
    arch = (*archs)[0].getAsString()->str();
  } else if (std::optional<std::string> type = c.word("model_type")) {
    key = "model_type";
    for (const Family &f : kFamilies)
      if (f.modelType == *type)
        return &f;
    arch = "model_type " + *type;
  } else {
    c.error(key, "the config names no architecture ('architectures' or 'model_type')");
    return nullptr;
  }
  for (const Family &f : kFamilies)
    if (f.architecture == arch)
      return &f;
  std::string known;
  for (llvm::StringRef a : importableArchitectures())
    known += (known.empty() ? "" : ", ") + a.str();
  c.error(key, arch + " is not an architecture parc imports; it knows " + known);
  return nullptr;
}

} // namespace

llvm::ArrayRef<llvm::StringRef> importableArchitectures() {
  static const std::vector<llvm::StringRef> names = [] {
    std::vector<llvm::StringRef> out;
    for (const Family &f : kFamilies)
      out.push_back(f.architecture);
    return out;
  }();
  return names;
}

std::optional<ImportedModel> readHFConfig(llvm::StringRef path, DiagnosticEngine &diags) {
  auto file = readRegularFile(path, limits::MaxInputFileBytes);
  if (!file) {
    diags.ioError(llvm::SMLoc(), "cannot open '" + path + "': " + llvm::toString(file.takeError()));
    return std::nullopt;
  }
  llvm::SourceMgr &sm = diags.getSourceMgr();
  llvm::StringRef text = sm.getMemoryBuffer(sm.AddNewSourceBuffer(std::move(*file), {}))->getBuffer();
  size_t tooDeep = jsonTooDeepAt(text, unsigned(limits::MaxJSONDepth));
  if (tooDeep != llvm::StringRef::npos) {
    diags.error(llvm::SMLoc::getFromPointer(text.data() + tooDeep),
                "not a JSON config: nested deeper than " + std::to_string(limits::MaxJSONDepth) +
                    " levels");
    return std::nullopt;
  }
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(text);
  if (!json) {
    // llvm::json says "[line:col, byte=N]: message"; point at byte N.
    std::string message = llvm::toString(json.takeError());
    size_t at = message.find("byte="), offset = 0;
    if (at != std::string::npos)
      offset = std::min<size_t>(std::strtoull(message.c_str() + at + 5, nullptr, 10), text.size());
    size_t colon = message.find("]: ");
    diags.error(llvm::SMLoc::getFromPointer(text.data() + offset),
                "not a JSON config: " + message.substr(colon == std::string::npos ? 0 : colon + 3));
    return std::nullopt;
  }
  const llvm::json::Object *object = json->getAsObject();
  if (!object) {
    diags.error(llvm::SMLoc::getFromPointer(text.data()), "a config.json holds one JSON object");
    return std::nullopt;
  }
  Config config(*object, text, diags);
  const Family *family = familyOf(config);
  if (!family)
    return std::nullopt;
  ImportedModel model;
  model.architecture = family->architecture.str();
  model.source = llvm::sys::path::filename(path).str();
  model.name = blockName(path, config, *family);
  ModelBuilder builder(config, model);
  family->read(builder);
  acceptCommonKeys(config);
  if (config.hasFailed())
    return std::nullopt;
  config.warnUnread(family->architecture);
  std::stable_sort(model.fields.begin(), model.fields.end(),
                   [](const ImportedField &a, const ImportedField &b) {
                     auto rank = [](llvm::StringRef n) {
                       return std::find(std::begin(kFieldOrder), std::end(kFieldOrder), n) -
                              std::begin(kFieldOrder);
                     };
                     return rank(a.name) < rank(b.name);
                   });
  return model;
}

} // namespace parc
