//===- PipelineSVG.cpp - The pipeline diagram of a step as SVG ------------===//
//
// Plain SVG 1.1 with no scripts or external fonts, so that browsers and rsvg-convert show the
// same picture. Sizes are in pixels of a fixed-width plot: a step of any length fills it.
//
//===----------------------------------------------------------------------===//
#include "parc/Emit/PipelineSVG.h"

#include "llvm/Support/Format.h"

#include <algorithm>
#include <cmath>

namespace parc {

namespace {

constexpr double PlotWidth = 1600, LeftMargin = 84, RightMargin = 32;
constexpr double TitleY = 28, SubtitleY = 50, LegendY = 68, RowsTop = 96;
constexpr double RowHeight = 24, RowGap = 6, AxisHeight = 52;
constexpr double BoxFontSize = 11;
/// Width of a digit of an 11 px sans-serif font plus a little air, to decide whether the
/// microbatch numbers fit in their boxes.
constexpr double DigitWidth = 6.8, LabelPadding = 4;
/// Thinner boxes lose their outline, which would otherwise paint them white.
constexpr double MinOutlinedBox = 4;

struct Colour {
  double r, g, b;
};

// Megatron's figures: forward blue, backward green, a darker shade for earlier chunks. The
// light shades lean apart (sky blue, yellow-green) so that they stay distinct where boxes
// shrink to a pixel and blend.
constexpr Colour ForwardDark{31, 95, 168}, ForwardLight{135, 190, 245};
constexpr Colour BackwardDark{30, 120, 50}, BackwardLight{175, 215, 95};
// After the pipeline: the data-parallel traffic purple, the optimizer step grey.
constexpr Colour SyncColour{128, 70, 160}, OptimizerColour{110, 110, 110};

Colour mix(Colour a, Colour b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

std::string hex(Colour c) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("#%02x%02x%02x", unsigned(std::lround(c.r)), unsigned(std::lround(c.g)),
                     unsigned(std::lround(c.b)));
  return os.str();
}

/// Relative luminance (ITU-R BT.709) to pick black or white text on a box.
bool isDark(Colour c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b < 140; }

Colour chunkColour(bool forward, int64_t chunk, int64_t chunks) {
  double t = chunks > 1 ? double(chunk) / double(chunks - 1) : 0;
  return forward ? mix(ForwardDark, ForwardLight, t) : mix(BackwardDark, BackwardLight, t);
}

std::string escapeXML(llvm::StringRef text) {
  std::string escaped;
  for (char c : text) {
    switch (c) {
    case '&':
      escaped += "&amp;";
      break;
    case '<':
      escaped += "&lt;";
      break;
    case '>':
      escaped += "&gt;";
      break;
    case '"':
      escaped += "&quot;";
      break;
    default:
      escaped += c;
    }
  }
  return escaped;
}

std::string percent(double fraction) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%.1f%%", 100 * fraction);
  return os.str();
}

/// Seconds in the unit that suits `span`: its scale, its name.
std::pair<double, const char *> timeUnit(double span) {
  if (span >= 1)
    return {1, "s"};
  if (span >= 1e-3)
    return {1e3, "ms"};
  return {1e6, "\xC2\xB5s"}; // µs
}

/// 1, 2 or 5 times a power of ten, so that `span` gets at most `maxTicks` intervals.
double tickStep(double span, int maxTicks) {
  double raw = span / maxTicks;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double multiple : {1.0, 2.0, 5.0})
    if (multiple * magnitude >= raw)
      return multiple * magnitude;
  return 10 * magnitude;
}

class DiagramWriter {
public:
  DiagramWriter(const StepTimeline &timeline, const Program &program, const Mapping &mapping,
                llvm::raw_ostream &os)
      : timeline(timeline), program(program), mapping(mapping), os(os),
        stages(timeline.config.stages), chunks(timeline.config.chunks),
        height(RowsTop + double(stages) * (RowHeight + RowGap) - RowGap + AxisHeight),
        width(LeftMargin + PlotWidth + RightMargin) {
    double narrowest = PlotWidth;
    for (const std::vector<TimedOp> &ops : timeline.stages)
      for (const TimedOp &timed : ops)
        if (timed.op.isCompute())
          narrowest = std::min(narrowest, boxWidth(timed));
    double digits = std::to_string(std::max<int64_t>(timeline.config.microbatches - 1, 0)).size();
    showNumbers = narrowest >= digits * DigitWidth + LabelPadding;
    outlineBoxes = narrowest >= MinOutlinedBox;
  }

