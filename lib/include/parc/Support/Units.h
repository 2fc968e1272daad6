//===- Units.h - Typed quantities: bytes, bandwidth, time, compute rate ---===//
//
// A quantity carries its dimension as exponents of (byte, second, FLOP), so arithmetic derives
// dimensions (bytes / time is a bandwidth) and a field can say which one it expects. Values are
// normalised to base units: bytes, bytes/s, seconds, FLOP/s.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_UNITS_H
#define PARC_SUPPORT_UNITS_H

#include "llvm/ADT/StringRef.h"
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace parc {

struct Dimension {
  int8_t bytes = 0, seconds = 0, flops = 0;

  static Dimension none() { return {}; }
  static Dimension size() { return {1, 0, 0}; }
  static Dimension bandwidth() { return {1, -1, 0}; }
  static Dimension time() { return {0, 1, 0}; }
  static Dimension flopRate() { return {0, -1, 1}; }
  static Dimension flopCount() { return {0, 0, 1}; }

  bool isNone() const { return bytes == 0 && seconds == 0 && flops == 0; }
  Dimension operator*(Dimension o) const {
    return {int8_t(bytes + o.bytes), int8_t(seconds + o.seconds), int8_t(flops + o.flops)};
  }
  Dimension operator/(Dimension o) const {
    return {int8_t(bytes - o.bytes), int8_t(seconds - o.seconds), int8_t(flops - o.flops)};
  }
  bool operator==(Dimension o) const {
    return bytes == o.bytes && seconds == o.seconds && flops == o.flops;
  }
  bool operator!=(Dimension o) const { return !(*this == o); }

  /// "a size in bytes", "a bandwidth", ... for diagnostics ("expected a size in bytes, got a
  /// bandwidth").
  std::string describe() const;
  /// The base unit spelled as parc prints normalised values: "B", "B/s", "s", "FLOP/s", "".
  std::string baseUnit() const;
};

/// A unit suffix as written after a number.
struct Unit {
  Dimension dim;
  /// Exact scale to base units when it is an integer (bytes, bit rates), else 0.
  int64_t intScale;
  /// Scale to base units as a double (always set).
  double scale;
};

/// Looks up a unit suffix (`GiB`, `Gb/s`, `us`, `TFLOPS`); case-sensitive, since `Gb/s` and
/// `GB/s` differ by a factor of eight.
std::optional<Unit> lookupUnit(llvm::StringRef spelling);

/// Every unit spelling, for "did you mean".
std::vector<llvm::StringRef> allUnitSpellings();

/// Human rendering of a base-unit value: 85899345920 B -> "80 GiB", 3e11 B/s -> "300 GB/s".
std::string formatQuantity(double value, Dimension dim);

/// Bytes in binary units with one decimal: "61.2 GiB", "512.0 MiB", "12 B".
std::string formatBytes(double bytes);

} // namespace parc

#endif
