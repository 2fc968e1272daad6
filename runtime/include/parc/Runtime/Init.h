//===- Init.h - Counter-based parameter initialisation --------------------===//
//
// Every parameter element is a pure function of (seed, parameter name, global flat index), so
// a shard is filled from its plan entry alone and every shard under every mapping (and both
// copies of a tied embedding) holds exactly its slice of the single-rank weights.
//
// The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011). Element i of a tensor named `name` takes
//   key     = initNameHash(name), low word first,
//   counter = (i low, i high, seed low, seed high),
// turns the four output words into two 53-bit uniforms u1 in (0, 1], u2 in [0, 1) and returns
// std * sqrt(-2 ln u1) cos(2 pi u2) (Box-Muller, one normal per counter). The value is computed
// in double and rounded once to the element type, so an fp32 shard holds the rounded fp64
// weights.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_INIT_H
#define PARC_RUNTIME_INIT_H

#include "parc/Plan/Plan.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <array>
#include <cstdint>

namespace parc::runtime {

/// Philox4x32 with 10 rounds, as Random123's philox4x32_R(10, counter, key).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// FNV-1a over the name's bytes followed by the SplitMix64 finaliser, so that names differing
/// in one digit ("block.1" and "block.2") give unrelated keys.
uint64_t initNameHash(llvm::StringRef name);

/// The standard normal sample of element `index` of the tensor whose name hashes to `nameHash`.
double initStandardNormal(uint64_t seed, uint64_t nameHash, uint64_t index);

/// Fills the shard's local buffer (row-major over the slice sizes) with its slice of the
/// tensor of shape `globalShape` named `name`: normal(0, std), zeros or ones.
template <typename T>
void initShard(T *out, uint64_t seed, llvm::StringRef name, llvm::ArrayRef<int64_t> globalShape,
               llvm::ArrayRef<plan::Slice> slice, plan::InitKind kind, double std);

/// The same from a plan entry.
template <typename T> void initShard(T *out, uint64_t seed, const plan::ParamShard &shard);

} // namespace parc::runtime

#endif
