//===- Memory.cpp - Fills and copies of the executor's buffers ------------===//
//
// A step clears every gradient and zeroes each arena block it hands out again: hundreds of
// megabytes that one thread writes at a fraction of the memory bandwidth the kernel threads
// reach together, so these run over ranges of the buffer on the kernel threads too.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace parc::runtime::cpu {

template <typename T> void fillValues(T *dst, int64_t n, T value) {
  // dst = value; +0 is all zero bytes, which memset writes with the machine's widest stores
  // (the gradients are cleared so every step)
  if (value == T(0) && !std::signbit(value))
    return zeroBytes(dst, size_t(n) * sizeof(T));
  detail::forElements(n, [&](int64_t begin, int64_t end) {
    std::fill(dst + begin, dst + end, value);
  });
}

template <typename T> void copyValues(T *dst, const T *src, int64_t n) {
  // dst = src
  detail::forElements(n, [&](int64_t begin, int64_t end) {
    std::copy(src + begin, src + end, dst + begin);
  });
}

void zeroBytes(void *dst, size_t bytes) {
  // dst[0, bytes) = 0, in ranges of at least elementGrain floats' worth of bytes
  auto *base = static_cast<unsigned char *>(dst);
  detail::parallelFor(int64_t(bytes), detail::elementGrain * int64_t(sizeof(float)),
                      [&](int64_t begin, int64_t end) {
                        std::memset(base + begin, 0, size_t(end - begin));
                      });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void fillValues(T *, int64_t, T);                                                       \
  template void copyValues(T *, const T *, int64_t);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
