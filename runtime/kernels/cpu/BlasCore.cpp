//===- BlasCore.cpp - The OpenBLAS kernels that match this CPU ------------===//
//
// Debian 12's OpenBLAS (0.3.21) is built with DYNAMIC_ARCH: when it is loaded it reads the
// CPU's family and model and picks the kernels written for it. Intel models it does not know
// from extended model 0xB on (Emerald Rapids, family 6 model 207, among them) fall through its
// switch to its Prescott kernels, SSE3 only: 21 GFLOP/s on one core of a 2048^3 sgemm where
// SkylakeX's reach 103 on the same core (parc_cpu_gemm_bench, docs/runtime.md). OpenBLAS 0.3.25
// closed that and chooses by the instruction sets (OpenMathLib/OpenBLAS#4267, #4268); this does
// the same for the releases before it, through the OPENBLAS_CORETYPE variable it documents.
//
// Where a restart does not happen: a program started through its dynamic loader (recognised by
// the name ld-*; exec would lose the loader's arguments) warns instead; under valgrind without
// --trace-children the restarted process runs outside valgrind; an OpenBLAS built for Prescott
// alone pays one exec per start and keeps its kernels (the variable then stops a second one).
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include <cblas.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace parc::runtime::cpu {

#if defined(__x86_64__) || defined(__i386__)
namespace {
struct Registers {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

bool cpuidLeaf(unsigned leaf, unsigned subleaf, Registers &r) {
  return __get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d) != 0;
}

// The register state the OS saves on a context switch (XCR0): an instruction set the CPU has
// but the OS does not save is one a kernel must not use.
unsigned long long savedState() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

} // namespace

// OpenBLAS's own tests of the instruction sets (driver/others/dynamic.c: support_avx,
// support_avx2, support_avx512, support_avx512_bf16), read from the same CPUID bits.
std::string blasCoreForInstructionSets() {
  Registers basic;
  if (!cpuidLeaf(1, 0, basic))
    return "";
  bool osSavesYmm = (basic.c & (1u << 27)) && (savedState() & 0x6) == 0x6;
  bool avx = osSavesYmm && (basic.c & (1u << 28));
  if (!avx)
    return "";
  Registers extended, extended1;
  if (!cpuidLeaf(7, 0, extended))
    return "Sandybridge";
  // AVX-512 only with AVX2: OpenBLAS's support_avx512 computes that condition but does not act
  // on it; its AVX-512 kernels use AVX2 instructions too.
  bool avx2 = extended.b & (1u << 5);
  bool avx512 = avx2 && (extended.b & (1u << 31)) && (savedState() & 0xe0) == 0xe0;
  if (avx512 && cpuidLeaf(7, 1, extended1) && (extended1.a & (1u << 5)))
    return "Cooperlake";
  if (avx512)
    return "SkylakeX";
  return avx2 ? "Haswell" : "Sandybridge";
}
#else
std::string blasCoreForInstructionSets() { return ""; }
#endif

std::string blasCoreName() {
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
}

namespace {
// The OPENBLAS_CORETYPE to restart with: empty when OpenBLAS's choice stands or the variable is
// set already.
std::string blasCoreCorrection() {
  if (std::getenv("OPENBLAS_CORETYPE"))
    return "";
  // Prescott is the fallback for a CPU OpenBLAS does not know; a core it chose by model, even
  // an older one, stays.
  if (blasCoreName() != "Prescott")
    return "";
  return blasCoreForInstructionSets();
}
} // namespace

void restartOnMatchingBlasCore(char **argv) {
  // OpenBLAS picked its kernels when it was loaded, before main: only a process started with
  // OPENBLAS_CORETYPE set gets others. exec keeps the process (its pid, an MPI launcher's
  // environment), and the variable set makes the restarted one skip this.
  std::string core = blasCoreCorrection();
  if (core.empty())
    return;
  // Exec the file /proc/self/exe points to, not the link: the kernel names the process after
  // the path exec'd, and ps, top and pgrep -x (mpi-equivalence.sh) would see "exe".
  char self[4096];
  ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const char *problem = nullptr;
  if (length <= 0) {
    problem = std::strerror(errno);
  } else if (size_t(length) >= sizeof(self) - 1) {
    problem = "its path is too long";
  } else {
    self[length] = '\0';
    const char *name = std::strrchr(self, '/');
    // A program started through its dynamic loader (scripts/gpu-check.sh starts them through
    // the bundle's ld.so): exec'ing that again would lose the loader's own arguments.
    if (std::strncmp(name ? name + 1 : self, "ld-", 3) == 0)
      problem = "started through the dynamic loader";
    else if (setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0)
      problem = std::strerror(errno);
  }
  if (!problem) {
    execv(self, argv);
    problem = std::strerror(errno);
    unsetenv("OPENBLAS_CORETYPE");
  }
  std::fprintf(stderr,
               "%s: warning: OpenBLAS runs its Prescott kernels, slower than the %s ones this "
               "CPU can run, and the program could not restart on those (%s); set "
               "OPENBLAS_CORETYPE=%s\n",
               argv[0], core.c_str(), problem, core.c_str());
}

} // namespace parc::runtime::cpu
