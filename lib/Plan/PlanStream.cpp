//===- RankPlanStream.cpp - Stream a rank plan as JSON without a tree -----===//
//
// Writes through a small printer that appends to a string, and then writes the file in one
// call: even llvm::json::OStream, which builds no tree, spends most of its time in
// per-character stream calls (about 80 MB/s). The printer reproduces OStream's output: pretty,
// one element or key per line, "key": value, empty containers as {} and []; compact, no
// whitespace at all; strings escaped and doubles printed as llvm::json does. Every object
// lists its keys in byte order, as llvm::json sorts them; the comments name the PlanWriter.cpp
// function each one mirrors.
//
//===----------------------------------------------------------------------===//
#include "parc/Plan/PlanStream.h"
#include "parc/Support/FileOutput.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"

#include <charconv>
#include <cstdio>
#include <limits>
#include <variant>

namespace parc {

namespace {

using namespace plan;

class JSONWriter {
public:
  JSONWriter(std::string &out, JSONLayout layout)
      : out(out), pretty(layout == JSONLayout::Pretty) {}

  void objectBegin() { containerBegin('{', /*isArray=*/false); }
  void objectEnd() { containerEnd('}'); }
  void arrayBegin() { containerBegin('[', /*isArray=*/true); }
  void arrayEnd() { containerEnd(']'); }

  void key(llvm::StringRef name) {
    Level &level = stack.back();
    if (level.hasValue)
      out += ',';
    level.hasValue = true;
    newline();
    quote(name);
    out += pretty ? ": " : ":";
  }

  void value(int64_t v) {
    valueBegin();
    char buffer[24];
    out.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, v).ptr);
  }
  void value(bool v) {
    valueBegin();
    out += v ? "true" : "false";
  }
  void value(double v) {
    valueBegin();
    char buffer[32];
    int length =
        std::snprintf(buffer, sizeof buffer, "%.*g", std::numeric_limits<double>::max_digits10, v);
    out.append(buffer, size_t(length));
  }
  void value(llvm::StringRef v) {
    valueBegin();
    quote(v);
  }
  void value(const AttrValue &v) {
    std::visit([&](const auto &alternative) { value(alternative); }, v);
  }
  void value(const std::string &v) { value(llvm::StringRef(v)); }
  template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>> void value(E v) {
    value(spelling(v));
  }

  template <typename T> void attribute(llvm::StringRef name, const T &v) {
    key(name);
    value(v);
  }
  template <typename Fn> void object(Fn contents) {
    objectBegin();
    contents();
    objectEnd();
  }
  template <typename Fn> void array(Fn contents) {
    arrayBegin();
    contents();
    arrayEnd();
  }
  template <typename Fn> void attributeObject(llvm::StringRef name, Fn contents) {
    key(name);
    object(contents);
  }
  template <typename Fn> void attributeArray(llvm::StringRef name, Fn contents) {
    key(name);
    array(contents);
  }

private:
  static constexpr size_t IndentSize = 2;
  struct Level {
    bool isArray = false, hasValue = false;
  };

  /// An array element goes on its own line after a comma; an attribute's value follows its
  /// key, and the top-level value starts the text.
  void valueBegin() {
    if (stack.empty() || !stack.back().isArray)
      return;
    if (stack.back().hasValue)
      out += ',';
    stack.back().hasValue = true;
    newline();
  }
  void containerBegin(char open, bool isArray) {
    valueBegin();
    stack.push_back({isArray, false});
    indent += IndentSize;
    out += open;
  }
  void containerEnd(char close) {
    indent -= IndentSize;
    if (stack.back().hasValue)
      newline();
    stack.pop_back();
    out += close;
  }
  void newline() {
    if (!pretty)
      return;
    out += '\n';
    out.append(indent, ' ');
  }
  /// llvm::json's escaping: quote and backslash escaped, \t \n \r by name, other control
  /// characters as \u00XX; invalid UTF-8 replaced as llvm::json::Value does.
  void quote(llvm::StringRef text) {
    // Plan strings are names: plain ASCII that needs no escape goes in one append.
    size_t plainEnd = 0;
    while (plainEnd < text.size() && isPlain(static_cast<unsigned char>(text[plainEnd])))
      ++plainEnd;
    if (plainEnd == text.size()) {
      out += '"';
      out.append(text.data(), text.size());
      out += '"';
      return;
    }
    if (!llvm::json::isUTF8(text)) {
      quote(llvm::json::fixUTF8(text));
      return;
    }
    out += '"';
    size_t plain = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      unsigned char c = static_cast<unsigned char>(text[i]);
      if (c >= 0x20 && c != '"' && c != '\\')
        continue;
      out.append(text.data() + plain, i - plain);
      plain = i + 1;
      out += '\\';
      switch (c) {
      case '"':
      case '\\':
        out += char(c);
        break;
      case '\t':
        out += 't';
        break;
      case '\n':
        out += 'n';
        break;
      case '\r':
        out += 'r';
        break;
      default: {
        static const char hexDigits[] = "0123456789abcdef";
        out += "u00";
        out += hexDigits[c >> 4];
        out += hexDigits[c & 15];
      }
      }
    }
    out.append(text.data() + plain, text.size() - plain);
    out += '"';
  }
  static bool isPlain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

  std::string &out;
  bool pretty;
  llvm::SmallVector<Level, 16> stack;
  size_t indent = 0;
};

