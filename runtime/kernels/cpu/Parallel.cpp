//===- Parallel.cpp - Per-thread worker pools of the CPU kernels ----------===//
//
// A kernel of a small model lasts tens of microseconds, about what a futex wake-up takes, so a
// worker spins (yielding) for a while after each job before it sleeps, and the caller runs the
// first part itself instead of waiting idle.
//
//===----------------------------------------------------------------------===//

#include "Parallel.h"

#include "parc/Runtime/Kernels.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace parc::runtime::cpu {

namespace {

std::atomic<int64_t> threadsSetting{1};
thread_local bool insideParallel = false;

/// `size` - 1 workers; worker w runs part w of each job, the caller part 0.
class WorkerPool {
public:
  explicit WorkerPool(int64_t size) {
    for (int64_t w = 1; w < size; ++w)
      workers.emplace_back([this, w] { work(w); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      generation.fetch_add(1);
    }
    wake.notify_all();
    for (std::thread &worker : workers)
      worker.join();
  }
  int64_t size() const { return int64_t(workers.size()) + 1; }

  void run(int64_t n, int64_t parts, detail::RangeTask task) {
    job = {n, parts, task};
    // Every worker acknowledges every job, so that none still reads this one when the next
    // is written.
    pending.store(int64_t(workers.size()));
    {
      std::lock_guard<std::mutex> lock(mutex);
      generation.fetch_add(1);
    }
    wake.notify_all();
    runPart(0);
    // The workers' parts are as long as this one: spin, yielding the core to them.
    while (pending.load() > 0)
      std::this_thread::yield();
  }

private:
  struct Job {
    int64_t n = 0, parts = 0;
    detail::RangeTask task{};
  };

  void runPart(int64_t part) {
    if (part >= job.parts)
      return;
    int64_t begin = job.n * part / job.parts, end = job.n * (part + 1) / job.parts;
    if (begin < end)
      job.task.run(job.task.context, begin, end);
  }

  void work(int64_t index) {
    insideParallel = true;
    uint64_t seen = 0;
    for (;;) {
      // Spin for about a job's length before sleeping on the condition variable.
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while (generation.load() == seen && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      if (generation.load() == seen) {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return generation.load() != seen; });
      }
      seen = generation.load();
      if (stopping)
        return;
      runPart(index);
      pending.fetch_sub(1);
    }
  }

  std::vector<std::thread> workers;
  std::mutex mutex;
  std::condition_variable wake;
  std::atomic<uint64_t> generation{0};
  std::atomic<int64_t> pending{0};
  bool stopping = false;
  Job job;
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
  // The kernels split the GEMMs themselves; OpenBLAS's own pool would only compete.
  openblas_set_num_threads(1);
}

int64_t kernelThreads() { return threadsSetting.load(); }

namespace detail {

int64_t availableThreads() { return insideParallel ? 1 : threadsSetting.load(); }

void runParallel(int64_t n, int64_t parts, RangeTask task) {
  WorkerPool &pool = poolOfThisThread();
  parts = std::min(parts, pool.size());
  insideParallel = true;
  pool.run(n, parts, task);
  insideParallel = false;
}

} // namespace detail
} // namespace parc::runtime::cpu
