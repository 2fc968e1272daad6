//===- Fibers.cpp - ucontext fibers on a few threads ----------------------===//
//
// One scheduler mutex guards which fibers are ready, parked or done; a thread that finds none
// ready watches for one without the lock for up to kWatchBeforeSleep, then sleeps until one is
// woken or a parked fiber's deadline passes, so a deadline ends a park as it would end a
// condition variable's wait. Thread-local state is read only before a
// fiber first switches (a compiler may keep a thread-local's address across a call, and the
// fiber may come back on another thread): a fiber finds its way home through its own record.
//
// Which ready fiber a thread takes decides whose data its caches hold: a rank's weights,
// activations and the interpreter's tables are megabytes, and eight ranks on two cores switch
// some 270 times a step (tiny.par at tp 2 pp 2 dp 2). A thread takes the fiber it ran last of
// those that ran on it, whose data its cache most likely still holds; with none of its own
// ready it takes the one that has waited longest since it ran anywhere, leaving the other
// thread's warm ones to it. Before, the first ready fiber went to whichever thread asked.
// Median ratios over alternated 12-step runs (new/old): tiny.par's 8 ranks 1.025 with the
// two vCPUs near (55 pairs) and 1.046 apart (46); its zero = 3 variant 0.977 near (25) and
// 1.014 apart (26); tiny-moe.par's 4 ranks 0.984 near (70) and 0.985 apart (60). A fiber
// passed over kMaxPassedOver times is taken next, so that two ranks waking each other cannot
// starve a third (at 32 it cut in often enough to lose the gain on tiny.par).
//
//===----------------------------------------------------------------------===//

#include "Fibers.h"

#include "BriefLock.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

// AddressSanitizer must be told of each switch of stacks, or it takes the other stack's frames
// for overflows and its fake stacks (detect_stack_use_after_return) for leaks.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PARC_ASAN_FIBERS 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PARC_ASAN_FIBERS 1
#endif
#ifdef PARC_ASAN_FIBERS
#include <sanitizer/common_interface_defs.h>
#endif

namespace parc::runtime::comm {

namespace {
enum class Status { Ready, Running, Parked, Done };
struct Scheduler;
} // namespace

struct Fiber {
  Scheduler *scheduler = nullptr;
  const std::function<void()> *task = nullptr;
  ucontext_t context{};
  ucontext_t *home = nullptr; // the context of the thread running it
  void *stack = nullptr;
  size_t mappedBytes = 0;
  // Under the scheduler's mutex.
  Status status = Status::Ready;
  bool woken = false;
  int64_t lastThread = -1; // the thread that ran it last, or -1 before its first run
  uint64_t lastRun = 0;    // the scheduler's count of runs when it last started
  uint64_t readyAt = 0;    // that count when it last became ready
  Clock::time_point until = Clock::time_point::max();
  // Written and read by the fiber and the thread running it, never by others.
  bool finished = false;
  std::mutex *release = nullptr; // unlocked by the thread once the fiber is off it
  // The stack of the thread that runs it, and the sanitizer's fake stack of each side.
  const void *homeBottom = nullptr;
  size_t homeSize = 0;
  void *fakeStack = nullptr, *homeFakeStack = nullptr;

