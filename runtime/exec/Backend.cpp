//===- Backend.cpp - Whether this rank can execute on the backend asked for -===//
//
// --backend=cuda must never fall back to the CPU behind the user's back, so it fails with the
// first reason that applies, in the order a user would fix them.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Executor.h"

#ifdef PARC_HAVE_CUDA
#include "parc/Runtime/CudaKernels.h"
#endif

namespace parc::runtime {

std::string backendUnavailable(Backend backend) {
  if (backend == Backend::CPU)
    return "";
#ifndef PARC_HAVE_CUDA
  return "--backend=cuda: this parrun was built without the CUDA backend (CMake found no nvcc); "
         "rebuild with the CUDA toolkit installed, or use --backend=cpu";
#else
  std::string why;
  if (!cuda::cudaDeviceAvailable(&why))
    return "--backend=cuda: " + why +
           "; run on a machine with an NVIDIA GPU of compute capability 8.0 or newer, or use "
           "--backend=cpu";
  return "";
#endif
}

} // namespace parc::runtime
