//===- ParWriter.h - A program as .par source -----------------------------===//
//
// `parc --search --emit=par`: the file's model, cluster and train blocks as written (their
// fields that were set; defaults and datasheet values come back by themselves when the output
// is compiled), and the parallel block with every field concrete, so that `parc best.par -o
// plans/` is the next command.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_EMIT_PARWRITER_H
#define PARC_EMIT_PARWRITER_H

#include "parc/Sema/Program.h"
#include "parc/Sema/Sema.h"

#include "llvm/Support/raw_ostream.h"

namespace parc {

void writeParSource(const ResolvedModule &resolved, const Program &program,
                    llvm::raw_ostream &os);

} // namespace parc

#endif
