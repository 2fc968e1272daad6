//===- Diagnostics.h - clang-style diagnostics over llvm::SourceMgr -------===//
//
// Every stage reports through one engine so that the whole run shares the error cap, -Werror
// and the exit code: 0 clean (warnings allowed), 1 the input has errors, 2 usage or I/O.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_DIAGNOSTICS_H
#define PARC_SUPPORT_DIAGNOSTICS_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/SMLoc.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

namespace parc {

enum ExitCode { ExitSuccess = 0, ExitInputError = 1, ExitUsageOrIO = 2 };

class DiagnosticEngine {
public:
  DiagnosticEngine(llvm::SourceMgr &sourceMgr, llvm::raw_ostream &os)
      : sourceMgr(sourceMgr), os(os) {}

  void error(llvm::SMLoc loc, const llvm::Twine &message,
             llvm::ArrayRef<llvm::SMRange> ranges = {});
  void warning(llvm::SMLoc loc, const llvm::Twine &message,
               llvm::ArrayRef<llvm::SMRange> ranges = {});
  /// A note belongs to the error or warning before it and is dropped with it past the cap.
  void note(llvm::SMLoc loc, const llvm::Twine &message,
            llvm::ArrayRef<llvm::SMRange> ranges = {});
  /// An error about a file that could not be read: exit code 2 rather than 1.
  void ioError(llvm::SMLoc loc, const llvm::Twine &message);

  /// Convenience for a diagnostic that covers a whole range, caret at its start.
  void error(llvm::SMRange range, const llvm::Twine &message) {
    error(range.Start, message, {range});
  }
  void warning(llvm::SMRange range, const llvm::Twine &message) {
    warning(range.Start, message, {range});
  }
  void note(llvm::SMRange range, const llvm::Twine &message) {
    note(range.Start, message, {range});
  }

  void setWarningsAsErrors(bool on) { warningsAsErrors = on; }
  void setErrorLimit(unsigned limit) { errorLimit = limit; }

  unsigned errorCount() const { return errors; }
  unsigned warningCount() const { return warnings; }
  bool hasErrors() const { return errors > 0; }
  /// True once the cap was reached: later stages should stop producing diagnostics.
  bool reachedErrorLimit() const { return errorLimit && errors >= errorLimit; }
  /// Says, once, that parc stops at the cap: for a stage that stops reading its input there
  /// rather than producing errors nobody sees (one more error() says it as well).
  void announceErrorLimit();
  int exitCode() const;

  llvm::SourceMgr &getSourceMgr() { return sourceMgr; }

private:
  void emit(llvm::SMLoc loc, llvm::SourceMgr::DiagKind kind, const llvm::Twine &message,
            llvm::ArrayRef<llvm::SMRange> ranges);

  llvm::SourceMgr &sourceMgr;
  llvm::raw_ostream &os;
  unsigned errors = 0, warnings = 0, errorLimit = 20;
  bool warningsAsErrors = false, sawIOError = false, suppressNotes = false,
       announcedLimit = false;
};

} // namespace parc

#endif
