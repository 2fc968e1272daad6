//===- Trace.h - The simulated step as a Chrome trace / Perfetto JSON -----===//
//
// Chrome's Trace Event Format, which Perfetto reads too: one process for the step, one thread
// per pipeline stage ("stage S"), and a complete ("X") event per forward, backward, send and
// receive with ts and dur in microseconds. Open it in ui.perfetto.dev or chrome://tracing.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_EMIT_TRACE_H
#define PARC_EMIT_TRACE_H

#include "parc/Cost/StepTimeline.h"

#include "llvm/Support/raw_ostream.h"

namespace parc {

/// "F mb3 c0", "B mb3 c1", "send act mb3", "recv grad mb3".
std::string traceEventName(const PipeOp &op);

void writeTrace(const StepTimeline &timeline, const Program &program, const Mapping &mapping,
                llvm::raw_ostream &os);

} // namespace parc

#endif
