//===- Parallel.h - The kernels' threads: one small pool per calling thread --===//
//
// Private to the CPU kernels. OpenBLAS runs single-threaded (setKernelThreads sets it to 1):
// the kernels split their own work, GEMMs included (Blas.cpp), over kernelThreads() threads,
// the calling thread and kernelThreads() - 1 workers of a pool that belongs to the calling
// thread. A rank thread of a local run therefore has its own pool, and parrun sizes
// kernelThreads() so that ranks x threads does not exceed the cores: one pool never serves two
// ranks, and no BLAS pool spins beside it.
//
// Work is cut into contiguous ranges; a kernel whose result must not depend on the thread count
// (a reduction) cuts its input into fixed-size blocks and sums the blocks' partials in order.
// A parallelFor inside another one runs inline.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_PARALLEL_H
#define PARC_RUNTIME_KERNELS_CPU_PARALLEL_H

#include <cstdint>
#include <utility>

namespace parc::runtime::cpu::detail {

/// A range body without std::function's allocation: a function pointer and its context.
struct RangeTask {
  void (*run)(const void *context, int64_t begin, int64_t end);
  const void *context;
};

/// Runs `task` on `parts` contiguous ranges covering [0, n), part 0 on the calling thread.
void runParallel(int64_t n, int64_t parts, RangeTask task);

/// The number of threads a kernel may use on this thread now (1 inside a parallelFor).
int64_t availableThreads();

/// body(begin, end) over contiguous ranges of [0, n), each at least `grain` long (but one),
/// on up to availableThreads() threads.
template <typename Body> void parallelFor(int64_t n, int64_t grain, const Body &body) {
  int64_t parts = availableThreads();
  if (grain > 0 && n / grain < parts)
    parts = n / grain;
  if (parts <= 1) {
    if (n > 0)
      body(int64_t(0), n);
    return;
  }
  RangeTask task{[](const void *context, int64_t begin, int64_t end) {
                   (*static_cast<const Body *>(context))(begin, end);
                 },
                 &body};
  runParallel(n, parts, task);
}

} // namespace parc::runtime::cpu::detail

#endif
