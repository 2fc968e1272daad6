//===- PipelineSVG.h - The pipeline diagram of a step as SVG --------------===//
//
// The figure of the GPipe and Megatron papers for the simulated step: one row per pipeline
// stage (stage 0 on top), time to the right, a box per forward and backward numbered with its
// microbatch (numbers are left out when the boxes are too narrow for them), forward and
// backward in two colours with one shade per interleaved model chunk, and the bubbles as the
// empty space between boxes. Every box is a <rect class="op ..."> with a <title> tooltip.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_EMIT_PIPELINESVG_H
#define PARC_EMIT_PIPELINESVG_H

#include "parc/Cost/StepTimeline.h"

#include "llvm/Support/raw_ostream.h"

namespace parc {

void writePipelineSVG(const StepTimeline &timeline, const Program &program, const Mapping &mapping,
                      llvm::raw_ostream &os);

} // namespace parc

#endif
