//===- Devices.h - The devices the executor is instantiated on ------------===//
//
// Private to runtime/exec: each templated part of the executor ends with
// PARC_FOR_EACH_DEVICE(INSTANTIATE) for its own INSTANTIATE(D), so that the list of devices
// (CPU in fp32, fp64 and mixed; CUDA in fp32, bf16 and fp16 where the backend is built) is
// written once.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_EXEC_DEVICES_H
#define PARC_RUNTIME_EXEC_DEVICES_H

#include "parc/Runtime/CpuDevice.h"

#ifdef PARC_HAVE_CUDA
#include "parc/Runtime/CudaDevice.h"
#define PARC_FOR_EACH_CUDA_DEVICE(M)                                                               \
  M(CudaDevice<float>) M(CudaDevice<__nv_bfloat16>) M(CudaDevice<__half>)
#else
#define PARC_FOR_EACH_CUDA_DEVICE(M)
#endif

namespace parc::runtime {
/// The mixed CPU device is one macro argument only through its alias (a comma would split it).
using CpuMixedDevice = CpuDevice<float, double>;
} // namespace parc::runtime

#define PARC_FOR_EACH_DEVICE(M)                                                                    \
  M(CpuDevice<float>) M(CpuDevice<double>) M(CpuMixedDevice) PARC_FOR_EACH_CUDA_DEVICE(M)

#endif
