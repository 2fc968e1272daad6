//===- FileOutput.h - Writing a file, its errors returned -----------------===//
//
// raw_fd_ostream keeps a write error (a full disk) to itself and, left set, ends the process
// with LLVM's fatal error when it is destroyed. writeFile opens, writes, closes and returns
// the error instead, so that every writer of the project reports it the same located way.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_FILEOUTPUT_H
#define PARC_SUPPORT_FILEOUTPUT_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

namespace parc {

/// Creates or truncates `path` and lets `write` fill it. The error, carrying the system's
/// error code, says "PATH: cannot open for writing: ..." or "PATH: cannot write: ...".
llvm::Error writeFile(llvm::StringRef path, llvm::function_ref<void(llvm::raw_ostream &)> write,
                      llvm::sys::fs::OpenFlags flags = llvm::sys::fs::OF_None);

/// Makes the content of the file or directory `path` durable (fsync): a directory's entries,
/// so that files created or renamed in it survive a power cut too.
std::error_code syncToDisk(llvm::StringRef path);

/// Flushes llvm::outs() and reports the write error it kept (`parc >/dev/full`), as
/// "TOOL: error: cannot write standard output: No space left on device" on llvm::errs(), then
/// clears it so that LLVM does not end the process with its own fatal error. Returns whether
/// everything written to standard output reached it. Called once, at the end of main.
bool finishStandardOutput(llvm::StringRef tool);

} // namespace parc

#endif