  ~Fiber() {
    if (stack)
      munmap(stack, mappedBytes);
  }
};

namespace {

/// As a thread's stack under Linux's usual 8 MiB limit; pages are touched only as used.
constexpr size_t kStackBytes = size_t(8) << 20;

thread_local Fiber *starting = nullptr;

// Not inlined, so that the thread-local is read on the thread that calls it.
[[gnu::noinline]] Fiber *startingFiber() { return starting; }
[[gnu::noinline]] void setStartingFiber(Fiber *fiber) { starting = fiber; }
thread_local Fiber *running = nullptr;
[[gnu::noinline]] Fiber *runningFiber() { return running; }
[[gnu::noinline]] void setRunningFiber(Fiber *fiber) { running = fiber; }

// Switching to a stack, and having arrived on one, as AddressSanitizer asks; no-ops without it.
// `save` null means the stack left will not be entered again.
void leavingFor(void **save, const void *bottom, size_t size) {
#ifdef PARC_ASAN_FIBERS
  __sanitizer_start_switch_fiber(save, bottom, size);
#else
  (void)save, (void)bottom, (void)size;
#endif
}
void arrived(void *fakeStack, const void **fromBottom, size_t *fromSize) {
#ifdef PARC_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fakeStack, fromBottom, fromSize);
#else
  (void)fakeStack, (void)fromBottom, (void)fromSize;
#endif
}

void fiberMain() {
  Fiber *self = startingFiber();
  arrived(nullptr, &self->homeBottom, &self->homeSize);
  (*self->task)();
  self->finished = true;
  leavingFor(nullptr, self->homeBottom, self->homeSize);
  setcontext(self->home);
}

struct Scheduler {
  std::mutex mutex;
  std::condition_variable idle;
  std::deque<Fiber *> ready;
  std::vector<std::unique_ptr<Fiber>> fibers;
  size_t unfinished = 0;
  uint64_t runs = 0;
  static constexpr uint64_t kMaxPassedOver = 1024;
  /// Bumped whenever a fiber becomes ready or finishes, for threads watching without the lock.
  std::atomic<uint64_t> changes{0};
  static constexpr std::chrono::microseconds kWatchBeforeSleep{200};

  void makeReady(Fiber *fiber) {
    fiber->status = Status::Ready;
    fiber->woken = false;
    fiber->readyAt = runs;
    ready.push_back(fiber);
    changes.fetch_add(1, std::memory_order_release);
    idle.notify_one();
  }

  /// Releases `lock` until a fiber may have become ready (or finished), or `until`, spinning: a
  /// thread that ran out of fibers usually gets one within a few tens of microseconds, about
  /// what being woken from the condition variable takes (46 us on average, tiny.par's 8 ranks
  /// on two threads, instrumented). Returns whether something changed.
  bool watchForChange(std::unique_lock<std::mutex> &lock, Clock::time_point until) {
    uint64_t seen = changes.load(std::memory_order_acquire);
    lock.unlock();
    bool changed = false;
    for (unsigned spins = 1; !changed; ++spins) {
      cpuRelax();
      changed = changes.load(std::memory_order_acquire) != seen;
      if (spins % 64 == 0 && Clock::now() >= until)
        break;
    }
    lockBriefly(lock);
    return changed;
  }

  /// Of the ready fibers (in the order they became ready), the one `thread` should run.
  std::deque<Fiber *>::iterator pick(int64_t thread) {
    if (runs - ready.front()->readyAt >= kMaxPassedOver)
      return ready.begin();
    auto better = [&](const Fiber *a, const Fiber *b) {
      bool aMine = a->lastThread == thread, bMine = b->lastThread == thread;
      if (aMine != bMine)
        return aMine;
      return aMine ? a->lastRun > b->lastRun : a->lastRun < b->lastRun;
    };
    return std::min_element(ready.begin(), ready.end(), better);
  }

  /// The next fiber for `thread` to run, waiting for one; null once every fiber has finished.
  Fiber *next(std::unique_lock<std::mutex> &lock, int64_t thread) {
    for (bool watchedInVain = false;;) {
      if (!ready.empty()) {
        auto chosen = pick(thread);
        Fiber *fiber = *chosen;
        ready.erase(chosen);
        fiber->lastThread = thread;
        fiber->lastRun = ++runs;
        return fiber;
      }
      if (unfinished == 0)
        return nullptr;
      Clock::time_point now = Clock::now(), earliest = Clock::time_point::max();
      for (const std::unique_ptr<Fiber> &fiber : fibers)
        if (fiber->status == Status::Parked) {
          if (fiber->until <= now)
            makeReady(fiber.get());
          else
            earliest = std::min(earliest, fiber->until);
        }
      if (!ready.empty())
        continue;
      // Sleep only once a watch has seen nothing happen.
      if (!watchedInVain) {
        watchedInVain = !watchForChange(lock, std::min(earliest, now + kWatchBeforeSleep));
        continue;
      }
      watchedInVain = false;
      if (earliest == Clock::time_point::max())
        idle.wait(lock);
      else
        idle.wait_until(lock, earliest);
    }
  }

