//===- FileInput.cpp - Reading a file that may be hostile -----------------===//

#include "parc/Support/FileInput.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/FileSystem.h"

namespace parc {

namespace {
llvm::Error refused(const llvm::Twine &why) {
  return llvm::createStringError(std::make_error_code(std::errc::invalid_argument), why);
}

const char *kindOf(llvm::sys::fs::file_type type) {
  using llvm::sys::fs::file_type;
  switch (type) {
  case file_type::character_file:
    return "a character device";
  case file_type::block_file:
    return "a block device";
  case file_type::fifo_file:
    return "a FIFO";
  case file_type::socket_file:
    return "a socket";
  default:
    return "not a file";
  }
}
llvm::Error checkRegular(const llvm::sys::fs::file_status &status) {
  using llvm::sys::fs::file_type;
  if (status.type() == file_type::directory_file)
    return refused("it is a directory");
  if (status.type() != file_type::regular_file)
    return refused(llvm::Twine("it is not a regular file (") + kindOf(status.type()) + ")");
  return llvm::Error::success();
}
} // namespace

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readRegularFile(llvm::StringRef path, int64_t maxBytes, bool requiresNullTerminator) {
  namespace fs = llvm::sys::fs;
  // Checked before opening, since opening a FIFO waits for a writer, and again on the open
  // file, so that the path cannot be swapped in between.
  fs::file_status status;
  if (std::error_code ec = fs::status(path, status))
    return llvm::errorCodeToError(ec);
  if (llvm::Error error = checkRegular(status))
    return error;
  llvm::Expected<fs::file_t> file = fs::openNativeFileForRead(path);
  if (!file)
    return file.takeError();
  auto close = llvm::make_scope_exit([&] { fs::closeFile(*file); });
  if (std::error_code ec = fs::status(*file, status))
    return llvm::errorCodeToError(ec);
  if (llvm::Error error = checkRegular(status))
    return error;
  uint64_t size = status.getSize();
  if (size > uint64_t(maxBytes))
    return refused("it is " + llvm::Twine(size) + " bytes, more than the limit of " +
                   llvm::Twine(maxBytes));
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer = llvm::MemoryBuffer::getOpenFile(
      *file, path, size, requiresNullTerminator, /*IsVolatile=*/false);
  if (!buffer)
    return llvm::errorCodeToError(buffer.getError());
  return std::move(*buffer);
}

size_t jsonTooDeepAt(llvm::StringRef text, unsigned limit) {
  unsigned depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit)
        return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return llvm::StringRef::npos;
}

} // namespace parc
