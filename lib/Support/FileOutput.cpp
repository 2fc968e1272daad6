//===- FileOutput.cpp - Writing a file, its errors returned ---------------===//

#include "parc/Support/FileOutput.h"

namespace parc {

llvm::Error writeFile(llvm::StringRef path, llvm::function_ref<void(llvm::raw_ostream &)> write,
                      llvm::sys::fs::OpenFlags flags) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec, flags);
  if (ec)
    return llvm::createStringError(ec, "%s: cannot open for writing: %s", path.str().c_str(),
                                   ec.message().c_str());
  write(os);
  os.close();
  if (os.has_error()) {
    std::error_code writeError = os.error();
    os.clear_error();
    return llvm::createStringError(writeError, "%s: cannot write: %s", path.str().c_str(),
                                   writeError.message().c_str());
  }
  return llvm::Error::success();
}

bool finishStandardOutput(llvm::StringRef tool) {
  llvm::raw_fd_ostream &out = llvm::outs();
  out.flush();
  if (!out.has_error())
    return true;
  std::error_code error = out.error();
  out.clear_error();
  llvm::errs() << tool << ": error: cannot write standard output: " << error.message() << "\n";
  return false;
}

} // namespace parc