  void work(int64_t thread) {
    ucontext_t here;
    std::unique_lock<std::mutex> lock = lockedBriefly(mutex);
    while (Fiber *fiber = next(lock, thread)) {
      fiber->status = Status::Running;
      fiber->home = &here;
      lock.unlock();
      setStartingFiber(fiber);
      setRunningFiber(fiber);
      leavingFor(&fiber->homeFakeStack, static_cast<char *>(fiber->stack) + fiber->mappedBytes -
                                            kStackBytes,
                 kStackBytes);
      swapcontext(&here, &fiber->context);
      arrived(fiber->homeFakeStack, nullptr, nullptr);
      setRunningFiber(nullptr);
      if (std::mutex *held = std::exchange(fiber->release, nullptr))
        held->unlock();
      lockBriefly(lock);
      if (fiber->finished) {
        fiber->status = Status::Done;
        changes.fetch_add(1, std::memory_order_release);
        if (--unfinished == 0)
          idle.notify_all();
      } else if (fiber->woken || Clock::now() >= fiber->until) {
        makeReady(fiber);
      } else {
        fiber->status = Status::Parked;
      }
    }
  }
};

std::unique_ptr<Fiber> makeFiber(Scheduler &scheduler, const std::function<void()> &task) {
  auto fiber = std::make_unique<Fiber>();
  fiber->scheduler = &scheduler;
  fiber->task = &task;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  fiber->mappedBytes = kStackBytes + page;
  void *base = mmap(nullptr, fiber->mappedBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (base == MAP_FAILED)
    throw std::runtime_error(std::string("cannot map a rank's fiber stack: ") +
                             std::strerror(errno));
  fiber->stack = base;
  // A guard page below the stack: an overflow faults instead of writing into another's.
  if (mprotect(base, page, PROT_NONE) != 0 || getcontext(&fiber->context) != 0)
    throw std::runtime_error(std::string("cannot set up a rank's fiber: ") +
                             std::strerror(errno));
  fiber->context.uc_stack.ss_sp = static_cast<char *>(base) + page;
  fiber->context.uc_stack.ss_size = kStackBytes;
  fiber->context.uc_link = nullptr;
  makecontext(&fiber->context, fiberMain, 0);
  return fiber;
}

} // namespace

void runFibers(const std::vector<std::function<void()>> &tasks, int64_t threads) {
  Scheduler scheduler;
  for (const std::function<void()> &task : tasks)
    scheduler.fibers.push_back(makeFiber(scheduler, task));
  for (const std::unique_ptr<Fiber> &fiber : scheduler.fibers)
    scheduler.ready.push_back(fiber.get());
  scheduler.unfinished = tasks.size();
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < std::max<int64_t>(1, threads); ++t)
    workers.emplace_back([&scheduler, t] { scheduler.work(t); });
  for (std::thread &worker : workers)
    worker.join();
}

Fiber *currentFiber() { return runningFiber(); }

void park(std::unique_lock<std::mutex> &lock, Clock::time_point until) {
  Fiber *self = runningFiber();
  self->until = until;
  std::mutex *mutex = lock.release();
  self->release = mutex;
  leavingFor(&self->fakeStack, self->homeBottom, self->homeSize);
  swapcontext(&self->context, self->home);
  arrived(self->fakeStack, &self->homeBottom, &self->homeSize);
  lock = lockedBriefly(*mutex);
}

void wakeFiber(Fiber *fiber) {
  Scheduler &scheduler = *fiber->scheduler;
  std::unique_lock<std::mutex> lock = lockedBriefly(scheduler.mutex);
  if (fiber->status == Status::Parked)
    scheduler.makeReady(fiber);
  else
    fiber->woken = true;
}

} // namespace parc::runtime::comm
