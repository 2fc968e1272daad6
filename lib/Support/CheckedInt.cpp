#include "parc/Support/CheckedInt.h"

namespace parc {

std::optional<int64_t> parseDecimalInt(std::string_view digits) {
  if (digits.empty())
    return std::nullopt;
  int64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9')
      return std::nullopt;
    auto shifted = checkedMul(value, 10);
    if (!shifted)
      return std::nullopt;
    auto next = checkedAdd(*shifted, c - '0');
    if (!next)
      return std::nullopt;
    value = *next;
  }
  return value;
}

std::optional<int64_t> roundUpToMultiple(int64_t n, int64_t m) {
  int64_t rem = n % m;
  if (rem == 0)
    return n;
  return checkedAdd(n, m - rem);
}

} // namespace parc
