//===- CommReference.h - Serial references for the communicator tests ----===//
//
// Every collective is compared bit for bit with the left fold of the members' buffers in
// group-list order, computed on one thread. The inputs mix magnitudes so that another
// summation order would round differently (CommTest checks that it does).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_TEST_UNIT_COMMREFERENCE_H
#define PARC_TEST_UNIT_COMMREFERENCE_H

#include "parc/Runtime/Communicator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace parc::runtime::test {

/// The buffer rank `rank` contributes: values of magnitudes from 1e-8 to 1e8, both signs.
template <typename T> std::vector<T> inputOf(int64_t rank, size_t count, uint64_t seed) {
  std::mt19937_64 random(seed * 1000003 + rank);
  std::uniform_real_distribution<double> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<T> values(count);
  for (T &value : values)
    value = static_cast<T>(mantissa(random) * std::pow(10.0, exponent(random)));
  return values;
}

template <typename T>
std::vector<T> serialFold(llvm::ArrayRef<int64_t> group, size_t count, uint64_t seed, ReduceOp op) {
  std::vector<T> result = inputOf<T>(group[0], count, seed);
  for (size_t i = 1; i < group.size(); ++i) {
    std::vector<T> next = inputOf<T>(group[i], count, seed);
    for (size_t k = 0; k < count; ++k)
      result[k] = op == ReduceOp::Sum ? result[k] + next[k] : std::max(result[k], next[k]);
  }
  return result;
}

/// Member inputs of `part` elements each, concatenated in list order.
template <typename T>
std::vector<T> serialGather(llvm::ArrayRef<int64_t> group, size_t part, uint64_t seed) {
  std::vector<T> gathered;
  for (int64_t member : group) {
    std::vector<T> piece = inputOf<T>(member, part, seed);
    gathered.insert(gathered.end(), piece.begin(), piece.end());
  }
  return gathered;
}

/// An all-to-all between the members of `group`: member i sends member j
/// countOf(i, j) elements (zero for some pairs, itself included), its whole input being
/// inputOf(member i, the sum over j, seed) in member order.
struct AllToAllCase {
  llvm::ArrayRef<int64_t> group;
  uint64_t seed;

  size_t countOf(size_t from, size_t to) const { return (from * 7 + to * 3 + seed) % 5 * 3; }
  std::vector<size_t> sendCounts(size_t from) const {
    std::vector<size_t> counts;
    for (size_t to = 0; to < group.size(); ++to)
      counts.push_back(countOf(from, to));
    return counts;
  }
  std::vector<size_t> recvCounts(size_t to) const {
    std::vector<size_t> counts;
    for (size_t from = 0; from < group.size(); ++from)
      counts.push_back(countOf(from, to));
    return counts;
  }
  template <typename T> std::vector<T> input(size_t from) const {
    std::vector<size_t> counts = sendCounts(from);
    size_t total = 0;
    for (size_t count : counts)
      total += count;
    return inputOf<T>(group[from], total, seed);
  }
  /// What member `to` receives: each sender's part for it, senders in member order.
  template <typename T> std::vector<T> expected(size_t to) const {
    std::vector<T> out;
    for (size_t from = 0; from < group.size(); ++from) {
      std::vector<T> in = input<T>(from);
      size_t offset = 0;
      for (size_t j = 0; j < to; ++j)
        offset += countOf(from, j);
      out.insert(out.end(), in.begin() + offset, in.begin() + offset + countOf(from, to));
    }
    return out;
  }
};

template <typename T> bool bitwiseEqual(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline size_t positionIn(llvm::ArrayRef<int64_t> group, int64_t rank) {
  return std::find(group.begin(), group.end(), rank) - group.begin();
}

} // namespace parc::runtime::test

#endif // PARC_TEST_UNIT_COMMREFERENCE_H
