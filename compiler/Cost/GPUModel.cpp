//===- GPUModel.cpp - What one GPU's kernels achieve, by shape ------------===//
//
// Curves and sources: docs/memory-and-cost.md, "Compute".
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/GPUModel.h"

#include <algorithm>
#include <cmath>

namespace parc {

namespace {
// gemmCeiling: Maximum Achievable Matmul FLOPS over the datasheet peak as measured by
// stas00/ml-engineering (compute/accelerator, "MAMF" table: A100 SXM 267.9 of 312, H100 SXM
// 792.1 of 989), times the architecture's sustained share. memoryCeiling: a copy kernel's
// share of HBM. flash*: FlashAttention's share of peak at head size 128 and long sequences
// (FlashAttention-2 reaches 50-73% forward on A100, Dao 2023; on H100 FlashAttention-2
// reaches 35% and the Hopper kernels of FlashAttention-3 and cuDNN 60-75%, Shah et al.
// 2024): the middle of those ranges, since training stacks ship one or the other.
//
// sustained is the one parameter per architecture taken from published training runs rather
// than a datasheet or a benchmark: the share of its best-case rate a kernel keeps inside a
// training step (clocks held under the power limit for minutes rather than a benchmark's
// seconds, SMs shared with NCCL's kernels). Ampere's is calibrated on the in-sample runs
// (bench/calibration); an H100 throttles harder at 700 W, and llm-foundry's published H100
// table sits at 0.72-0.8 of its A100 table's MFU for the same models, hence Hopper's.
// docs/memory-and-cost.md shows the calibration.
constexpr GPUEfficiency scaled(const char *name, double gemm, double memory, double forward,
                               double backward, double sustained) {
  return {name, gemm * sustained, memory, forward * sustained, backward * sustained};
}
const GPUEfficiency kAmpere = scaled("ampere", 0.86, 0.85, 0.60, 0.45, 0.9);
const GPUEfficiency kHopper = scaled("hopper", 0.80, 0.88, 0.45, 0.35, 0.8);
const GPUEfficiency kBlackwell = scaled("blackwell", 0.80, 0.88, 0.45, 0.35, 0.8);
const GPUEfficiency kAda = scaled("ada", 0.80, 0.85, 0.45, 0.35, 0.8);

/// Output tiles cuBLAS chooses between for a large GEMM, with the share of a 256 x 128 tile's
/// rate each reaches (a smaller tile reloads its operands more often per FLOP).
struct Tile {
  double rows, cols, rate;
};
constexpr Tile kTiles[] = {{256, 128, 1.0}, {128, 128, 0.9}, {128, 64, 0.7}};

/// With fewer tiles than SMs, cuBLAS splits the inner dimension over several tiles and adds
/// the partial products: it pays for the extra pass but fills the GPU. Splits keep at least
/// 256 of K each.
constexpr double kSplits[] = {1, 2, 4, 8, 16};
constexpr double kSplitRate = 0.9, kMinSplitDepth = 256;

/// A thin inner dimension: each output tile pays a fixed prologue and epilogue, worth about
/// 64 steps of its K loop.
constexpr double kInnerHalfEfficiency = 64;
/// FlashAttention's share grows with the keys each query block streams through, and with the
/// head size (its inner products; FlashAttention-2 runs head 64 about 10% slower than 128).
constexpr double kFlashHalfSequence = 256, kFlashHalfHead = 16;
/// FlashAttention-2 rounds the head size up to a multiple of 32 and runs that size's kernel
/// (Dao-AILab/flash-attention, csrc/flash_attn/flash_api.cpp: head_size_rounded; kernels are
/// instantiated for 32, 64, 96, 128, ... 256); its Triton version pads to a power of two,
/// which is the same for every head size up to 128 that is a multiple of 32, and for 112.
constexpr double kFlashHeadMultiple = 32;
} // namespace

const GPUEfficiency &efficiencyOf(GPUKind kind) {
  switch (kind) {
  case GPUKind::H100_SXM:
  case GPUKind::H100_PCIe:
  case GPUKind::H200:
    return kHopper;
  case GPUKind::B200:
    return kBlackwell;
  case GPUKind::L40S:
    return kAda;
  case GPUKind::A100_40GB:
  case GPUKind::A100_80GB:
  case GPUKind::Generic:
    break;
  }
  return kAmpere;
}

GPUModel::GPUModel(const ClusterSpec &cluster, DType dtype)
    : eff(efficiencyOf(cluster.gpuKind)), peakFlops(cluster.gpuFlops),
      elementBytes(double(bytesPerElement(dtype))), sms(cluster.gpuSMs) {
  // Without a datasheet, an A100's balance: 312 TFLOP/s over 2.039 TB/s, about 153 FLOP/B.
  bandwidth = cluster.gpuMemoryBandwidth > 0 ? cluster.gpuMemoryBandwidth : peakFlops / 153;
}

double GPUModel::waveEfficiency(double m, double n, double k, double batch) const {
  if (sms <= 0)
    return 1;
  double best = 0;
  for (const Tile &tile : kTiles)
    for (double split : kSplits) {
      if (split > 1 && k / split < kMinSplitDepth)
        break;
      double tiles = std::ceil(m / tile.rows) * std::ceil(n / tile.cols) * batch * split;
      double waves = std::ceil(tiles / double(sms));
      // The useful share of the SM slots the waves occupy, at the tile's own rate.
      double used = m * n * batch * split / (waves * double(sms) * tile.rows * tile.cols);
      best = std::max(best, used * tile.rate * (split > 1 ? kSplitRate : 1));
    }
  return best;
}

double GPUModel::gemmEfficiency(double m, double n, double k, double batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0)
    return 1;
  double inner = k / (k + kInnerHalfEfficiency);
  return eff.gemmCeiling * waveEfficiency(m, n, k, batch) * inner;
}

double GPUModel::gemmSeconds(double m, double n, double k, double batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0)
    return 0;
  double flops = 2 * m * n * k * batch;
  double compute = flops / (peakFlops * gemmEfficiency(m, n, k, batch));
  double bytes = elementBytes * batch * (m * k + k * n + m * n);
  return std::max({compute, bytes / (bandwidth * eff.memoryCeiling), kKernelFloor});
}

double GPUModel::flashSeconds(double flops, double seq, double head, bool backward) const {
  if (flops <= 0 || head <= 0)
    return 0;
  auto falloff = [](double x, double half) { return x / (x + half); };
  // The kernel runs at its padded head size (a head of 112 runs the 128 kernel): the padded
  // columns take time and do no useful work.
  double kernelHead = std::ceil(head / kFlashHeadMultiple) * kFlashHeadMultiple;
  double share = (backward ? eff.flashBackward : eff.flashForward) *
                 falloff(seq, kFlashHalfSequence) * falloff(kernelHead, kFlashHalfHead) /
                 falloff(128, kFlashHalfHead);
  return std::max(flops * (kernelHead / head) / (peakFlops * share), kKernelFloor);
}

double GPUModel::memorySeconds(double bytes, double kernels) const {
  if (bytes <= 0)
    return 0;
  return std::max(bytes / (bandwidth * eff.memoryCeiling), kernels * kKernelFloor);
}

} // namespace parc
