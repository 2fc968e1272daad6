//===- BenchReport.cpp - The kernel bench's table and JSON ----------------===//

#include "BenchReport.h"

#include <cstdio>
#include <fstream>

namespace parc::bench {

namespace {
std::string jsonString(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out + "\"";
}

} // namespace

const char *verdict(const Row &row, const Ceilings &ceilings) {
  if (!row.error.empty())
    return "ERROR";
  if (row.work / ceilings.of(row.bound) < kLaunchBoundSeconds)
    return "launch-bound";
  return row.work / row.seconds / ceilings.of(row.bound) >= kTargetFraction ? "ok" : "SLOW";
}

void printTable(const std::vector<Row> &rows, const Ceilings &ceilings, int reps) {
  std::printf("%-52s %10s %11s %13s %9s  %s\n", "kernel (bf16 unless named)", "time", "work",
              "rate", "ceiling", "within 2x");
  int judged = 0, ok = 0, errors = 0;
  for (const Row &row : rows) {
    std::string result = verdict(row, ceilings);
    if (!row.error.empty()) {
      ++errors;
      std::printf("%-52s ERROR: %s\n", row.name.c_str(), row.error.c_str());
      continue;
    }
    bool memory = row.bound == Bound::Memory;
    double rate = row.work / row.seconds;
    std::printf("%-52s %7.3f ms %6.1f %s %7.1f %s %8.1f%%  %s\n", row.name.c_str(),
                row.seconds * 1e3, memory ? row.work / double(1 << 20) : row.work / 1e9,
                memory ? "MiB " : "GFLOP", memory ? rate / 1e9 : rate / 1e12,
                memory ? "GB/s  " : "TFLOP/s", 100 * rate / ceilings.of(row.bound),
                result.c_str());
    judged += result != "launch-bound";
    ok += result == "ok";
  }
  std::printf("%d of %d kernels within 2x of their ceiling (%d launch-bound, not judged; %d "
              "errors); median of %d launches each\n",
              ok, judged, int(rows.size()) - judged - errors, errors, reps);
}

bool writeJson(const std::string &path, const std::string &device, const std::vector<Row> &rows,
               const Ceilings &ceilings) {
  std::ofstream out(path);
  out << "{\n  \"format\": \"parc-kernel-bench/1\",\n  \"device\": " << jsonString(device)
      << ",\n  \"copy_bytes_per_s\": " << ceilings.bytesPerSecond
      << ",\n  \"gemm_flops_per_s\": " << ceilings.flopsPerSecond
      << ",\n  \"target_fraction\": " << kTargetFraction << ",\n  \"kernels\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &row = rows[i];
    bool memory = row.bound == Bound::Memory;
    double fraction = row.error.empty() ? row.work / row.seconds / ceilings.of(row.bound) : 0;
    out << (i ? "," : "") << "\n    {\"name\": " << jsonString(row.name)
        << ", \"bound\": " << (memory ? "\"memory\"" : "\"compute\"")
        << ", \"seconds\": " << row.seconds << ", \"" << (memory ? "bytes" : "flops")
        << "\": " << row.work << ", \"fraction_of_ceiling\": " << fraction
        << ", \"verdict\": " << jsonString(verdict(row, ceilings))
        << ", \"error\": " << jsonString(row.error) << "}";
  }
  out << "\n  ]\n}\n";
  out.close();
  return bool(out);
}

} // namespace parc::bench