void intList(JSONWriter &json, llvm::StringRef key, const std::vector<int64_t> &values) {
  json.attributeArray(key, [&] {
    for (int64_t v : values)
      json.value(v);
  });
}

void stringList(JSONWriter &json, llvm::StringRef key, const std::vector<std::string> &values) {
  json.attributeArray(key, [&] {
    for (const std::string &v : values)
      json.value(v);
  });
}

void groupList(JSONWriter &json, llvm::StringRef key, llvm::ArrayRef<Group> groups) {
  json.attributeArray(key, [&] {
    for (Group g : groups)
      json.value(g);
  });
}

void predictedMemory(JSONWriter &json, const PredictedMemory &m) {
  json.attributeObject("predicted_memory", [&] {
    json.attribute("activations", m.activations);
    json.attribute("grads", m.grads);
    json.attribute("optimizer", m.optimizer);
    json.attribute("reserve", m.reserve);
    json.attribute("weights", m.weights);
  });
}

void coords(JSONWriter &json, const Coords &c) {
  json.attributeObject("coords", [&] {
    json.attribute("cp", c.cp);
    json.attribute("dp", c.dp);
    json.attribute("pp", c.pp);
    json.attribute("tp", c.tp);
  });
}

void groups(JSONWriter &json, const Groups &g) {
  json.attributeObject("groups", [&] {
    intList(json, "cp", g.cp);
    intList(json, "dp", g.dp);
    intList(json, "dp_cp", g.dpCp);
    intList(json, "embedding", g.embedding);
    intList(json, "ep", g.ep);
    intList(json, "expert_dp", g.expertDp);
    intList(json, "model", g.model);
    intList(json, "pp", g.pp);
    intList(json, "tp", g.tp);
  });
}

// modelJSON
void model(JSONWriter &json, const ModelSummary &m) {
  json.attributeObject("model", [&] {
    json.attribute("dtype", m.dtype);
    json.attribute("ffn", m.ffn);
    json.attribute("head_dim", m.headDim);
    json.attribute("heads", m.heads);
    json.attribute("hidden", m.hidden);
    json.attribute("kv_heads", m.kvHeads);
    json.attribute("layers", m.layers);
    json.attribute("mlp", m.mlp);
    json.attribute("name", m.name);
    json.attribute("norm", m.norm);
    json.attribute("padded_vocab", m.paddedVocab);
    json.attribute("position", m.position);
    json.attribute("seq", m.seq);
    json.attribute("tied_embeddings", m.tiedEmbeddings);
    json.attribute("vocab", m.vocab);
  });
}

// clusterJSON
void cluster(JSONWriter &json, const ClusterSummary &c) {
  json.attributeObject("cluster", [&] {
    json.attribute("gpus_per_node", c.gpusPerNode);
    json.attribute("name", c.name);
    json.attribute("nodes", c.nodes);
  });
}

// parallelJSON
void parallel(JSONWriter &json, const ParallelSummary &p) {
  json.attributeObject("parallel", [&] {
    json.attribute("bucket_size", p.bucketSize);
    json.attribute("chunks", p.chunks);
    json.attribute("cp", p.cp);
    json.attribute("dp", p.dp);
    json.attribute("ep", p.ep);
    json.attribute("global_batch", p.globalBatch);
    json.attribute("micro_batch", p.microBatch);
    json.attribute("microbatches", p.microbatches);
    groupList(json, "order", p.order);
    json.attribute("pp", p.pp);
    json.attribute("recompute", p.recompute);
    json.attribute("schedule", p.schedule);
    json.attribute("sequence_parallel", p.sequenceParallel);
    json.attribute("tp", p.tp);
    json.attribute("zero", p.zero);
  });
}

// trainJSON
void train(JSONWriter &json, const TrainSettings &t) {
  json.attributeObject("train", [&] {
    json.attributeArray("betas", [&] {
      json.value(t.betas[0]);
      json.value(t.betas[1]);
    });
    json.attribute("eps", t.eps);
    json.attribute("grad_clip", t.gradClip);
    json.attribute("grad_dtype", t.gradDtype);
    json.attribute("lr", t.lr);
    json.attribute("momentum", t.momentum);
    json.attribute("optimizer", t.optimizer);
    json.attribute("seed", t.seed);
    json.attribute("steps", t.steps);
    json.attribute("warmup_steps", t.warmupSteps);
    json.attribute("weight_decay", t.weightDecay);
  });
}

