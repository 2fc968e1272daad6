//===- CheckedInt.h - 64-bit integer arithmetic that reports overflow -----===//
//
// Sizes in a .par file multiply quickly (layers x hidden^2 x ...); a silent wrap would turn a
// configuration that cannot fit into one that looks tiny, so every operation says if it failed.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_CHECKEDINT_H
#define PARC_SUPPORT_CHECKEDINT_H

#include <cstdint>
#include <optional>
#include <string_view>

namespace parc {

inline std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

inline std::optional<int64_t> checkedSub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

inline std::optional<int64_t> checkedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

/// Outcome of an integer division: the quotient when it is exact, otherwise the reason.
struct IntDivision {
  enum Status { Exact, Inexact, ByZero, Overflow } status;
  int64_t quotient = 0;
};

inline IntDivision checkedDiv(int64_t a, int64_t b) {
  if (b == 0)
    return {IntDivision::ByZero};
  if (a == INT64_MIN && b == -1)
    return {IntDivision::Overflow};
  if (a % b != 0)
    return {IntDivision::Inexact, a / b};
  return {IntDivision::Exact, a / b};
}

/// Parses a decimal integer literal; nullopt if it does not fit 64 bits or is not all digits.
std::optional<int64_t> parseDecimalInt(std::string_view digits);

/// Rounds `n` up to a multiple of `m` (m > 0); nullopt on overflow.
std::optional<int64_t> roundUpToMultiple(int64_t n, int64_t m);

} // namespace parc

#endif
