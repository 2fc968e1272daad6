//===- OpFusion.h - Fusing a chunk's elementwise pairs before it runs -----===//
//
// Two pairs of a transformer block's ops pass a tensor through memory only for the next op to
// read it back; Megatron-LM fuses them (bias_gelu_fusion, and the fused residual + layernorm of
// its kernels), and parrun does the same to a rank plan's op lists before it runs them:
//
//   bias_add(x, bias) -> y; gelu(y) -> z              =>  gelu(x, bias) -> z
//   gelu_bwd(y, dz) -> dy; bias_add_bwd(dy) -> (dx, db)  =>  gelu_bwd(x, bias, dz) -> (dx, db)
//
// (the backward recomputes x + bias), only where nothing else reads y or dy and the backward
// does not recompute y; the backward then keeps x where it kept y, so the memory held is the
// same. And in the forward
//
//   residual_add(a, b) -> s; layernorm(s, w, bias) -> y  =>  layernorm(a, b, w, bias) -> (s, y)
//
// (rmsnorm alike, without the bias), where the norm is the first op after the add to read s:
// the sum is still written, for the residual stream, but not read back.
//
// The fused forms exist only inside parrun (a plan file's gelu has one input); the interpreter
// runs them with the devices' fused kernels, whose CPU versions are the two kernels in turn, so
// results are bitwise those of the unfused lists.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_OPFUSION_H
#define PARC_RUNTIME_OPFUSION_H

#include "parc/Plan/Plan.h"

namespace parc::runtime {

/// Fuses every bias_add + gelu pair of `chunk` that qualifies; returns how many.
int64_t fuseBiasGELU(plan::Chunk &chunk);
/// Fuses every residual_add + layernorm/rmsnorm pair of `chunk`'s forward that qualifies.
int64_t fuseResidualNorm(plan::Chunk &chunk);

} // namespace parc::runtime

#endif
