// Inline SVG line/bar plots for the load tester's HTML report: self-contained markup (no scripts,
// no fonts beyond the generic family), so a report opens offline in any browser.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace drafthead::client {

struct PlotSeries {
  std::string name;
  std::string color = "#1f77b4";
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending for lines
  bool bars = false;                               // vertical bars from y = 0 (histograms)
  bool markers = false;                            // a dot per point
  std::vector<std::string> labels;                 // optional text per point (the sweep's concurrency)
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = false;
  int width = 720;
  int height = 320;
};

// An <svg> element (with a <title> for accessibility). Empty series draw an empty frame saying so.
std::string SvgPlot(const PlotSpec& spec, const std::vector<PlotSeries>& series);

// Escapes &, <, >, " and ' for HTML text and attribute values.
std::string HtmlEscape(absl::string_view s);

}  // namespace drafthead::client
