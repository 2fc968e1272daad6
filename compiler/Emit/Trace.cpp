//===- Trace.cpp - The simulated step as a Chrome trace / Perfetto JSON ---===//
//
// Streams the events with llvm::json::OStream: a gpt3-175b step has tens of thousands of them.
// Each stage has a compute track (forward, backward, optimizer), a tp track (the collectives
// each pass leaves exposed), a pp track (the pipeline transfers; those of one batch share
// their start, so they nest instead of overlapping partially, which viewers cannot draw) and
// a dp track (ZeRO traffic, the gradient sync, the parameter gather).
//
//===----------------------------------------------------------------------===//
#include "parc/Emit/Trace.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

#include <cmath>
#include <functional>

namespace parc {

namespace {

const char *eventCategory(PipeOpKind kind) {
  switch (kind) {
  case PipeOpKind::Forward:
    return "forward";
  case PipeOpKind::Backward:
    return "backward";
  case PipeOpKind::SendActivation:
  case PipeOpKind::SendGradient:
    return "send";
  case PipeOpKind::RecvActivation:
  case PipeOpKind::RecvGradient:
    return "recv";
  }
  return "unknown";
}

/// Chrome's reserved colour names, so that chrome://tracing shows forward and backward apart
/// (Perfetto colours by name and ignores them).
const char *eventColour(PipeOpKind kind) {
  switch (kind) {
  case PipeOpKind::Forward:
    return "thread_state_running";
  case PipeOpKind::Backward:
    return "rail_load";
  default:
    return "grey";
  }
}

/// Whole nanoseconds, so that a slice's ts + dur is exactly the ts of a slice that starts when
/// it ends: rounded separately they could overlap by a nanosecond, which viewers draw as a
/// broken nesting.
int64_t nanoseconds(double seconds) { return int64_t(std::llround(seconds * 1e9)); }

/// Microseconds with three decimals, from nanoseconds: exact, and without the 17 digits of
/// binary noise that printing a double would give.
void microseconds(llvm::json::OStream &json, llvm::StringRef key, int64_t ns) {
  json.attributeBegin(key);
  json.rawValue([&](llvm::raw_ostream &os) {
    os << ns / 1000 << '.' << llvm::format("%03lld", (long long)(ns % 1000));
  });
  json.attributeEnd();
}

void metadata(llvm::json::OStream &json, llvm::StringRef name, int64_t tid,
              const std::function<void()> &args) {
  json.object([&] {
    json.attribute("name", name);
    json.attribute("ph", "M");
    json.attribute("pid", 0);
    if (tid >= 0)
      json.attribute("tid", tid);
    json.attributeObject("args", args);
  });
}

} // namespace

std::string traceEventName(const PipeOp &op) {
  std::string mb = "mb" + std::to_string(op.microbatch);
  switch (op.kind) {
  case PipeOpKind::Forward:
    return "F " + mb + " c" + std::to_string(op.chunk);
  case PipeOpKind::Backward:
    return "B " + mb + " c" + std::to_string(op.chunk);
  case PipeOpKind::SendActivation:
    return "send act " + mb;
  case PipeOpKind::RecvActivation:
    return "recv act " + mb;
  case PipeOpKind::SendGradient:
    return "send grad " + mb;
  case PipeOpKind::RecvGradient:
    return "recv grad " + mb;
  }
  return "unknown";
}

namespace {

/// Each stage has four tracks: its compute, and the tensor-, pipeline- and data-parallel
/// communication the timeline puts on it.
enum Track { ComputeTrack, TPTrack, PPTrack, DPTrack, TracksPerStage };
const char *const kTrackNames[] = {"compute", "tp", "pp", "dp"};

int64_t trackOf(int64_t stage, Track track) { return stage * TracksPerStage + track; }

class TraceWriter {
public:
  TraceWriter(llvm::json::OStream &json, const PipelineConfig &config)
      : json(json), config(config) {}

  /// One slice; empty ones are left out unless they are instructions (`args` given).
  void slice(int64_t tid, llvm::StringRef name, llvm::StringRef category, double start,
             double end, const char *colour, const std::function<void()> &args = {}) {
    if (end <= start && !args)
      return;
    json.object([&] {
      json.attribute("name", name);
      json.attribute("cat", category);
      json.attribute("ph", "X");
      json.attribute("pid", 0);
      json.attribute("tid", tid);
      int64_t from = nanoseconds(start), to = nanoseconds(end);
      microseconds(json, "ts", from);
      microseconds(json, "dur", to - from);
      json.attribute("cname", colour);
      if (args)
        json.attributeObject("args", args);
    });
  }

