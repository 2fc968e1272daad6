//===- Deadline.h - The timeouts every communicator's waits share ---------===//
//
// Private to runtime/comm: every blocking wait of every communicator ends at a deadline, and
// the message that reports it says the same thing whichever implementation timed out.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_COMM_DEADLINE_H
#define PARC_RUNTIME_COMM_DEADLINE_H

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace parc::runtime::comm {

using Clock = std::chrono::steady_clock;

inline std::string formatSeconds(double seconds) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%g s", seconds);
  return text;
}

inline Clock::time_point deadlineAfter(double seconds) {
  // Anything beyond a year is "no deadline" and must not overflow the clock.
  double clamped = std::min(std::max(seconds, 0.0), 365.0 * 24 * 3600);
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(clamped));
}

} // namespace parc::runtime::comm

#endif
