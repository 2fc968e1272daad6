#include "parc/Support/Diagnostics.h"

namespace parc {

void DiagnosticEngine::emit(llvm::SMLoc loc, llvm::SourceMgr::DiagKind kind,
                            const llvm::Twine &message, llvm::ArrayRef<llvm::SMRange> ranges) {
  if (loc.isValid())
    sourceMgr.PrintMessage(os, loc, kind, message, ranges);
  else
    sourceMgr.PrintMessage(os, llvm::SMDiagnostic("parc", kind, message.str()));
}

void DiagnosticEngine::error(llvm::SMLoc loc, const llvm::Twine &message,
                             llvm::ArrayRef<llvm::SMRange> ranges) {
  if (reachedErrorLimit()) {
    suppressNotes = true;
    if (!announcedLimit) {
      announcedLimit = true;
      emit(llvm::SMLoc(), llvm::SourceMgr::DK_Error,
           "too many errors emitted, stopping now", {});
    }
    return;
  }
  suppressNotes = false;
  ++errors;
  emit(loc, llvm::SourceMgr::DK_Error, message, ranges);
}

void DiagnosticEngine::warning(llvm::SMLoc loc, const llvm::Twine &message,
                               llvm::ArrayRef<llvm::SMRange> ranges) {
  if (warningsAsErrors) {
    error(loc, message + " [-Werror]", ranges);
    return;
  }
  suppressNotes = false;
  ++warnings;
  emit(loc, llvm::SourceMgr::DK_Warning, message, ranges);
}

void DiagnosticEngine::note(llvm::SMLoc loc, const llvm::Twine &message,
                            llvm::ArrayRef<llvm::SMRange> ranges) {
  if (suppressNotes)
    return;
  emit(loc, llvm::SourceMgr::DK_Note, message, ranges);
}

void DiagnosticEngine::ioError(llvm::SMLoc loc, const llvm::Twine &message) {
  sawIOError = true;
  error(loc, message);
}

int DiagnosticEngine::exitCode() const {
  if (sawIOError)
    return ExitUsageOrIO;
  return errors ? ExitInputError : ExitSuccess;
}

} // namespace parc
