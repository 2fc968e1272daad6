//===- FileInput.h - Reading a file that may be hostile -------------------===//
//
// A path given to parc or parrun may name a device (/dev/zero never ends), a FIFO or a huge
// file. readRegularFile reads only regular files and only up to a size, and says which rule
// a refused path broke, so that every reader reports it the same way.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_FILEINPUT_H
#define PARC_SUPPORT_FILEINPUT_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <memory>

namespace parc {

/// The whole content of the regular file `path`, at most `maxBytes` long. The error carries
/// the system's error code where there is one and reads, without the path: "No such file or
/// directory", "it is a directory", "it is not a regular file (a character device)", "it is
/// 20000000 bytes, more than the limit of 16777216".
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readRegularFile(llvm::StringRef path, int64_t maxBytes, bool requiresNullTerminator = true);

/// Where JSON text first nests deeper than `limit` arrays and objects (outside strings), or
/// npos. Checked before llvm::json::parse, whose recursion would let a hostile file exhaust
/// the stack.
size_t jsonTooDeepAt(llvm::StringRef text, unsigned limit);

} // namespace parc

#endif
