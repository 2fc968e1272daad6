//===- Parallel.cpp - Per-thread worker pools of the CPU kernels ----------===//
//
// A kernel of a small model lasts tens of microseconds, about what a futex wake-up takes, so a
// worker spins (yielding) for a while after each job before it sleeps, and the caller takes
// chunks itself instead of waiting idle. A body that throws (a scratch buffer's bad_alloc) on
// any thread ends the job: the chunks not yet started are skipped, the caller waits for those
// running, so that no thread touches the body once it returns, and rethrows the first error.
//
//===----------------------------------------------------------------------===//

#include "Parallel.h"

#include "parc/Runtime/Kernels.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace parc::runtime::cpu {

namespace {

std::atomic<int64_t> threadsSetting{1};
thread_local bool insideParallel = false;

// The kernels split the GEMMs themselves; OpenBLAS's own pool would only compete. Set once,
// when the kernels are loaded (after OpenBLAS read OPENBLAS_NUM_THREADS), so that every program
// that links them, parrun, a test or a bench, runs OpenBLAS single-threaded.
[[maybe_unused]] const bool blasSingleThreaded = (openblas_set_num_threads(1), true);

/// `size` - 1 workers that take the chunks of each job with the caller. Thread t (the caller is
/// 0) owns the t-th of `size` runs of chunks (equal to within one) and takes its own first, then
/// the ones left in the other threads' runs: so a worker the scheduler has not woken yet (a
/// loaded machine) leaves its share to the others instead of holding up the whole job, and
/// otherwise each thread takes the same rows op after op, where its cache holds what it wrote
/// (over two distant cores a row that moves between them costs a transfer per cache line).
/// Which thread runs a chunk never changes what the chunk computes.
class WorkerPool {
public:
  explicit WorkerPool(int64_t size) : slots(size_t(size)) {
    try {
      for (int64_t w = 1; w < size; ++w)
        workers.emplace_back([this, w] { work(w); });
    } catch (...) { // a thread that cannot start: the started ones must not outlive the pool
      stopWorkers();
      throw;
    }
  }
  ~WorkerPool() { stopWorkers(); }
  int64_t size() const { return int64_t(workers.size()) + 1; }
  void run(int64_t n, int64_t chunks, detail::RangeTask task) {
    job = {n, chunks, task};
    failure = nullptr;
    failed.store(false);
    uint32_t next = generation.load() + 1u; // wraps, as the claim word's field does
    int64_t threads = size();
    for (int64_t t = 0; t < threads; ++t) {
      slots[size_t(t)].done.store(0);
      slots[size_t(t)].claim.store(
          packed(next, uint64_t(chunks * (t + 1) / threads), uint64_t(chunks * t / threads)));
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      generation.store(next);
    }
    wake.notify_all();
    runChunks(0, next);
    // What is left are chunks the workers claimed: spin, yielding the core to them.
    while (chunksDone() < chunks)
      std::this_thread::yield();
    // Every chunk is counted, so no worker reads the job or the failure any more.
    if (failed.load())
      std::rethrow_exception(failure);
  }

  /// Chunks per job at most (the claim word's fields).
  static constexpr int64_t maxChunks = 0xffff;

private:
  struct Job {
    int64_t n = 0, chunks = 0;
    detail::RangeTask task{};
  };
  // A thread's run of chunks: the job's generation, the run's end and its next unclaimed chunk
  // in one word, so that a claim is one compare-and-swap that fails for a job that is over;
  // and the chunks this thread has run. One cache line each, so that a thread claiming and
  // counting its own chunks writes no other thread's line.
  struct alignas(64) Slot {
    std::atomic<uint64_t> claim{0};
    std::atomic<int64_t> done{0};
  };
  static uint64_t packed(uint32_t gen, uint64_t end, uint64_t next) {
    return uint64_t(gen) << 32 | end << 16 | next;
  }
  static uint32_t generationOf(uint64_t word) { return uint32_t(word >> 32); }

  int64_t chunksDone() const {
    int64_t done = 0;
    for (const Slot &slot : slots)
      done += slot.done.load();
    return done;
  }

  /// Thread `self` runs unclaimed chunks of job `gen`, its own run's first, until none is left.
  /// The job's fields are read only after a claim succeeded: the caller waits for that chunk,
  /// so they stay as written.
  void runChunks(int64_t self, uint32_t gen) {
    int64_t threads = size();
    for (int64_t k = 0; k < threads; ++k) {
      Slot &run = slots[size_t((self + k) % threads)];
      uint64_t word = run.claim.load();
      for (;;) {
        uint64_t end = (word >> 16) & 0xffff, next = word & 0xffff;
        if (generationOf(word) != gen || next >= end)
          break;
        if (!run.claim.compare_exchange_weak(word, word + 1))
          continue;
        int64_t c = int64_t(next), begin = job.n * c / job.chunks;
        int64_t stop = job.n * (c + 1) / job.chunks;
        if (begin < stop && !failed.load()) {
          try {
            job.task.run(job.task.context, begin, stop);
          } catch (...) {
            fail(std::current_exception());
          }
        }
        slots[size_t(self)].done.fetch_add(1);
        word = run.claim.load();
      }
    }
  }

  /// Keeps the first error of the job; written before its chunk is counted, which the caller
  /// waits for.
  void fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(failureMutex);
    if (!failure)
      failure = error;
    failed.store(true);
  }

  void stopWorkers() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping.store(true);
      generation.store(generation.load() + 1u);
    }
    wake.notify_all();
    for (std::thread &worker : workers)
      worker.join();
  }

  void work(int64_t self) {
    insideParallel = true;
    uint32_t seen = 0;
    auto published = [&] { return generation.load() != seen; };
    for (;;) {
      // Spin for about a job's length before sleeping on the condition variable.
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while (!published() && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      if (!published()) {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, published);
      }
      // The generation first: stopWorkers sets `stopping` before its last generation, so a
      // worker that saw that generation sees `stopping` (checked the other way round, a worker
      // between the two when the pool stopped would sleep on with the stop's wake-up missed).
      seen = generation.load();
      if (stopping.load())
        return;
      runChunks(self, seen);
    }
  }

  std::vector<std::thread> workers;
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<Slot> slots;
  std::atomic<uint32_t> generation{0};
  std::atomic<bool> stopping{false};
  Job job;
  std::mutex failureMutex;
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
};

WorkerPool &poolOfThisThread() {
  thread_local std::unique_ptr<WorkerPool> pool;
  int64_t wanted = threadsSetting.load();
  if (!pool || pool->size() != wanted)
    pool = std::make_unique<WorkerPool>(wanted);
  return *pool;
}

} // namespace

void setKernelThreads(int64_t threads) {
  threadsSetting.store(std::max<int64_t>(1, threads));
}

int64_t kernelThreads() { return threadsSetting.load(); }

namespace detail {

int64_t availableThreads() { return insideParallel ? 1 : threadsSetting.load(); }

void runParallel(int64_t n, int64_t chunks, RangeTask task) {
  WorkerPool &pool = poolOfThisThread();
  insideParallel = true;
  struct Leave {
    ~Leave() { insideParallel = false; } // also when the body threw
  } leave;
  pool.run(n, std::min(chunks, WorkerPool::maxChunks), task);
}

} // namespace detail
} // namespace parc::runtime::cpu
