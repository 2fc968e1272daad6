#include "parc/Support/Diagnostics.h"

#include <algorithm>

namespace parc {

namespace {
// A source line longer than this is echoed as a window around the caret: LLVM would print
// all of it, and a diagnostic on a 1 MB line would be 2 MB of output.
constexpr size_t kMaxEchoedLine = 200;
constexpr size_t kWindowBefore = 60, kWindowWidth = 120;
} // namespace

void DiagnosticEngine::emit(llvm::SMLoc loc, llvm::SourceMgr::DiagKind kind,
                            const llvm::Twine &message, llvm::ArrayRef<llvm::SMRange> ranges) {
  if (!loc.isValid()) {
    sourceMgr.PrintMessage(os, llvm::SMDiagnostic("parc", kind, message.str()));
    return;
  }
  llvm::SMDiagnostic full = sourceMgr.GetMessage(loc, kind, message, ranges);
  llvm::StringRef line = full.getLineContents();
  if (line.size() <= kMaxEchoedLine || full.getColumnNo() < 0) {
    sourceMgr.PrintMessage(os, full);
    return;
  }
  size_t column = size_t(full.getColumnNo());
  size_t begin = column > kWindowBefore ? column - kWindowBefore : 0;
  size_t end = std::min(line.size(), begin + kWindowWidth);
  std::string window =
      (begin > 0 ? "..." : "") + line.slice(begin, end).str() + (end < line.size() ? "..." : "");
  size_t shift = begin > 0 ? 3 : 0;
  // The ranges, as columns of the window; clipped to it.
  std::vector<std::pair<unsigned, unsigned>> windowRanges;
  for (const std::pair<unsigned, unsigned> &range : full.getRanges()) {
    size_t first = std::max<size_t>(range.first, begin), last = std::min<size_t>(range.second, end);
    if (first < last)
      windowRanges.emplace_back(unsigned(first - begin + shift), unsigned(last - begin + shift));
  }
  // The location keeps the real column; the caret points into the window.
  os << full.getFilename() << ':' << full.getLineNo() << ':' << (column + 1) << ": ";
  llvm::SMDiagnostic shortened(sourceMgr, full.getLoc(), /*filename=*/"", full.getLineNo(),
                               int(column - begin + shift), kind, full.getMessage(), window,
                               windowRanges);
  shortened.print(nullptr, os, /*ShowColors=*/false);
}

void DiagnosticEngine::error(llvm::SMLoc loc, const llvm::Twine &message,
                             llvm::ArrayRef<llvm::SMRange> ranges) {
  if (reachedErrorLimit()) {
    announceErrorLimit();
    return;
  }
  suppressNotes = false;
  ++errors;
  emit(loc, llvm::SourceMgr::DK_Error, message, ranges);
}

void DiagnosticEngine::announceErrorLimit() {
  suppressNotes = true;
  if (announcedLimit)
    return;
  announcedLimit = true;
  emit(llvm::SMLoc(), llvm::SourceMgr::DK_Error, "too many errors emitted, stopping now", {});
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
