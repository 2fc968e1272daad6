//===- Trace.cpp - The simulated step as a Chrome trace / Perfetto JSON ---===//
//
// Streams the events with llvm::json::OStream: a gpt3-175b step has tens of thousands of them.
// The transfers of one batch share their start (OpTiming), so they nest on their stage's track
// instead of overlapping partially, which trace viewers cannot draw.
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
               [&] { json.attribute("name", program.model.name + " pipeline step (simulated)"); });
      for (int64_t stage = 0; stage < config.stages; ++stage) {
        metadata(json, "thread_name", stage,
                 [&] { json.attribute("name", "stage " + std::to_string(stage)); });
        metadata(json, "thread_sort_index", stage, [&] { json.attribute("sort_index", stage); });
      }
      for (int64_t stage = 0; stage < config.stages; ++stage)
        for (const TimedOp &timed : timeline.stages[size_t(stage)]) {
          const PipeOp &op = timed.op;
          json.object([&] {
            json.attribute("name", traceEventName(op));
            json.attribute("cat", eventCategory(op.kind));
            json.attribute("ph", "X");
            json.attribute("pid", 0);
            json.attribute("tid", stage);
            int64_t start = nanoseconds(timed.start), end = nanoseconds(timed.end);
            microseconds(json, "ts", start);
            microseconds(json, "dur", end - start);
            json.attribute("cname", eventColour(op.kind));
            json.attributeObject("args", [&] {
              json.attribute("chunk", op.chunk);
              json.attribute("virtual_stage", config.virtualStageOf(stage, op.chunk));
              json.attribute("microbatch", op.microbatch);
              if (!op.isCompute())
                json.attribute("peer_stage", op.peer);
            });
          });
        }
    });
  });
  os << "\n";
}

} // namespace parc