  void write() {
    os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    os << llvm::format("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
                       "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                       "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
                       width, height, width, height);
    os << llvm::format("<rect width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width, height);
    writeTitle();
    writeLegend();
    for (int64_t stage = 0; stage < stages; ++stage)
      writeStage(stage);
    writeAxis();
    os << "</svg>\n";
  }

private:
  double x(double seconds) const {
    return LeftMargin + (timeline.makespan > 0 ? seconds / timeline.makespan * PlotWidth : 0);
  }
  double boxWidth(const TimedOp &timed) const { return x(timed.end) - x(timed.start); }
  double rowTop(int64_t stage) const { return RowsTop + double(stage) * (RowHeight + RowGap); }

  void writeTitle() {
    const PipelineConfig &config = timeline.config;
    std::string title = program.model.name + " on " + program.cluster.name +
                        ": pipeline schedule of one training step";
    std::string schedule = toString(config.kind);
    if (config.chunks > 1)
      schedule += " (" + std::to_string(config.chunks) + " chunks per stage)";
    auto [scale, unit] = timeUnit(timeline.makespan);
    std::string step;
    llvm::raw_string_ostream stepText(step);
    stepText << llvm::format("%.3g %s", timeline.makespan * scale, unit);
    std::string subtitle =
        "tp " + std::to_string(mapping.tp) + " \xC2\xB7 pp " + std::to_string(mapping.pp) +
        " \xC2\xB7 dp " + std::to_string(mapping.dp) + " \xC2\xB7 " + schedule + " \xC2\xB7 " +
        std::to_string(config.microbatches) + " microbatches \xC2\xB7 bubble " +
        percent(timeline.idealBubble) + " (simulated " + percent(timeline.simulatedBubble()) +
        ") \xC2\xB7 step " + stepText.str();
    os << llvm::format("<text x=\"%.0f\" y=\"%.0f\" font-size=\"18\" font-weight=\"bold\">",
                       LeftMargin, TitleY)
       << escapeXML(title) << "</text>\n";
    os << llvm::format("<text x=\"%.0f\" y=\"%.0f\" font-size=\"13\" fill=\"#333333\">", LeftMargin,
                       SubtitleY)
       << escapeXML(subtitle) << "</text>\n";
  }

  void legendItem(double &cursor, const std::string &fill, const std::string &label) {
    os << llvm::format("<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" "
                       "fill=\"%s\" stroke=\"#999999\" stroke-width=\"0.5\"/>",
                       cursor, LegendY, fill.c_str());
    os << llvm::format("<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", cursor + 19, LegendY + 11.5)
       << escapeXML(label) << "</text>\n";
    cursor += 19 + double(label.size()) * 6.6 + 22;
  }

  void writeLegend() {
    double cursor = LeftMargin;
    for (bool forward : {true, false})
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        std::string label = forward ? "forward" : "backward";
        if (chunks > 1)
          label += " (chunk " + std::to_string(chunk) + ")";
        legendItem(cursor, hex(chunkColour(forward, chunk, chunks)), label);
      }
    legendItem(cursor, hex(SyncColour), "data-parallel sync");
    legendItem(cursor, hex(OptimizerColour), "optimizer");
    legendItem(cursor, "#f0f0f0", "idle (bubble) or waiting for a transfer");
    std::string note = showNumbers ? "numbers: microbatch"
                                   : "boxes too narrow for microbatch numbers; see --emit=trace";
    os << llvm::format("<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#666666\">", cursor,
                       LegendY + 11.5)
       << escapeXML(note) << "</text>\n";
  }

