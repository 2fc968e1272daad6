//===- Export.h - The checked job as Megatron-LM and DeepSpeed launch files -===//
//
// `--emit=megatron` writes a bash script that launches Megatron-LM's pretrain_gpt.py with
// torchrun; `--emit=deepspeed` the DeepSpeed config JSON. Each describes the same model,
// mapping and training settings as the .par file or is refused: what the launcher cannot run
// as written (a rank order, a schedule, a layer it has no switch for) is an error at the
// field that asks for it, so an export never runs a different job. docs/interop.md has the
// mapping, field by field.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_INTEROP_EXPORT_H
#define PARC_INTEROP_EXPORT_H

#include "parc/Check/Mapping.h"
#include "parc/Sema/Program.h"
#include "parc/Support/Diagnostics.h"

#include <optional>
#include <string>

namespace parc {

/// The launch script, or nothing after the errors that say why Megatron-LM cannot run the job.
std::optional<std::string> exportMegatron(const Program &program, const Mapping &mapping,
                                          llvm::StringRef source, DiagnosticEngine &diags);

/// The DeepSpeed config JSON with the Megatron-DeepSpeed arguments that go with it in its
/// "comment" field, or nothing after the errors that say why DeepSpeed cannot run the job.
std::optional<std::string> exportDeepSpeed(const Program &program, const Mapping &mapping,
                                           llvm::StringRef configPath, DiagnosticEngine &diags);

} // namespace parc

#endif
