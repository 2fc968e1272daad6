#include "parc/Support/Units.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"
#include <cmath>

namespace parc {

std::string Dimension::describe() const {
  if (isNone())
    return "a plain number";
  if (*this == size())
    return "a size in bytes";
  if (*this == bandwidth())
    return "a bandwidth";
  if (*this == time())
    return "a time";
  if (*this == flopRate())
    return "a compute rate";
  if (*this == flopCount())
    return "a FLOP count";
  return "a quantity in " + baseUnit();
}

std::string Dimension::baseUnit() const {
  if (*this == flopRate())
    return "FLOP/s";
  std::string num, den;
  auto put = [](std::string &s, const char *sym, int e) {
    if (e == 0)
      return;
    if (!s.empty())
      s += "*";
    s += sym;
    if (std::abs(e) != 1)
      s += "^" + std::to_string(std::abs(e));
  };
  put(bytes > 0 ? num : den, "B", bytes);
  put(flops > 0 ? num : den, "FLOP", flops);
  put(seconds > 0 ? num : den, "s", seconds);
  if (den.empty())
    return num;
  return (num.empty() ? "1" : num) + "/" + den;
}

namespace {
struct UnitEntry {
  const char *spelling;
  Dimension dim;
  int64_t intScale;
  double scale;
};

constexpr int64_t kKi = 1024, kKB = 1000;

const UnitEntry kUnits[] = {
    {"B", Dimension::size(), 1, 1},
    {"KB", Dimension::size(), kKB, 1e3},
    {"MB", Dimension::size(), kKB * kKB, 1e6},
    {"GB", Dimension::size(), kKB * kKB * kKB, 1e9},
    {"TB", Dimension::size(), kKB * kKB * kKB * kKB, 1e12},
    {"PB", Dimension::size(), kKB * kKB * kKB * kKB * kKB, 1e15},
    {"KiB", Dimension::size(), kKi, 1024.0},
    {"MiB", Dimension::size(), kKi * kKi, 1048576.0},
    {"GiB", Dimension::size(), kKi * kKi * kKi, 1073741824.0},
    {"TiB", Dimension::size(), kKi * kKi * kKi * kKi, 1099511627776.0},
    {"PiB", Dimension::size(), kKi * kKi * kKi * kKi * kKi, 1125899906842624.0},
    {"B/s", Dimension::bandwidth(), 1, 1},
    {"KB/s", Dimension::bandwidth(), kKB, 1e3},
    {"MB/s", Dimension::bandwidth(), kKB * kKB, 1e6},
    {"GB/s", Dimension::bandwidth(), kKB * kKB * kKB, 1e9},
    {"TB/s", Dimension::bandwidth(), kKB * kKB * kKB * kKB, 1e12},
    {"KiB/s", Dimension::bandwidth(), kKi, 1024.0},
    {"MiB/s", Dimension::bandwidth(), kKi * kKi, 1048576.0},
    {"GiB/s", Dimension::bandwidth(), kKi * kKi * kKi, 1073741824.0},
    {"TiB/s", Dimension::bandwidth(), kKi * kKi * kKi * kKi, 1099511627776.0},
    // Bits per second: network links are sold in these; one byte is eight bits.
    {"b/s", Dimension::bandwidth(), 0, 1.0 / 8},
    {"Kb/s", Dimension::bandwidth(), 125, 1e3 / 8},
    {"Mb/s", Dimension::bandwidth(), 125000, 1e6 / 8},
    {"Gb/s", Dimension::bandwidth(), 125000000, 1e9 / 8},
    {"Tb/s", Dimension::bandwidth(), 125000000000, 1e12 / 8},
    {"ns", Dimension::time(), 0, 1e-9},
    {"us", Dimension::time(), 0, 1e-6},
    {"ms", Dimension::time(), 0, 1e-3},
    {"s", Dimension::time(), 1, 1},
    {"FLOPS", Dimension::flopRate(), 1, 1},
    {"GFLOPS", Dimension::flopRate(), 1000000000, 1e9},
    {"TFLOPS", Dimension::flopRate(), 1000000000000, 1e12},
    {"PFLOPS", Dimension::flopRate(), 1000000000000000, 1e15},
};
} // namespace

std::optional<Unit> lookupUnit(llvm::StringRef spelling) {
  for (const UnitEntry &u : kUnits)
    if (spelling == u.spelling)
      return Unit{u.dim, u.intScale, u.scale};
  return std::nullopt;
}

std::vector<llvm::StringRef> allUnitSpellings() {
  std::vector<llvm::StringRef> out;
  for (const UnitEntry &u : kUnits)
    out.push_back(u.spelling);
  return out;
}

static std::string formatScaled(double value, const char *const *names, double step,
                                int count) {
  int i = 0;
  double v = value;
  while (i + 1 < count && std::fabs(v) >= step) {
    v /= step;
    ++i;
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    os << llvm::format("%.0f", v);
  else
    os << llvm::format("%.4g", v);
  os << " " << names[i];
  return os.str();
}

std::string formatQuantity(double value, Dimension dim) {
  static const char *const binary[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  static const char *const rate[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s"};
  static const char *const flops[] = {"FLOPS", "KFLOPS", "GFLOPS", "TFLOPS", "PFLOPS", "EFLOPS"};
  if (dim == Dimension::size())
    return formatScaled(value, binary, 1024, 6);
  if (dim == Dimension::bandwidth())
    return formatScaled(value, rate, 1000, 5);
  if (dim == Dimension::flopRate()) {
    // No KFLOPS unit in the language: skip from FLOPS straight to GFLOPS when printing.
    if (value >= 1e9)
      return formatScaled(value / 1e9, flops + 2, 1000, 4);
    return formatScaled(value, flops, 1e30, 1);
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  if (dim == Dimension::time()) {
    if (value < 1e-6)
      os << llvm::format("%.4g ns", value * 1e9);
    else if (value < 1e-3)
      os << llvm::format("%.4g us", value * 1e6);
    else if (value < 1)
      os << llvm::format("%.4g ms", value * 1e3);
    else
      os << llvm::format("%.4g s", value);
    return os.str();
  }
  os << llvm::format("%.6g", value);
  if (!dim.isNone())
    os << " " << dim.baseUnit();
  return os.str();
}

std::string formatBytes(double bytes) {
  static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  double v = bytes;
  while (i < 5 && std::fabs(v) >= 1024) {
    v /= 1024;
    ++i;
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  if (i == 0)
    os << llvm::format("%.0f B", v);
  else
    os << llvm::format("%.1f %s", v, names[i]);
  return os.str();
}

} // namespace parc
