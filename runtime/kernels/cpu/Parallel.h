//===- Parallel.h - The kernels' threads: one small pool per calling thread --===//
//
// Private to the CPU kernels. OpenBLAS runs single-threaded (set when the kernels load):
// the kernels split their own work, GEMMs included (Blas.cpp), over kernelThreads() threads,
// the calling thread and kernelThreads() - 1 workers of a pool that belongs to the calling
// thread. A rank thread of a local run therefore has its own pool, and parrun sizes
// kernelThreads() so that ranks x threads does not exceed the cores: one pool never serves two
// ranks, and no BLAS pool spins beside it.
//
// Work is cut into contiguous ranges; each thread takes its own share of them first, the same
// rows op after op, then what is left of the others' (Parallel.cpp); a kernel whose
// result must not depend on the thread count computes nothing that depends on where a range
// starts: a reduction cuts its input into fixed-size blocks and sums the blocks' partials in
// order, or gives each thread whole columns.
// A parallelFor inside another one runs inline.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_PARALLEL_H
#define PARC_RUNTIME_KERNELS_CPU_PARALLEL_H

#include <algorithm>
#include <cstdint>
#include <utility>

namespace parc::runtime::cpu::detail {

/// A range body without std::function's allocation: a function pointer and its context.
struct RangeTask {
  void (*run)(const void *context, int64_t begin, int64_t end);
  const void *context;
};

/// Runs `task` on `chunks` contiguous ranges covering [0, n), on the calling thread and the
/// workers of its pool, each thread its own share of the ranges first, then any left.
void runParallel(int64_t n, int64_t chunks, RangeTask task);

/// The number of threads a kernel may use on this thread now (1 inside a parallelFor).
int64_t availableThreads();

/// Chunks per thread of a parallelFor: enough that the caller absorbs the share of a worker
/// that starts late, few enough that a chunk's claim is nothing beside its work.
inline constexpr int64_t chunksPerThread = 4;

/// body(begin, end) over contiguous ranges of [0, n), each at least `grain` long (but one),
/// on up to availableThreads() threads, in up to `perThread` ranges a thread.
template <typename Body>
void parallelFor(int64_t n, int64_t grain, const Body &body, int64_t perThread = chunksPerThread) {
  int64_t threads = availableThreads(), most = grain > 0 ? n / grain : n;
  int64_t chunks = std::min(threads * perThread, most);
  if (threads <= 1 || chunks <= 1) {
    if (n > 0)
      body(int64_t(0), n);
    return;
  }
  RangeTask task{[](const void *context, int64_t begin, int64_t end) {
                   (*static_cast<const Body *>(context))(begin, end);
                 },
                 &body};
  runParallel(n, chunks, task);
}

} // namespace parc::runtime::cpu::detail

#endif