  void writeStage(int64_t stage) {
    double top = rowTop(stage);
    // Boxes of a pixel or less render as crisp stripes rather than an anti-aliased blur.
    os << (outlineBoxes ? "<g class=\"stage\">\n"
                        : "<g class=\"stage\" shape-rendering=\"crispEdges\">\n");
    os << llvm::format("<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">stage "
                       "%lld</text>\n",
                       LeftMargin - 8, top + RowHeight / 2 + 4, (long long)stage);
    os << llvm::format("<rect class=\"row\" x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" "
                       "height=\"%.0f\" fill=\"#f0f0f0\"/>\n",
                       LeftMargin, top, PlotWidth, RowHeight);
    auto [scale, unit] = timeUnit(timeline.makespan);
    for (const TimedOp &timed : timeline.stages[size_t(stage)]) {
      const PipeOp &op = timed.op;
      if (!op.isCompute())
        continue;
      bool forward = op.kind == PipeOpKind::Forward;
      const char *kindClass = forward ? "fwd" : "bwd";
      Colour fill = chunkColour(forward, op.chunk, chunks);
      const char *textColour = isDark(fill) ? "#ffffff" : "#000000";
      double left = x(timed.start), boxW = boxWidth(timed);
      os << llvm::format("<rect class=\"op %s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                         "height=\"%.0f\" fill=\"%s\"",
                         kindClass, left, top, boxW, RowHeight, hex(fill).c_str());
      if (outlineBoxes)
        os << " stroke=\"#ffffff\" stroke-width=\"0.75\"";
      os << llvm::format("><title>stage %lld: %s mb%lld c%lld, %.4g-%.4g %s</title></rect>\n",
                         (long long)stage, forward ? "forward" : "backward",
                         (long long)op.microbatch, (long long)op.chunk, timed.start * scale,
                         timed.end * scale, unit);
      if (showNumbers)
        os << llvm::format("<text x=\"%.2f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"middle\" "
                           "fill=\"%s\">%lld</text>\n",
                           left + boxW / 2, top + RowHeight / 2 + 4, BoxFontSize, textColour,
                           (long long)op.microbatch);
    }
    writeTail(stage, top);
    os << "</g>\n";
  }

  /// The stage's gradient sync, tied-embedding sync, optimizer and parameter gather.
  void writeTail(int64_t stage, double top) {
    const StageTail &t = timeline.tails[size_t(stage)];
    auto box = [&](const char *cls, const char *what, double start, double end, Colour fill) {
      if (end <= start)
        return;
      os << llvm::format("<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                         "height=\"%.0f\" fill=\"%s\"><title>stage %lld: %s</title></rect>\n",
                         cls, x(start), top, x(end) - x(start), RowHeight, hex(fill).c_str(),
                         (long long)stage, what);
    };
    box("sync", "gradient sync", t.gradSyncStart, t.gradSyncEnd, SyncColour);
    box("sync", "tied embedding sync", t.embeddingSyncStart, t.embeddingSyncEnd, SyncColour);
    box("optimizer", "optimizer", t.optimizerStart, t.optimizerEnd, OptimizerColour);
    box("sync", "parameter all-gather", t.paramGatherStart, t.paramGatherEnd, SyncColour);
  }

  void writeAxis() {
    double axisY = rowTop(stages) - RowGap + 8;
    auto [scale, unit] = timeUnit(timeline.makespan);
    os << llvm::format("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#333333\" "
                       "stroke-width=\"1\"/>\n",
                       LeftMargin, axisY, LeftMargin + PlotWidth, axisY);
    if (timeline.makespan > 0 && std::isfinite(timeline.makespan)) {
      double step = tickStep(timeline.makespan * scale, 12);
      for (double tick = 0; tick <= timeline.makespan * scale * (1 + 1e-9); tick += step) {
        double tickX = x(tick / scale);
        os << llvm::format("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" "
                           "stroke=\"#333333\" stroke-width=\"1\"/>",
                           tickX, axisY, tickX, axisY + 5);
        os << llvm::format("<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" "
                           "text-anchor=\"middle\">%g</text>\n",
                           tickX, axisY + 18, tick);
      }
    }
    os << llvm::format("<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">time "
                       "(%s)</text>\n",
                       LeftMargin + PlotWidth / 2, axisY + 38, unit);
  }

  const StepTimeline &timeline;
  const Program &program;
  const Mapping &mapping;
  llvm::raw_ostream &os;
  int64_t stages, chunks;
  double height, width;
  bool showNumbers = false, outlineBoxes = false;
};

} // namespace

void writePipelineSVG(const StepTimeline &timeline, const Program &program, const Mapping &mapping,
                      llvm::raw_ostream &os) {
  DiagramWriter(timeline, program, mapping, os).write();
}

} // namespace parc