  void instruction(int64_t stage, const TimedOp &timed) {
    const PipeOp &op = timed.op;
    auto args = [&] {
      json.attribute("chunk", op.chunk);
      json.attribute("virtual_stage", config.virtualStageOf(stage, op.chunk));
      json.attribute("microbatch", op.microbatch);
      if (!op.isCompute())
        json.attribute("peer_stage", op.peer);
    };
    if (!op.isCompute()) {
      slice(trackOf(stage, PPTrack), traceEventName(op), eventCategory(op.kind), timed.start,
            timed.end, eventColour(op.kind), args);
      return;
    }
    slice(trackOf(stage, ComputeTrack), traceEventName(op), eventCategory(op.kind), timed.start,
          timed.end, eventColour(op.kind), args);
    // The pass's exposed collectives, drawn at its end: ZeRO traffic last, tp before it.
    double zeroStart = timed.end - timed.zeroSeconds;
    slice(trackOf(stage, TPTrack), "tp " + traceEventName(op), "tp",
          zeroStart - timed.tpSeconds, zeroStart, "thread_state_iowait");
    slice(trackOf(stage, DPTrack), "zero " + traceEventName(op), "dp", zeroStart, timed.end,
          "thread_state_iowait");
  }

  void tail(int64_t stage, const StageTail &t) {
    int64_t dp = trackOf(stage, DPTrack);
    slice(dp, "gradient sync", "dp", t.gradSyncStart, t.gradSyncEnd, "thread_state_iowait");
    slice(dp, "tied embedding sync", "dp", t.embeddingSyncStart, t.embeddingSyncEnd,
          "thread_state_iowait");
    slice(trackOf(stage, ComputeTrack), "optimizer", "optimizer", t.optimizerStart,
          t.optimizerEnd, "good");
    slice(dp, "parameter all-gather", "dp", t.paramGatherStart, t.paramGatherEnd,
          "thread_state_iowait");
  }

private:
  llvm::json::OStream &json;
  const PipelineConfig &config;
};

} // namespace

void writeTrace(const StepTimeline &timeline, const Program &program, const Mapping &mapping,
                llvm::raw_ostream &os) {
  const PipelineConfig &config = timeline.config;
  llvm::json::OStream json(os);
  json.object([&] {
    json.attribute("displayTimeUnit", "ms");
    json.attributeObject("otherData", [&] {
      json.attribute("model", program.model.name);
      json.attribute("cluster", program.cluster.name);
      json.attribute("tp", mapping.tp);
      json.attribute("pp", mapping.pp);
      json.attribute("dp", mapping.dp);
      json.attribute("schedule", toString(config.kind));
      json.attribute("chunks", config.chunks);
      json.attribute("microbatches", config.microbatches);
      json.attribute("bubble_fraction", timeline.idealBubble);
      json.attribute("simulated_bubble_fraction", timeline.simulatedBubble());
      json.attribute("step_seconds", timeline.makespan);
      json.attribute("transfer_seconds", timeline.transferSeconds);
    });
    json.attributeArray("traceEvents", [&] {
      metadata(json, "process_name", -1,
               [&] { json.attribute("name", program.model.name + " training step (simulated)"); });
      for (int64_t stage = 0; stage < config.stages; ++stage)
        for (int track = 0; track < TracksPerStage; ++track) {
          int64_t tid = trackOf(stage, Track(track));
          std::string name = "stage " + std::to_string(stage);
          if (track != ComputeTrack)
            name += " " + std::string(kTrackNames[track]);
          metadata(json, "thread_name", tid, [&] { json.attribute("name", name); });
          metadata(json, "thread_sort_index", tid, [&] { json.attribute("sort_index", tid); });
        }
      TraceWriter writer(json, config);
      for (int64_t stage = 0; stage < config.stages; ++stage) {
        for (const TimedOp &timed : timeline.stages[size_t(stage)])
          writer.instruction(stage, timed);
        writer.tail(stage, timeline.tails[size_t(stage)]);
      }
    });
  });
  os << "\n";
}

} // namespace parc
