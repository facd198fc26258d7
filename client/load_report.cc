#include "client/load_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/svg_plot.h"

namespace drafthead::client {
namespace {

using Json = nlohmann::ordered_json;

double Us(double ns) { return ns / 1000.0; }
double Round3(double v) { return std::round(v * 1000.0) / 1000.0; }
// Calls in flight on average (Little's law: answers a second x mean latency): how much of the
// asked concurrency the caller kept up.
double InFlightMean(const LoadResult& r) { return r.requests_per_s * r.latency.mean() * 1e-9; }

Json LatencyJson(const LogLinearHistogram& h) {  // h in ns
  return Json{{"min", Round3(Us(h.min()))},          {"p50", Round3(Us(h.Percentile(0.50)))},
              {"p90", Round3(Us(h.Percentile(0.90)))}, {"p99", Round3(Us(h.Percentile(0.99)))},
              {"p999", Round3(Us(h.Percentile(0.999)))}, {"max", Round3(Us(h.max()))},
              {"mean", Round3(Us(h.mean()))}};
}

Json SplitJson(const LogLinearHistogram& h, double scale_to_us) {
  return Json{{"mean", Round3(h.mean() * scale_to_us)},
              {"p50", Round3(h.Percentile(0.5) * scale_to_us)},
              {"p99", Round3(h.Percentile(0.99) * scale_to_us)}};
}

// "validate 3.0 | broadcast 0.0 | ...": each server stage's p50 in us.
std::string StagesP50(const LoadResult& r) {
  std::string o;
  for (int i = 0; i < kTimingStages; ++i)
    absl::StrAppendFormat(&o, "%s%s %.1f", i ? " | " : "", kTimingStageNames[i], r.stage_us[i].Percentile(0.5));
  return o;
}

// The spread of the per-caller p50s (us), over callers with an OK answer.
struct CallerSpread {
  size_t answered = 0;  // callers with an OK answer
  double p50_min = 0, p50_max = 0, p99_max = 0;
  double ratio() const { return p50_min > 0 ? p50_max / p50_min : 0; }
};

CallerSpread Spread(const LoadResult& r) {
  CallerSpread s;
  for (const CallerStats& c : r.callers) {
    if (c.latency.count() == 0) continue;
    const double p50 = Us(c.latency.Percentile(0.5)), p99 = Us(c.latency.Percentile(0.99));
    s.p50_min = s.answered == 0 ? p50 : std::min(s.p50_min, p50);
    s.p50_max = std::max(s.p50_max, p50);
    s.p99_max = std::max(s.p99_max, p99);
    ++s.answered;
  }
  return s;
}

std::string LoopName(const LoadResult& r) { return r.rps_target > 0 ? "open" : "closed"; }

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

PlotSeries Series(std::string name, const char* color) {
  PlotSeries s;
  s.name = std::move(name);
  s.color = color;
  return s;
}

PlotSpec Spec(std::string title, std::string x, std::string y, bool log_x = false) {
  PlotSpec p;
  p.title = std::move(title);
  p.x_label = std::move(x);
  p.y_label = std::move(y);
  p.log_x = log_x;
  return p;
}

// Seconds of timeline bucket s that lie inside the measured window.
double BucketSpan(const LoadResult& r, size_t s) {
  return std::clamp(r.elapsed_s - static_cast<double>(s), 0.0, 1.0);
}

std::string RunTitle(const LoadResult& r) {
  return r.rps_target > 0 ? absl::StrFormat("open loop, %g req/s", r.rps_target)
                          : absl::StrCat("closed loop, concurrency ", r.concurrency);
}

// Latency histogram re-binned onto ~60 log-spaced bins between min and max (us).
std::vector<std::pair<double, double>> LogBins(const LogLinearHistogram& h) {
  std::vector<std::pair<double, double>> out;
  if (h.count() == 0) return out;
  const double lo = std::max(1.0, static_cast<double>(h.min())), hi = std::max(lo * 1.01, static_cast<double>(h.max()) + 1);
  const int n = 60;
  const double step = std::log(hi / lo) / n;
  std::vector<double> counts(n, 0);
  for (size_t i = 0; i < h.buckets(); ++i) {
    if (!h.BucketCount(i)) continue;
    const double mid = 0.5 * static_cast<double>(h.BucketLower(i) + h.BucketUpper(i));
    int b = static_cast<int>(std::floor(std::log(std::max(mid, lo) / lo) / step));
    counts[std::clamp(b, 0, n - 1)] += static_cast<double>(h.BucketCount(i));
  }
  for (int b = 0; b < n; ++b) out.push_back({Us(lo * std::exp((b + 0.5) * step)), counts[b]});
  return out;
}

std::vector<std::pair<double, double>> Cdf(const LogLinearHistogram& h) {
  std::vector<std::pair<double, double>> out;
  if (h.count() == 0) return out;
  uint64_t seen = 0;
  for (size_t i = 0; i < h.buckets(); ++i) {
    if (!h.BucketCount(i)) continue;
    seen += h.BucketCount(i);
    const double x = std::clamp(static_cast<double>(h.BucketUpper(i)), static_cast<double>(h.min()), static_cast<double>(h.max()));
    out.push_back({Us(std::max(1.0, x)), 100.0 * static_cast<double>(seen) / static_cast<double>(h.count())});
  }
  return out;
}

}  // namespace

std::string StatusCodeName(int code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  if (code >= 0 && code <= 16) return kNames[code];
  return absl::StrCat("CODE_", code);
}

Json ToJson(const LoadReport& rep) {
  Json j;
  j["schema_version"] = kLoadReportSchemaVersion;
  j["tool"] = "drafthead-client load";
  j["started_at"] = rep.started_at;
  j["config"] = rep.config;
  if (rep.server) {
    const v1::ModelInfo& m = *rep.server;
    Json heads = Json::array();
    for (int h : m.heads()) heads.push_back(v1::Head_Name(static_cast<v1::Head>(h)));
    j["server"] = Json{{"hidden_size", m.hidden_size()}, {"vocab_size", m.vocab_size()}, {"padded_vocab", m.padded_vocab()},
                       {"tp", m.tp()}, {"shard_rows", m.shard_rows()}, {"max_rows", m.max_rows()},
                       {"max_top_k", m.max_top_k()}, {"backend", m.backend()}, {"comm", m.comm()}, {"heads", heads},
                       {"weights", m.weights()}, {"version", m.version()}};
  } else {
    j["server"] = nullptr;
  }
  j["sweep"] = rep.sweep;
  Json runs = Json::array();
  for (const LoadResult& r : rep.runs) {
    Json x;
    x["loop"] = LoopName(r);
    x["concurrency"] = r.concurrency;
    x["rps_target"] = r.rps_target;
    x["elapsed_s"] = Round3(r.elapsed_s);
    x["issued"] = r.issued;
    x["answered"] = r.ok + r.errors;
    x["ok"] = r.ok;
    x["errors"] = r.errors;
    Json by_code = Json::object(), examples = Json::object();
    for (const auto& [c, n] : r.errors_by_code) by_code[StatusCodeName(c)] = n;
    for (const auto& [c, m] : r.error_examples) examples[StatusCodeName(c)] = m;
    x["errors_by_code"] = by_code;
    x["error_examples"] = examples;
    x["requests_per_s"] = Round3(r.requests_per_s);
    x["ok_per_s"] = Round3(r.ok_per_s);
    x["rows_per_s"] = Round3(r.rows_per_s);
    x["in_flight_mean"] = Round3(InFlightMean(r));
    x["latency_us"] = LatencyJson(r.latency);
    x["server_us"] = Json{{"queue", SplitJson(r.queue_us, 1.0)},
                          {"compute", SplitJson(r.compute_us, 1.0)},
                          {"network_client", SplitJson(r.overhead, 1e-3)}};
    Json stages = Json::object();
    for (int i = 0; i < kTimingStages; ++i) {
      Json s = SplitJson(r.stage_us[i], 1.0);
      s["count"] = r.stage_us[i].count();  // the answers it was measured in (step stages: the timed ones)
      stages[kTimingStageNames[i]] = std::move(s);
    }
    x["server_stages_us"] = stages;
    x["batch_rows_p50"] = r.batch_rows.Percentile(0.5);
    x["send_lag_us"] = Json{{"p50", Round3(Us(r.send_lag.Percentile(0.5)))},
                            {"p99", Round3(Us(r.send_lag.Percentile(0.99)))},
                            {"max", Round3(Us(r.send_lag.max()))}};
    x["stream_failures"] = r.stream_failures;
    Json callers = Json::array();
    for (size_t i = 0; i < r.callers.size(); ++i) {
      const CallerStats& c = r.callers[i];
      callers.push_back(Json{{"caller", i}, {"count", c.ok + c.errors}, {"ok", c.ok}, {"errors", c.errors},
                             {"p50_us", Round3(Us(c.latency.Percentile(0.5)))},
                             {"p99_us", Round3(Us(c.latency.Percentile(0.99)))}});
    }
    x["callers"] = callers;
    const CallerSpread spread = Spread(r);
    x["callers_summary"] = Json{{"kind", r.caller_kind}, {"callers", r.callers.size()}, {"answered", spread.answered},
                                {"p50_us_min", Round3(spread.p50_min)}, {"p50_us_max", Round3(spread.p50_max)},
                                {"p50_max_over_min", Round3(spread.ratio())}, {"p99_us_max", Round3(spread.p99_max)}};
    x["histogram_relative_error"] = r.latency.RelativeErrorBound();
    Json hist = Json::array();
    for (size_t i = 0; i < r.latency.buckets(); ++i) {
      if (!r.latency.BucketCount(i)) continue;
      hist.push_back(Json{{"lower_us", Us(static_cast<double>(r.latency.BucketLower(i)))},
                          {"upper_us", Us(static_cast<double>(r.latency.BucketUpper(i)))},
                          {"count", r.latency.BucketCount(i)}});
    }
    x["latency_histogram"] = hist;
    Json tl = Json::array();
    for (size_t s = 0; s < r.timeline.size(); ++s) {
      const SecondStats& b = r.timeline[s];
      tl.push_back(Json{{"t_s", s}, {"span_s", Round3(BucketSpan(r, s))}, {"ok", b.ok}, {"errors", b.errors}, {"rows", b.rows},
                        {"p50_us", Round3(Us(b.latency.Percentile(0.5)))}, {"p99_us", Round3(Us(b.latency.Percentile(0.99)))}});
    }
    x["timeline"] = tl;
    runs.push_back(std::move(x));
  }
  j["runs"] = runs;
  return j;
}

std::string FormatText(const LoadReport& rep) {
  std::string o;
  if (rep.server) {
    absl::StrAppendFormat(&o, "server: hidden %u, vocab %u, tp %u, backend %s/%s, max_rows %u\n", rep.server->hidden_size(),
                          rep.server->vocab_size(), rep.server->tp(), rep.server->backend(), rep.server->comm(),
                          rep.server->max_rows());
  }
  for (const LoadResult& r : rep.runs) {
    absl::StrAppendFormat(&o, "\n== %s ==\n", RunTitle(r));
    absl::StrAppendFormat(&o, "requests   %llu answered in %.3f s (%llu ok, %llu errors)\n",
                          static_cast<unsigned long long>(r.ok + r.errors), r.elapsed_s,
                          static_cast<unsigned long long>(r.ok), static_cast<unsigned long long>(r.errors));
    for (const auto& [c, n] : r.errors_by_code) {
      auto ex = r.error_examples.find(c);
      absl::StrAppendFormat(&o, "  %-20s %llu%s\n", StatusCodeName(c), static_cast<unsigned long long>(n),
                            ex == r.error_examples.end() ? "" : absl::StrCat("  (", ex->second, ")"));
    }
    absl::StrAppendFormat(&o, "throughput %.1f req/s, %.1f rows/s, %.1f calls in flight (mean)\n", r.requests_per_s,
                          r.rows_per_s, InFlightMean(r));
    const auto& h = r.latency;
    absl::StrAppendFormat(&o, "latency us min %.1f  p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  (mean %.1f)\n",
                          Us(h.min()), Us(h.Percentile(0.5)), Us(h.Percentile(0.9)), Us(h.Percentile(0.99)),
                          Us(h.Percentile(0.999)), Us(h.max()), Us(h.mean()));
    absl::StrAppendFormat(&o, "split us   queue p50 %.1f (mean %.1f) | compute p50 %.1f (mean %.1f) | network+client p50 %.1f (mean %.1f)\n",
                          r.queue_us.Percentile(0.5), r.queue_us.mean(), r.compute_us.Percentile(0.5), r.compute_us.mean(),
                          Us(r.overhead.Percentile(0.5)), Us(r.overhead.mean()));
    absl::StrAppendFormat(&o, "stages us  p50 %s\n", StagesP50(r));
    absl::StrAppendFormat(&o, "batch_rows p50 %.0f\n", r.batch_rows.Percentile(0.5));
    if (!r.callers.empty()) {
      const CallerSpread c = Spread(r);
      absl::StrAppendFormat(&o, "callers    %d x %s, %d answered: p50 us min %.1f  max %.1f  (max/min %.3f), p99 us max %.1f\n",
                            static_cast<int>(r.callers.size()), r.caller_kind, static_cast<int>(c.answered), c.p50_min,
                            c.p50_max, c.ratio(), c.p99_max);
    }
    if (r.rps_target > 0) {
      absl::StrAppendFormat(&o, "send lag us p50 %.1f  p99 %.1f  max %.1f (sends behind schedule)\n", Us(r.send_lag.Percentile(0.5)),
                            Us(r.send_lag.Percentile(0.99)), Us(r.send_lag.max()));
    }
    if (r.stream_failures) absl::StrAppendFormat(&o, "streams failed: %lld\n", static_cast<long long>(r.stream_failures));
  }
  if (rep.sweep) {
    o += "\nsweep:\n concurrency      req/s     rows/s    p50 us    p99 us\n";
    for (const LoadResult& r : rep.runs) {
      absl::StrAppendFormat(&o, " %11d %10.1f %10.1f %9.1f %9.1f\n", r.concurrency, r.requests_per_s, r.rows_per_s,
                            Us(r.latency.Percentile(0.5)), Us(r.latency.Percentile(0.99)));
    }
  }
  return o;
}

std::string ToCsv(const LoadReport& rep) {
  std::string o = "run,seq,start_us,latency_us,status,queue_us,compute_us,batch_rows\n";
  for (size_t i = 0; i < rep.runs.size(); ++i) {
    for (const RequestRecord& q : rep.runs[i].records) {
      absl::StrAppendFormat(&o, "%d,%llu,%.3f,%.3f,%s,%u,%u,%u\n", static_cast<int>(i), static_cast<unsigned long long>(q.seq),
                            Us(static_cast<double>(q.start_ns)), Us(static_cast<double>(q.latency_ns)), StatusCodeName(q.code),
                            q.queue_us, q.compute_us, q.batch_rows);
    }
  }
  return o;
}

std::string ToHtml(const LoadReport& rep) {
  std::string o =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>drafthead load report</title>\n"
      "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}"
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}td.k{text-align:left}"
      "section{margin-bottom:28px}svg{display:block;margin:8px 0}</style>\n</head>\n<body>\n";
  absl::StrAppend(&o, "<h1>drafthead load report</h1>\n<p>started ", HtmlEscape(rep.started_at), "</p>\n");
  o += "<h2>Configuration</h2>\n<table>\n";
  for (auto it = rep.config.begin(); it != rep.config.end(); ++it) {
    const std::string v = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    absl::StrAppend(&o, "<tr><td class=\"k\">", HtmlEscape(it.key()), "</td><td class=\"k\">", HtmlEscape(v), "</td></tr>\n");
  }
  o += "</table>\n";
  if (rep.server) {
    absl::StrAppend(&o, "<p>Server: hidden ", rep.server->hidden_size(), ", vocab ", rep.server->vocab_size(), ", tp ",
                    rep.server->tp(), ", ", HtmlEscape(rep.server->backend()), "/", HtmlEscape(rep.server->comm()), ", ",
                    HtmlEscape(rep.server->version()), "</p>\n");
  }
  o += "<h2>Summary</h2>\n<table>\n<tr><th>run</th><th>answered</th><th>errors</th><th>req/s</th><th>rows/s</th>"
       "<th>min us</th><th>p50 us</th><th>p90 us</th><th>p99 us</th><th>p99.9 us</th><th>max us</th>"
       "<th>queue p50</th><th>compute p50</th><th>net+client p50</th><th>batch_rows p50</th></tr>\n";
  for (const LoadResult& r : rep.runs) {
    const auto& h = r.latency;
    absl::StrAppendFormat(&o,
                          "<tr><td class=\"k\">%s</td><td>%llu</td><td>%llu</td><td>%.1f</td><td>%.1f</td><td>%.1f</td>"
                          "<td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td>"
                          "<td>%.1f</td><td>%.0f</td></tr>\n",
                          HtmlEscape(RunTitle(r)), static_cast<unsigned long long>(r.ok + r.errors),
                          static_cast<unsigned long long>(r.errors), r.requests_per_s, r.rows_per_s, Us(h.min()),
                          Us(h.Percentile(0.5)), Us(h.Percentile(0.9)), Us(h.Percentile(0.99)), Us(h.Percentile(0.999)),
                          Us(h.max()), r.queue_us.Percentile(0.5), r.compute_us.Percentile(0.5),
                          Us(r.overhead.Percentile(0.5)), r.batch_rows.Percentile(0.5));
  }
  o += "</table>\n<h2>Server stages (p50 us, from Timing)</h2>\n<table>\n<tr><th>run</th>";
  for (const char* name : kTimingStageNames) absl::StrAppend(&o, "<th>", name, "</th>");
  o += "</tr>\n";
  for (const LoadResult& r : rep.runs) {
    absl::StrAppend(&o, "<tr><td class=\"k\">", HtmlEscape(RunTitle(r)), "</td>");
    for (int i = 0; i < kTimingStages; ++i)
      absl::StrAppendFormat(&o, "<td>%.1f</td>", r.stage_us[i].Percentile(0.5));
    o += "</tr>\n";
  }
  o += "</table>\n<h2>Callers (as the server's fair queue sees them)</h2>\n<table>\n<tr><th>run</th><th>callers</th>"
       "<th>answered</th><th>p50 us min</th><th>p50 us max</th><th>max/min</th><th>p99 us max</th></tr>\n";
  for (const LoadResult& r : rep.runs) {
    const CallerSpread c = Spread(r);
    absl::StrAppendFormat(&o,
                          "<tr><td class=\"k\">%s</td><td>%d x %s</td><td>%d</td><td>%.1f</td><td>%.1f</td><td>%.3f</td>"
                          "<td>%.1f</td></tr>\n",
                          HtmlEscape(RunTitle(r)), static_cast<int>(r.callers.size()), HtmlEscape(r.caller_kind),
                          static_cast<int>(c.answered), c.p50_min, c.p50_max, c.ratio(), c.p99_max);
  }
  o += "</table>\n";
  bool any_errors = false;
  for (const LoadResult& r : rep.runs) any_errors |= !r.errors_by_code.empty();
  if (any_errors) {
    o += "<h2>Errors</h2>\n<table>\n<tr><th>run</th><th>status</th><th>count</th><th>example</th></tr>\n";
    for (const LoadResult& r : rep.runs) {
      for (const auto& [c, n] : r.errors_by_code) {
        auto ex = r.error_examples.find(c);
        absl::StrAppend(&o, "<tr><td class=\"k\">", HtmlEscape(RunTitle(r)), "</td><td class=\"k\">", StatusCodeName(c),
                        "</td><td>", n, "</td><td class=\"k\">",
                        HtmlEscape(ex == r.error_examples.end() ? "" : ex->second), "</td></tr>\n");
      }
    }
    o += "</table>\n";
  }
  if (rep.sweep && !rep.runs.empty()) {
    PlotSeries p50 = Series("p50", kColors[0]), p99 = Series("p99", kColors[1]);
    p50.markers = p99.markers = true;
    for (const LoadResult& r : rep.runs) {
      p50.points.push_back({r.requests_per_s, Us(r.latency.Percentile(0.5))});
      p99.points.push_back({r.requests_per_s, Us(r.latency.Percentile(0.99))});
      p50.labels.push_back(absl::StrCat("c=", r.concurrency));
    }
    o += "<section><h2>Concurrency sweep</h2>\n";
    o += SvgPlot(Spec("Latency vs throughput (closed-loop sweep)", "throughput (requests/s)", "latency (us)"), {p50, p99});
    o += "</section>\n";
  }
  // Latency CDFs of all runs overlaid, then each run's histogram and time series.
  {
    std::vector<PlotSeries> cdfs;
    for (size_t i = 0; i < rep.runs.size(); ++i) {
      PlotSeries s = Series(RunTitle(rep.runs[i]), kColors[i % 8]);
      s.points = Cdf(rep.runs[i].latency);
      cdfs.push_back(std::move(s));
    }
    PlotSpec spec = Spec("Latency CDF", "latency (us, log scale)", "% of requests at or below", true);
    o += "<section><h2>Latency distribution</h2>\n" + SvgPlot(spec, cdfs);
    o += "</section>\n";
  }
  for (size_t i = 0; i < rep.runs.size(); ++i) {
    const LoadResult& r = rep.runs[i];
    absl::StrAppend(&o, "<section><h2>", HtmlEscape(RunTitle(r)), "</h2>\n");
    PlotSeries bars = Series("", kColors[0]);
    bars.bars = true;
    bars.points = LogBins(r.latency);
    PlotSpec hs = Spec("Latency histogram", "latency (us, log scale)", "requests", true);
    o += SvgPlot(hs, {bars});
    PlotSeries okps = Series("ok/s", kColors[2]), errps = Series("errors/s", kColors[1]), l50 = Series("p50", kColors[0]), l99 = Series("p99", kColors[1]);
    for (size_t s = 0; s < r.timeline.size(); ++s) {
      const SecondStats& b = r.timeline[s];
      // Rates over the part of the second the run covered (the last bucket is partial), plotted at
      // that part's middle; a sliver under 0.2 s would make a meaningless rate and is left out.
      const double span = BucketSpan(r, s);
      const double mid = static_cast<double>(s) + span / 2;
      if (span >= 0.2) {
        okps.points.push_back({mid, static_cast<double>(b.ok) / span});
        errps.points.push_back({mid, static_cast<double>(b.errors) / span});
      }
      if (b.ok) {
        l50.points.push_back({mid, Us(b.latency.Percentile(0.5))});
        l99.points.push_back({mid, Us(b.latency.Percentile(0.99))});
      }
    }
    okps.markers = errps.markers = l50.markers = l99.markers = true;
    o += SvgPlot(Spec("Throughput over time (1 s buckets)", "time since warmup (s)", "answers per second"), {okps, errps});
    o += SvgPlot(Spec("Latency over time (1 s buckets)", "time since warmup (s)", "latency (us)"), {l50, l99});
    o += "</section>\n";
  }
  o += "</body>\n</html>\n";
  return o;
}

}  // namespace drafthead::client
