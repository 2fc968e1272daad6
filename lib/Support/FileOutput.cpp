//===- FileOutput.cpp - Writing a file, its errors returned ---------------===//

#include "parc/Support/FileOutput.h"

#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

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

std::error_code syncToDisk(llvm::StringRef path) {
  int fd = ::open(path.str().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return std::error_code(errno, std::generic_category());
  std::error_code result;
  if (::fsync(fd) != 0)
    result = std::error_code(errno, std::generic_category());
  ::close(fd);
  return result;
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
