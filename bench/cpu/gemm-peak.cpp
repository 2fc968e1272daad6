//===- gemm-peak.cpp - The GEMM rate the CPU kernels reach on a large sgemm ----===//
//
//   parc_cpu_gemm_bench [SIZE] [THREADS...]
//
// Times cpu::matmulForward (OpenBLAS, cut over the kernel threads as every parrun GEMM is)
// on SIZE x SIZE x SIZE fp32 (default 2048), the median of 5 calls after a warm-up, for each
// thread count given (default 1 and 2), and prints GFLOP/s: the ceiling that parrun's GEMM
// rates in `parrun --profile` are a share of.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace parc::runtime;

int main(int argc, char **argv) {
  cpu::restartOnMatchingBlasCore(argv);
  int64_t size = argc > 1 ? std::atoll(argv[1]) : 2048;
  std::vector<int64_t> threadCounts;
  for (int i = 2; i < argc; ++i)
    threadCounts.push_back(std::atoll(argv[i]));
  if (threadCounts.empty())
    threadCounts = {1, 2};
  if (size < 16 || size > 16384) {
    std::fprintf(stderr, "parc_cpu_gemm_bench: SIZE must be between 16 and 16384\n");
    return 2;
  }
  std::vector<float> a(size_t(size * size)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 7) * 0.25f - 0.75f;
    b[i] = float(i % 5) * 0.5f - 1.0f;
  }
  std::printf("OpenBLAS kernels: %s\n", cpu::blasCoreName().c_str());
  double flops = 2.0 * double(size) * double(size) * double(size);
  for (int64_t threads : threadCounts) {
    cpu::setKernelThreads(threads);
    cpu::matmulForward(c.data(), a.data(), b.data(), size, size, size, false, false);
    std::vector<double> seconds;
    for (int rep = 0; rep < 5; ++rep) {
      auto start = std::chrono::steady_clock::now();
      cpu::matmulForward(c.data(), a.data(), b.data(), size, size, size, false, false);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    std::printf("sgemm %lld^3, %lld thread%s: %.1f GFLOP/s (median of 5, best %.1f)\n",
                (long long)size, (long long)threads, threads == 1 ? "" : "s",
                flops / seconds[2] / 1e9, flops / seconds[0] / 1e9);
  }
  return 0;
}
