//===- AttentionSlices.h - Where one (batch, head) of q, k, v lies --------===//
//
// Private to the CPU attention kernels (Attention.cpp, FlashAttention.cpp): q, k, v and y are
// [seq, batch, heads*headDim], so one (batch, head) slice is a seq x headDim matrix whose rows
// are batch*heads*headDim apart, and query head h reads key/value head h / (heads / kvHeads).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_ATTENTIONSLICES_H
#define PARC_RUNTIME_KERNELS_CPU_ATTENTIONSLICES_H

#include <cassert>
#include <cstdint>

namespace parc::runtime::cpu::detail {

struct HeadSlices {
  int64_t qOffset, kvOffset, qStride, kvStride;
};

inline HeadSlices headSlices(int64_t b, int64_t h, int64_t batch, int64_t heads, int64_t kvHeads,
                             int64_t headDim) {
  assert(kvHeads > 0 && heads % kvHeads == 0 && "kv_heads must divide heads");
  int64_t kvHead = h / (heads / kvHeads);
  return {(b * heads + h) * headDim, (b * kvHeads + kvHead) * headDim, batch * heads * headDim,
          batch * kvHeads * headDim};
}

} // namespace parc::runtime::cpu::detail

#endif
