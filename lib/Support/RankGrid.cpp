//===- RankGrid.cpp - Megatron-Core's rank layout over the parallel axes --===//
#include "parc/Support/RankGrid.h"

#include <algorithm>

namespace parc {

const char *toString(Axis axis) {
  static const char *const names[] = {"tp", "cp", "ep", "dp", "pp"};
  return names[indexOf(axis)];
}

RankOrder::RankOrder(llvm::ArrayRef<Axis> named) {
  for (Axis a : named)
    all[count++] = a;
  size_t next = count;
  for (Axis a : kAllAxes)
    if (!names(a))
      all[next++] = a;
}

bool RankOrder::names(Axis axis) const {
  return std::find(all.begin(), all.begin() + count, axis) != all.begin() + count;
}

std::string RankOrder::str(const AxisSizes &sizes, AxisSet skipIfOne) const {
  std::string out;
  for (Axis a : namedAxes()) {
    if (skipIfOne.contains(a) && sizes[indexOf(a)] == 1)
      continue;
    out += (out.empty() ? "" : "-") + std::string(toString(a));
  }
  return out;
}

RankGrid::RankGrid(const AxisSizes &sizes, const RankOrder &order)
    : sizes(sizes), rankOrder(order) {
  int64_t stride = 1;
  for (Axis a : order.axes()) {
    strides[indexOf(a)] = stride;
    stride *= sizes[indexOf(a)];
  }
  worldSize = stride;
}

AxisSizes RankGrid::coordsOf(int64_t rank) const {
  AxisSizes c{};
  for (Axis a : kAllAxes)
    c[indexOf(a)] = coord(rank, a);
  return c;
}

int64_t RankGrid::rankOf(const AxisSizes &coords) const {
  int64_t rank = 0;
  for (Axis a : kAllAxes)
    rank += coords[indexOf(a)] * stride(a);
  return rank;
}

int64_t RankGrid::groupSize(AxisSet axes) const {
  int64_t n = 1;
  for (Axis a : kAllAxes)
    if (axes.contains(a))
      n *= size(a);
  return n;
}

std::vector<int64_t> RankGrid::group(int64_t rank, AxisSet axes) const {
  std::vector<int64_t> members(size_t(groupSize(axes)));
  for (size_t i = 0; i < members.size(); ++i)
    members[i] = member(rank, axes, int64_t(i));
  return members;
}

int64_t RankGrid::member(int64_t rank, AxisSet axes, int64_t i) const {
  // The member's index over `axes` is a mixed-radix number in the grid's order.
  int64_t result = rank;
  for (Axis a : rankOrder.axes())
    if (axes.contains(a)) {
      result += (i % size(a) - coord(rank, a)) * stride(a);
      i /= size(a);
    }
  return result;
}

int64_t RankGrid::indexIn(int64_t rank, AxisSet axes) const {
  int64_t index = 0, radix = 1;
  for (Axis a : rankOrder.axes())
    if (axes.contains(a)) {
      index += coord(rank, a) * radix;
      radix *= size(a);
    }
  return index;
}

std::vector<std::vector<int64_t>> RankGrid::groups(AxisSet axes) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t rank = 0; rank < worldSize; ++rank)
    if (indexIn(rank, axes) == 0)
      out.push_back(group(rank, axes));
  return out;
}

bool RankGrid::contiguous(AxisSet axes) const {
  // Between the first and the last digit of `axes` (sizes 1 left out), no other axis.
  bool started = false, ended = false;
  for (Axis a : rankOrder.axes()) {
    if (size(a) == 1)
      continue;
    if (axes.contains(a)) {
      if (ended)
        return false;
      started = true;
    } else if (started) {
      ended = true;
    }
  }
  return true;
}

RankOrder expertOrder(const RankOrder &order) {
  if (order.names(Axis::EP))
    return order;
  std::vector<Axis> named;
  for (Axis a : order.namedAxes()) {
    if (a == Axis::DP)
      named.push_back(Axis::EP);
    named.push_back(a);
  }
  if (!order.names(Axis::DP))
    named.push_back(Axis::EP);
  return RankOrder(named);
}

RankGrid expertGrid(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp,
                    const RankOrder &order) {
  return RankGrid(axisSizes(tp, 1, ep, dp * cp / ep, pp), expertOrder(order));
}

} // namespace parc
