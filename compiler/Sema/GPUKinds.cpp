//===- GPUKinds.cpp - Datasheet values of the GPUs a cluster may name -----===//
//
// Sources (dense figures; every "with sparsity" figure halved back):
//   A100: NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 columns.
//   H100: NVIDIA H100 Tensor Core GPU datasheet (2023), SXM and PCIe columns.
//   H200: NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column.
//   B200: NVIDIA HGX B200 specifications (1000 W), per GPU.
//   L40S: NVIDIA L40S datasheet (2023).
// SM counts: the architecture whitepapers (A100 108, H100 SXM 132, H100 PCIe 114, B200 148,
// L40S/AD102 142).
//
//===----------------------------------------------------------------------===//
#include "parc/Sema/GPUKinds.h"

namespace parc {

llvm::ArrayRef<GPUDatasheet> gpuDatasheets() {
  using I = IntraNodeKind;
  static const GPUDatasheet rows[] = {
      // kind, spelling, GiB, GB/s, TFLOP/s {bf16, fp16, fp32, tf32}, SMs, link GB/s, link
      {GPUKind::A100_40GB, "a100_40gb", 40, 1555, {312, 312, 19.5, 156}, 108, 300, I::NVLink},
      {GPUKind::A100_80GB, "a100_80gb", 80, 2039, {312, 312, 19.5, 156}, 108, 300, I::NVLink},
      {GPUKind::H100_SXM, "h100_sxm", 80, 3350, {989, 989, 67, 494.5}, 132, 450, I::NVLink},
      {GPUKind::H100_PCIe, "h100_pcie", 80, 2000, {756, 756, 51, 378}, 114, 64, I::PCIe},
      {GPUKind::H200, "h200", 141, 4800, {989, 989, 67, 494.5}, 132, 450, I::NVLink},
      {GPUKind::B200, "b200", 180, 8000, {2250, 2250, 80, 1100}, 148, 900, I::NVLink},
      {GPUKind::L40S, "l40s", 48, 864, {362, 362, 91.6, 183}, 142, 32, I::PCIe},
  };
  return rows;
}

const GPUDatasheet *datasheetOf(GPUKind kind) {
  for (const GPUDatasheet &row : gpuDatasheets())
    if (row.kind == kind)
      return &row;
  return nullptr;
}

const GPUDatasheet *datasheetOf(llvm::StringRef spelling) {
  for (const GPUDatasheet &row : gpuDatasheets())
    if (row.spelling == spelling)
      return &row;
  return nullptr;
}

} // namespace parc
