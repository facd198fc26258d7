#include "client/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace drafthead::client {
namespace {

// "Nice" tick step (1, 2 or 5 x 10^n) giving about `target` ticks over [lo, hi].
double NiceStep(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target);
  if (!(raw > 0)) return 1;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

std::string Num(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  if (a >= 1e4) return absl::StrFormat("%.3gk", v / 1e3);
  return absl::StrFormat("%.4g", v);
}

}  // namespace

std::string HtmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string SvgPlot(const PlotSpec& spec, const std::vector<PlotSeries>& series) {
  // The legend goes in rows under the x-axis label, so it never hides data.
  std::vector<std::pair<double, int>> legend_pos;  // x offset and row per named series
  {
    double x = 0;
    int row = 0;
    for (const auto& s : series) {
      if (s.name.empty()) continue;
      const double w = 22 + 6.5 * static_cast<double>(s.name.size());
      if (x > 0 && x + w > spec.width - 90) {
        x = 0;
        ++row;
      }
      legend_pos.push_back({x, row});
      x += w;
    }
  }
  const int legend_rows = legend_pos.empty() ? 0 : legend_pos.back().second + 1;
  const double W = spec.width, H = spec.height + 16 * legend_rows;
  const double L = 70, R = 20, T = 30, B = 45 + 16 * legend_rows;  // room for ticks, titles, legend
  const double pw = W - L - R, ph = H - T - B;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y1 = 0;
  bool any = false;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (spec.log_x && x <= 0)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
      any = true;
    }
  }
  std::string o = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"11\" role=\"img\">\n<title>%s</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n"
      "<text x=\"%g\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
      spec.width, static_cast<int>(H), spec.width, static_cast<int>(H), HtmlEscape(spec.title), spec.width,
      static_cast<int>(H), W / 2,
      HtmlEscape(spec.title));
  absl::StrAppendFormat(&o, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n", L, T,
                        pw, ph);
  absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", L + pw / 2, T + ph + 36,
                        HtmlEscape(spec.x_label));
  absl::StrAppendFormat(&o, "<text x=\"14\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 14 %g)\">%s</text>\n",
                        T + ph / 2, T + ph / 2, HtmlEscape(spec.y_label));
  if (!any) {
    absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n</svg>\n",
                          L + pw / 2, T + ph / 2);
    return o;
  }
  if (y1 <= 0) y1 = 1;
  y1 *= 1.05;
  // x mapping (linear or log10), with a little room when all points share one x.
  double lx0 = spec.log_x ? std::log10(x0) : x0, lx1 = spec.log_x ? std::log10(x1) : x1;
  if (lx1 - lx0 < 1e-12) {
    lx0 -= spec.log_x ? 0.5 : std::max(1.0, std::fabs(lx0) * 0.1);
    lx1 += spec.log_x ? 0.5 : std::max(1.0, std::fabs(lx1) * 0.1);
  }
  // A little room at both ends so end markers and their labels stay inside the frame.
  const double pad = (lx1 - lx0) * 0.04;
  lx0 -= pad;
  lx1 += pad * 2;
  auto X = [&](double x) { return L + ((spec.log_x ? std::log10(x) : x) - lx0) / (lx1 - lx0) * pw; };
  auto Y = [&](double y) { return T + ph - y / y1 * ph; };
  // y ticks
  const double ys = NiceStep(0, y1, 5);
  for (double y = 0; y <= y1 + 1e-9; y += ys) {
    absl::StrAppendFormat(&o, "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#eee\"/>", L, Y(y), L + pw, Y(y));
    absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 4, Y(y) + 4, Num(y));
  }
  // x ticks: decades (and 2, 5) on a log axis, nice steps on a linear one
  if (spec.log_x) {
    for (int d = static_cast<int>(std::floor(lx0)); d <= static_cast<int>(std::ceil(lx1)); ++d) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double x = m * std::pow(10.0, d);
        const double lx = std::log10(x);
        if (lx < lx0 - 1e-9 || lx > lx1 + 1e-9) continue;
        absl::StrAppendFormat(&o, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#eee\"/>", X(x), T, X(x), T + ph);
        absl::StrAppendFormat(&o, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", X(x), T + ph + 14, Num(x));
      }
    }
  } else {
    const double xs = NiceStep(lx0, lx1, 8);
    for (double x = std::ceil(lx0 / xs) * xs; x <= lx1 + 1e-9; x += xs) {
      absl::StrAppendFormat(&o, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#eee\"/>", X(x), T, X(x), T + ph);
      absl::StrAppendFormat(&o, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", X(x), T + ph + 14, Num(x));
    }
  }
  // series
  size_t legend_i = 0;
  for (const auto& s : series) {
    std::string pts;
    const double bar_w = std::max(1.0, pw / std::max<size_t>(1, s.points.size()) * 0.9);
    for (size_t i = 0; i < s.points.size(); ++i) {
      const auto [x, y] = s.points[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (spec.log_x && x <= 0)) continue;
      if (s.bars) {
        absl::StrAppendFormat(&o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>", X(x) - bar_w / 2,
                              Y(y), bar_w, Y(0) - Y(y), s.color);
      } else {
        absl::StrAppendFormat(&pts, "%.1f,%.1f ", X(x), Y(y));
      }
      if (s.markers) absl::StrAppendFormat(&o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", X(x), Y(y), s.color);
      if (i < s.labels.size()) {
        absl::StrAppendFormat(&o, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>", X(x) + 4, Y(y) - 4, s.color,
                              HtmlEscape(s.labels[i]));
      }
    }
    if (!pts.empty()) {
      absl::StrAppendFormat(&o, "\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", s.color, pts);
    }
    if (!s.name.empty()) {
      const auto [lx, row] = legend_pos[legend_i++];
      const double ly = T + ph + 54 + 16 * row;
      absl::StrAppendFormat(&o, "<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"10\" fill=\"%s\"/>", L + lx, ly - 9, s.color);
      absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%g\">%s</text>\n", L + lx + 14, ly, HtmlEscape(s.name));
    }
  }
  o += "</svg>\n";
  return o;
}

}  // namespace drafthead::client
