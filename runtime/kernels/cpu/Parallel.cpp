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

/// `size` - 1 workers that take the chunks of each job with the caller: each thread claims the
/// next unclaimed chunk until none is left, so a worker the scheduler has not woken yet (a
/// loaded machine) leaves its share to the caller instead of holding up the whole job. Which
/// thread runs a chunk never changes what the chunk computes.
class WorkerPool {
public:
  explicit WorkerPool(int64_t size) {
    for (int64_t w = 1; w < size; ++w)
      workers.emplace_back([this] { work(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping.store(true);
      state.store(packed(generationOf(state.load()) + 1, 0, 0));
    }
    wake.notify_all();
    for (std::thread &worker : workers)
      worker.join();
  }
  int64_t size() const { return int64_t(workers.size()) + 1; }

  void run(int64_t n, int64_t chunks, detail::RangeTask task) {
    job = {n, chunks, task};
    done.store(0);
    failure = nullptr;
    failed.store(false);
    uint64_t generation = generationOf(state.load()) + 1;
    {
      std::lock_guard<std::mutex> lock(mutex);
      state.store(packed(generation, uint64_t(chunks), 0));
    }
    wake.notify_all();
    runChunks(generation);
    // What is left are chunks the workers claimed: spin, yielding the core to them.
    while (done.load() < chunks)
      std::this_thread::yield();
    // Every chunk is counted, so no worker reads the job or the failure any more.
    if (failed.load())
      std::rethrow_exception(failure);
  }

  /// Chunks per job at most (the state word's field).
  static constexpr int64_t maxChunks = 0xffff;

private:
  struct Job {
    int64_t n = 0, chunks = 0;
    detail::RangeTask task{};
  };

  // The state word: the job's generation, its chunk count and the next unclaimed chunk, so
  // that a claim is one compare-and-swap that fails for a job that is over.
  static uint64_t packed(uint64_t generation, uint64_t chunks, uint64_t next) {
    return generation << 32 | chunks << 16 | next;
  }
  static uint64_t generationOf(uint64_t word) { return word >> 32; }

  /// Runs unclaimed chunks of job `generation` until none is left. The job's fields are read
  /// only after a claim succeeded: the caller waits for that chunk, so they stay as written.
  void runChunks(uint64_t generation) {
    uint64_t word = state.load();
    for (;;) {
      uint64_t chunks = (word >> 16) & 0xffff, next = word & 0xffff;
      if (generationOf(word) != generation || next >= chunks)
        return;
      if (!state.compare_exchange_weak(word, word + 1))
        continue;
      int64_t c = int64_t(next), begin = job.n * c / job.chunks;
      int64_t end = job.n * (c + 1) / job.chunks;
      if (begin < end && !failed.load()) {
        try {
          job.task.run(job.task.context, begin, end);
        } catch (...) {
          fail(std::current_exception());
        }
      }
      done.fetch_add(1);
      word = state.load();
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

  void work() {
    insideParallel = true;
    uint64_t seen = 0;
    auto published = [&] { return generationOf(state.load()) != seen; };
    for (;;) {
      // Spin for about a job's length before sleeping on the condition variable.
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while (!published() && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      if (!published()) {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, published);
      }
      if (stopping.load())
        return;
      seen = generationOf(state.load());
      runChunks(seen);
    }
  }

  std::vector<std::thread> workers;
  std::mutex mutex;
  std::condition_variable wake;
  std::atomic<uint64_t> state{0};
  std::atomic<int64_t> done{0};
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
