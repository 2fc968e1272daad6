//===- core-latency.cpp - How far apart two CPUs are: a cache line's round trip ----===//
//
//   parc_cpu_core_latency [CPU_A CPU_B]
//
// Two threads, pinned to CPU_A and CPU_B (default: the first two this process may run on),
// hand one cache line back and forth; prints the median round trip of 5 trials of 100000
// hand-offs in ns. On the 2-core VMs of docs/runtime.md it reads 50-90 ns while the two vCPUs
// share an L3 and 320-390 ns while the hypervisor has placed them apart, and a parrun rank
// whose kernel threads trade every op's rows then runs at about one thread's speed; so the
// bench scripts print it beside their tables.
//
//===----------------------------------------------------------------------===//

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr long handOffs = 100000;

bool pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The line the two threads trade: odd values are A's turn handed to B, even ones B's reply.
struct alignas(64) Line {
  std::atomic<long> value{0};
};

// The round trip in ns, or -1 when either thread cannot be pinned (then neither spins: two
// spinning threads on one CPU would hand off once per time slice).
double roundTripNs(int cpuA, int cpuB) {
  Line line;
  enum : int { waiting, ready, failed };
  std::atomic<int> partnerState{waiting};
  std::atomic<bool> go{false}, abandon{false};
  std::thread partner([&] {
    partnerState = pinTo(cpuB) ? ready : failed;
    while (!go && !abandon)
      std::this_thread::yield();
    if (abandon)
      return;
    for (long i = 0; i < handOffs; ++i) {
      while (line.value.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      line.value.store(2 * i + 2, std::memory_order_release);
    }
  });
  bool pinned = pinTo(cpuA);
  while (partnerState == waiting)
    std::this_thread::yield();
  if (!pinned || partnerState == failed) {
    abandon = true;
    partner.join();
    return -1;
  }
  go = true;
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < handOffs; ++i) {
    line.value.store(2 * i + 1, std::memory_order_release);
    while (line.value.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  partner.join();
  return std::chrono::duration<double, std::nano>(elapsed).count() / double(handOffs);
}

} // namespace

int main(int argc, char **argv) {
  std::vector<int> cpus;
  if (argc == 3) {
    cpus = {std::atoi(argv[1]), std::atoi(argv[2])};
  } else if (argc == 1) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
      for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu)
        if (CPU_ISSET(cpu, &allowed))
          cpus.push_back(cpu);
  } else {
    std::fprintf(stderr, "usage: parc_cpu_core_latency [CPU_A CPU_B]\n");
    return 2;
  }
  if (cpus.size() < 2 || cpus[0] == cpus[1]) {
    std::fprintf(stderr, "parc_cpu_core_latency: needs two distinct CPUs to run on\n");
    return 2;
  }
  std::vector<double> trials;
  for (int trial = 0; trial < 5; ++trial) {
    double ns = roundTripNs(cpus[0], cpus[1]);
    if (ns < 0) {
      std::fprintf(stderr, "parc_cpu_core_latency: cannot run on CPUs %d and %d\n", cpus[0],
                   cpus[1]);
      return 2;
    }
    trials.push_back(ns);
  }
  std::sort(trials.begin(), trials.end());
  std::printf("%.0f ns round trip between CPUs %d and %d\n", trials[2], cpus[0], cpus[1]);
  return 0;
}
