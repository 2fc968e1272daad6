//===- Fibers.h - Ranks as fibers on as many threads as there are cores ---===//
//
// Private to runtime/comm. Eight rank threads on two cores left the kernel to choose which rank
// runs: it switched threads ~450 times a step (tiny.par at tp 2 pp 2 dp 2), put a woken rank
// on its waker's core while the other core idled for milliseconds, and sliced ranks mid-GEMM.
// As fibers, a rank runs until it waits, and a thread that is free takes whichever rank is
// ready: the cores stay busy while any two ranks can run, and a switch costs no system call
// into the scheduler.
//
// A fiber parks only through park(), never while it holds a lock other than the one park
// releases, and never inside a catch handler (the C++ runtime keeps the exception being
// handled per thread, and a fiber may resume on another thread).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_COMM_FIBERS_H
#define PARC_RUNTIME_COMM_FIBERS_H

#include "Deadline.h"

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace parc::runtime::comm {

struct Fiber;

/// Runs each task as a fiber on `threads` threads and returns when all have returned. A task
/// must not throw.
void runFibers(const std::vector<std::function<void()>> &tasks, int64_t threads);

/// The fiber this thread runs, or null outside runFibers.
Fiber *currentFiber();

/// Takes the current fiber off its thread until wakeFiber() or `until`. `lock` is released
/// once the fiber is off and held again when park returns; it may return early, as a
/// condition variable's wait may.
void park(std::unique_lock<std::mutex> &lock, Clock::time_point until);

/// Makes `fiber` ready if it is parked, or makes its next park return at once.
void wakeFiber(Fiber *fiber);

} // namespace parc::runtime::comm

#endif
