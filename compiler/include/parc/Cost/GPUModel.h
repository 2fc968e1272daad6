//===- GPUModel.h - What one GPU's kernels achieve, by shape --------------===//
//
// The compute half of the step-time model: how long one kernel of a training step runs on
// one GPU. A GEMM runs at its dense peak times an efficiency that depends on the sharded
// matrix shape (the ceiling a large GEMM reaches, wave quantisation of its output tiles over
// the SMs, and a falloff for a thin inner dimension); FlashAttention at its own fraction of
// peak, lower for short sequences; elementwise, norm and softmax kernels by the bytes they
// move over HBM. Every kernel takes at least a launch's worth of time. A kernel is bound by
// the slower of its FLOPs and its bytes (the roofline). docs/memory-and-cost.md derives each
// curve and cites the figures behind the per-architecture parameters.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_GPUMODEL_H
#define PARC_COST_GPUMODEL_H

#include "parc/Sema/Program.h"

namespace parc {

/// The few parameters of one GPU architecture's curves.
struct GPUEfficiency {
  const char *architecture;
  double gemmCeiling;   // the best large bf16 GEMM's share of the dense peak (MAMF / peak)
  double memoryCeiling; // a streaming kernel's share of the HBM bandwidth
  double flashForward;  // FlashAttention's share of the dense peak at long sequences
  double flashBackward;
};

/// The parameters for a GPU kind; the generic kind gets Ampere's.
const GPUEfficiency &efficiencyOf(GPUKind kind);

class GPUModel {
public:
  GPUModel(const ClusterSpec &cluster, DType dtype);

  /// Seconds of `batch` independent m x n x k products (2mnk FLOPs each) in the model's dtype.
  double gemmSeconds(double m, double n, double k, double batch = 1) const;
  /// The share of the dense peak such a GEMM reaches (FLOPs / (seconds x peak)).
  double gemmEfficiency(double m, double n, double k, double batch = 1) const;
  /// Seconds of a FlashAttention pass of `flops` over `seq` keys with heads of size `head`.
  double flashSeconds(double flops, double seq, double head, bool backward) const;
  /// Seconds of `kernels` memory-bound kernels moving `bytes` in all.
  double memorySeconds(double bytes, double kernels = 1) const;

  double peak() const { return peakFlops; }
  double memoryBandwidth() const { return bandwidth; }
  /// What a kernel takes at the least: its launch and the drain of its last wave.
  static constexpr double kKernelFloor = 4e-6;

private:
  double waveEfficiency(double m, double n, double k, double batch) const;

  const GPUEfficiency &eff;
  double peakFlops, bandwidth, elementBytes;
  int64_t sms;
};

} // namespace parc

#endif