// paramJSON
void param(JSONWriter &json, const ParamShard &p) {
  json.object([&] {
    json.attribute("counts_in_grad_norm", p.countsInGradNorm);
    json.attribute("dtype", p.dtype);
    json.attributeObject("init", [&] {
      json.attribute("kind", p.init.kind);
      if (p.init.kind == InitKind::Normal) {
        json.attribute("rows", p.init.rows);
        json.attribute("std", p.init.std);
      }
    });
    json.attribute("kind", p.kind);
    json.attribute("name", p.name);
    intList(json, "shape", p.shape);
    json.attributeArray("slice", [&] {
      for (const Slice &s : p.slice)
        json.object([&] {
          json.attribute("offset", s.offset);
          json.attribute("size", s.size);
        });
    });
  });
}

// opJSON; std::map keeps the attributes in the byte order llvm::json sorts keys in.
void op(JSONWriter &json, const Op &o) {
  json.object([&] {
    json.attributeObject("attrs", [&] {
      for (const auto &[name, value] : o.attrs)
        json.attribute(name, value);
    });
    stringList(json, "inputs", o.inputs);
    json.attribute("op", o.kind);
    stringList(json, "outputs", o.outputs);
  });
}

void ops(JSONWriter &json, llvm::StringRef key, const std::vector<Op> &list) {
  json.attributeArray(key, [&] {
    for (const Op &o : list)
      op(json, o);
  });
}

// chunkJSON
void chunk(JSONWriter &json, const Chunk &c) {
  json.object([&] {
    ops(json, "backward", c.backward);
    json.attribute("first_block", c.firstBlock);
    ops(json, "forward", c.forward);
    json.attribute("has_embedding", c.hasEmbedding);
    json.attribute("has_head", c.hasHead);
    json.attribute("index", c.index);
    json.attribute("input", c.input);
    json.attribute("last_block", c.lastBlock);
    json.attribute("output", c.output);
    json.attributeObject("tensors", [&] {
      for (const auto &[name, type] : c.tensors)
        // A lambda captures a structured binding only from C++20 on; this is C++17.
        json.attributeObject(name, [&, &type = type] {
          json.attribute("dtype", type.dtype);
          intList(json, "shape", type.shape);
        });
    });
    json.attribute("virtual_stage", c.virtualStage);
  });
}

// instrJSON: which operands an instruction has, in key order.
void instr(JSONWriter &json, const Instr &i) {
  const InstrKind kind = i.op;
  const bool transfer = isTransfer(kind);
  const bool compute = kind == InstrKind::Forward || kind == InstrKind::Backward;
  const bool gradCollective =
      kind == InstrKind::AllReduceGrads || kind == InstrKind::ReduceScatterGrads;
  const bool grouped = gradCollective || kind == InstrKind::AllGatherParams;
  const bool hasParams = grouped || kind == InstrKind::ReleaseParams;
  json.object([&] {
    if (gradCollective)
      json.attribute("average", i.average);
    if (transfer || compute)
      json.attribute("chunk", i.chunk);
    if (grouped)
      json.attribute("group", i.group);
    if (transfer || compute || kind == InstrKind::LoadBatch)
      json.attribute("mb", i.microbatch);
    if (kind == InstrKind::OptimizerStep)
      groupList(json, "norm_groups", i.normGroups);
    json.attribute("op", kind);
    if (hasParams)
      stringList(json, "params", i.params);
    if (transfer)
      json.attribute("peer", i.peer);
    if (mayRunWithin(kind))
      json.attribute("within", i.within);
  });
}

// rankPlanObject
void appendRankPlan(std::string &out, const RankPlan &plan, JSONLayout layout) {
  JSONWriter json(out, layout);
  json.object([&] {
    json.attributeArray("chunks", [&] {
      for (const Chunk &c : plan.chunks)
        chunk(json, c);
    });
    cluster(json, plan.cluster);
    coords(json, plan.coords);
    json.attribute("format", llvm::StringRef(FormatVersion));
    groups(json, plan.groups);
    json.attribute("local_rank", plan.localRank);
    model(json, plan.model);
    json.attribute("node", plan.node);
    parallel(json, plan.parallel);
    json.attributeArray("params", [&] {
      for (const ParamShard &p : plan.params)
        param(json, p);
    });
    json.attribute("plan_id", plan.planId);
    predictedMemory(json, plan.predictedMemory);
    json.attribute("rank", plan.rank);
    json.attributeArray("schedule", [&] {
      for (const Instr &i : plan.schedule)
        instr(json, i);
    });
    train(json, plan.train);
    json.attribute("world", plan.world);
  });
  out += '\n';
}

} // namespace

void streamRankPlan(llvm::raw_ostream &os, const RankPlan &plan, JSONLayout layout) {
  std::string text;
  appendRankPlan(text, plan, layout);
  os << text;
}

llvm::Error streamRankPlanToFile(llvm::StringRef path, const RankPlan &plan, JSONLayout layout) {
  // One buffer per writing thread, kept between files: a gpt3-175b rank plan is 170 KB.
  thread_local std::string text;
  text.clear();
  appendRankPlan(text, plan, layout);
  return writeFile(
      path,
      [&](llvm::raw_ostream &os) {
        os.SetUnbuffered();
        os << text;
      },
      llvm::sys::fs::OF_Text);
}

} // namespace parc
