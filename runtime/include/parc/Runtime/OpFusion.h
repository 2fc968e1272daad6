//===- OpFusion.h - Fusing a chunk's bias_add + gelu before it runs -------===//
//
// The MLP's bias_add writes x + bias only for gelu to read it (and gelu_bwd, in the backward);
// Megatron-LM fuses the pair (bias_gelu_fusion) so that the sum never reaches memory. parrun
// does the same to a rank plan's op lists before it runs them: the forward pair
//
//   bias_add(x, bias) -> y;  gelu(y) -> z
//
// becomes gelu(x, bias) -> z, and the backward pair
//
//   gelu_bwd(y, dz) -> dy;  bias_add_bwd(dy) -> (dx, dbias)
//
// becomes gelu_bwd(x, bias, dz) -> (dx, dbias), which recomputes x + bias. Only where nothing
// else reads y or dy and the backward does not recompute y; the backward then keeps x where it
// kept y, so the memory held is the same. The fused ops exist only inside parrun (a plan file's
// gelu has one input); the interpreter runs them with the devices' biasGelu kernels, whose CPU
// versions are the two kernels in turn, so results are bitwise those of the unfused lists.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_OPFUSION_H
#define PARC_RUNTIME_OPFUSION_H

#include "parc/Plan/Plan.h"

namespace parc::runtime {

/// Fuses every bias_add + gelu pair of `chunk` that qualifies; returns how many.
int64_t fuseBiasGELU(plan::Chunk &chunk);

} // namespace parc::runtime

#endif
