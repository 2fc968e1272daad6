//===- RankGrid.h - Megatron-Core's rank layout over the parallel axes ----===//
//
// A rank is a mixed-radix number whose digits are its coordinates along the parallel axes,
// the first axis of the order the least significant digit. A process group over a set of
// axes holds the ranks that agree on every other axis, listed by their mixed-radix index over
// the set itself (the set's axis earliest in the order varying fastest). This is
// Megatron-Core's RankGenerator (megatron/core/parallel_state.py, RankGenerator.get_ranks and
// generate_masked_orthogonal_rank_groups): the "dp-cp" token there is AxisSet{DP, CP} here.
// Compiler (the layout of a .par mapping) and plan verifier (the layout of parallel.order)
// both use it, so the groups a plan lists are the groups the compiler meant.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_RANKGRID_H
#define PARC_SUPPORT_RANKGRID_H

#include "llvm/ADT/ArrayRef.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace parc {

/// The parallel axes, in the order of Megatron-Core's default order string tp-cp-ep-dp-pp:
/// tensor, context (the sequence), expert, data and pipeline parallelism.
enum class Axis { TP, CP, EP, DP, PP };
inline constexpr size_t kAxes = 5;
inline constexpr std::array<Axis, kAxes> kAllAxes = {Axis::TP, Axis::CP, Axis::EP, Axis::DP,
                                                     Axis::PP};
const char *toString(Axis axis);
inline size_t indexOf(Axis axis) { return static_cast<size_t>(axis); }

/// A set of axes: the axes a process group spans.
class AxisSet {
public:
  constexpr AxisSet() = default;
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes)
      bits |= uint8_t(1u << unsigned(a));
  }
  constexpr bool contains(Axis a) const { return bits & (1u << unsigned(a)); }
  bool operator==(AxisSet o) const { return bits == o.bits; }

private:
  uint8_t bits = 0;
};

/// Sizes indexed by Axis.
using AxisSizes = std::array<int64_t, kAxes>;
inline AxisSizes axisSizes(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp) {
  return {tp, cp, ep, dp, pp};
}

/// An order as a .par file or a plan writes it, Megatron's order string: the named axes,
/// fastest-varying first. The axes it leaves out follow in tp-cp-ep-dp-pp order; Megatron
/// requires them to have size 1 (RankGenerator raises otherwise), and so does parc.
class RankOrder {
public:
  /// Megatron-Core's default, tp-cp-ep-dp-pp.
  RankOrder() : RankOrder({Axis::TP, Axis::CP, Axis::EP, Axis::DP, Axis::PP}) {}
  RankOrder(std::initializer_list<Axis> named) : RankOrder(llvm::ArrayRef<Axis>(named)) {}
  /// `named` holds each axis at most once.
  RankOrder(llvm::ArrayRef<Axis> named);

  /// Every axis, the named ones first: the digits of a rank, least significant first.
  const std::array<Axis, kAxes> &axes() const { return all; }
  llvm::ArrayRef<Axis> namedAxes() const { return llvm::ArrayRef<Axis>(all).take_front(count); }
  bool names(Axis axis) const;
  /// The named axes joined by '-', leaving out those of `skipIfOne` whose size is 1: a layout
  /// without context parallelism reads tp-dp-pp whether or not its order names cp.
  std::string str(const AxisSizes &sizes, AxisSet skipIfOne = {Axis::CP, Axis::EP}) const;

  bool operator==(const RankOrder &o) const { return all == o.all && count == o.count; }
  bool operator!=(const RankOrder &o) const { return !(*this == o); }
  bool operator<(const RankOrder &o) const {
    return count != o.count ? count < o.count : all < o.all;
  }

private:
  std::array<Axis, kAxes> all{};
  size_t count = 0;
};

/// The order of Megatron-Core's expert grid, which it builds from the same order string as the
/// dense grid; that string names ep whenever ep > 1. An order that leaves ep out (a .par
/// file's three or four axes, a plan's parallel.order) puts it just below dp, the
/// fastest-varying part of dp x cp's expert share, as the default tp-cp-ep-dp-pp does.
RankOrder expertOrder(const RankOrder &order);


/// The ranks of a job laid out over the axes in one order.
class RankGrid {
public:
  RankGrid() : RankGrid(AxisSizes{1, 1, 1, 1, 1}, RankOrder()) {}
  /// Every size at least 1.
  RankGrid(const AxisSizes &sizes, const RankOrder &order);

  int64_t world() const { return worldSize; }
  int64_t size(Axis axis) const { return sizes[indexOf(axis)]; }
  const AxisSizes &axisSizes() const { return sizes; }
  const RankOrder &order() const { return rankOrder; }
  /// How far apart in rank numbers two neighbours along `axis` are.
  int64_t stride(Axis axis) const { return strides[indexOf(axis)]; }
  int64_t coord(int64_t rank, Axis axis) const { return rank / stride(axis) % size(axis); }
  AxisSizes coordsOf(int64_t rank) const;
  int64_t rankOf(const AxisSizes &coords) const;

  /// The product of the sizes of `axes`: the ranks of one group over them.
  int64_t groupSize(AxisSet axes) const;
  /// The group over `axes` that holds `rank`, member i the one whose index over `axes` is i.
  std::vector<int64_t> group(int64_t rank, AxisSet axes) const;
  /// Member i of that group, without building it.
  int64_t member(int64_t rank, AxisSet axes, int64_t i) const;
  /// `rank`'s position in that group.
  int64_t indexIn(int64_t rank, AxisSet axes) const;
  /// Every group over `axes`, in the order Megatron-Core's get_ranks lists them (by their
  /// lowest rank).
  std::vector<std::vector<int64_t>> groups(AxisSet axes) const;
  /// True when the axes of `axes` of size > 1 are consecutive digits: their groups are then
  /// evenly strided runs of ranks, as if they were one axis.
  bool contiguous(AxisSet axes) const;

private:
  AxisSizes sizes{}, strides{};
  RankOrder rankOrder;
  int64_t worldSize = 1;
};

/// Megatron-Core's expert grid over the ranks of a dense grid of these sizes: expert tensor
/// parallelism = tp, ep, expert dp = dp x cp / ep and cp = 1 (ep divides dp x cp), in
/// expertOrder(order). Its ep groups exchange tokens; its dp groups hold the same experts.
RankGrid expertGrid(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp,
                    const RankOrder &order);

} // namespace parc

#endif
