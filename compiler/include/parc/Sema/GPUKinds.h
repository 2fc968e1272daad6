//===- GPUKinds.h - Datasheet values of the GPUs a cluster may name -------===//
//
// `gpu { kind = h100_sxm }` fills every gpu field left unset from one row of this table: HBM
// size and bandwidth, dense tensor-core peaks per dtype, SM count, and the NVLink bandwidth
// of one GPU (the default of intra_node). The figures are NVIDIA's datasheets, cited row by
// row in docs/memory-and-cost.md; sparsity figures are never used (training is dense).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEMA_GPUKINDS_H
#define PARC_SEMA_GPUKINDS_H

#include "parc/Sema/Program.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

namespace parc {

struct GPUDatasheet {
  GPUKind kind;
  llvm::StringRef spelling; // as written in `kind = ...`
  int64_t memoryGiB;
  double memoryBandwidthGBs; // GB/s, decimal
  PeakFlops peakTFLOPS;      // dense, TFLOP/s
  int64_t sms;
  double intraNodeGBs; // one GPU, one direction: NVLink, or PCIe when the card has no NVLink
  IntraNodeKind intraNode;
};

/// Every row, the generic kind (no datasheet) excluded.
llvm::ArrayRef<GPUDatasheet> gpuDatasheets();
/// The row of a kind, or null for GPUKind::Generic.
const GPUDatasheet *datasheetOf(GPUKind kind);
const GPUDatasheet *datasheetOf(llvm::StringRef spelling);

} // namespace parc

#endif
