// The load tester's engine against drafthead-fake-server: count and time bounds, closed and open
// loops, streams, error accounting, open-loop schedule adherence against a slow server, and the
// JSON report's schema. Every run is bounded in requests and time, on loopback.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/drafthead_client.h"
#include "client/load_report.h"
#include "client/load_tester.h"
#include "client/response_scan.h"
#include "client/testing/fake_server_process.h"
#include "kernels/numeric.h"

namespace drafthead::client {
namespace {

using testing::FakeServerProcess;

constexpr uint32_t K = 32, kRows = 5;

std::vector<std::string> Pool(v1::Mode mode, int n = 4) {
  std::vector<std::string> pool;
  for (int p = 0; p < n; ++p) {
    std::vector<uint16_t> h(kRows * K);
    for (size_t i = 0; i < h.size(); ++i) h[i] = FloatToBf16(std::cos(0.1f * static_cast<float>(i * (p + 1))));
    RequestOptions o;
    o.k = 4;
    o.temperature = 1.0f;
    pool.push_back(BuildRequest(mode, HiddenRows::Bf16(h, kRows), o).SerializeAsString());
  }
  return pool;
}

std::string CodeCounts(const LoadResult& r) {
  std::string out = "codes:";
  for (const auto& [code, n] : r.errors_by_code) out += " " + std::to_string(code) + "=" + std::to_string(n);
  return out + " ok=" + std::to_string(r.ok) + " stream_failures=" + std::to_string(r.stream_failures);
}

LoadOptions Base(const FakeServerProcess& s) {
  LoadOptions o;
  o.target = s.target();
  o.duration = absl::Seconds(20);  // a bound; the count ends these runs
  o.timeout = absl::Seconds(20);
  return o;
}

TEST(ScanLogitsResponse, MatchesTheMessage) {
  v1::LogitsResponse r;
  r.set_request_id(7);
  r.set_rows(3);
  r.set_vocab_size(100);
  r.set_logits(std::string(600, 'x'));
  r.add_token_ids(5);
  r.add_values(1.5f);
  r.mutable_timing()->set_queue_us(123);
  r.mutable_timing()->set_compute_us(456);
  r.mutable_timing()->set_batch_rows(17);
  r.mutable_timing()->set_gemv_us(200);
  r.mutable_timing()->set_server_us(900);
  ScannedResponse s;
  ASSERT_TRUE(ScanLogitsResponse(r.SerializeAsString(), &s));
  EXPECT_EQ(s.rows, 3u);
  EXPECT_EQ(s.queue_us, 123u);
  EXPECT_EQ(s.compute_us, 456u);
  EXPECT_EQ(s.batch_rows, 17u);
  EXPECT_EQ(s.stage_us[3], 200u);  // gemv
  EXPECT_EQ(s.stage_us[8], 900u);  // server
  EXPECT_FALSE(s.step_untimed);
  // The stages step_untimed names are the backend's: h2d, gemv, epilogue, d2h.
  for (int i = 0; i < kTimingStages; ++i) {
    const std::string name = kTimingStageNames[i];
    EXPECT_EQ(IsStepStage(i), name == "h2d" || name == "gemv" || name == "epilogue" || name == "d2h") << name;
  }
  r.mutable_timing()->set_step_untimed(true);
  ScannedResponse u;
  ASSERT_TRUE(ScanLogitsResponse(r.SerializeAsString(), &u));
  EXPECT_TRUE(u.step_untimed);
  EXPECT_EQ(u.stage_us[8], 900u);
  r.mutable_timing()->set_step_untimed(false);
  EXPECT_EQ(s.error_code, 0);
  r.mutable_error()->set_code(3);
  r.mutable_error()->set_message("top_k: bad");
  ScannedResponse e;
  ASSERT_TRUE(ScanLogitsResponse(r.SerializeAsString(), &e));
  EXPECT_EQ(e.error_code, 3);
  EXPECT_TRUE(e.has_error_message);
  ScannedResponse bad;
  std::string truncated = r.SerializeAsString();
  truncated.resize(truncated.size() / 2);
  EXPECT_FALSE(ScanLogitsResponse(truncated, &bad));
}

TEST(LoadTester, ClosedLoopStopsAtTheCount) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.concurrency = 8;
  o.connections = 2;
  o.requests = 400;
  o.record_requests = true;
  auto r = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->issued, 400u);
  EXPECT_EQ(r->ok, 400u);
  EXPECT_EQ(r->errors, 0u);
  EXPECT_EQ(r->rows, 400u * kRows);
  EXPECT_EQ(r->latency.count(), 400u);
  EXPECT_EQ(r->records.size(), 400u);
  EXPECT_EQ(r->batch_rows.Percentile(0.5), static_cast<double>(kRows));
  EXPECT_GT(r->requests_per_s, 0);
  std::set<uint64_t> seqs;
  for (const auto& q : r->records) seqs.insert(q.seq);
  EXPECT_EQ(seqs.size(), 400u);
  uint64_t timeline_ok = 0;
  for (const auto& s : r->timeline) timeline_ok += s.ok;
  EXPECT_EQ(timeline_ok, 400u);
  // --connections=2: the server sees two callers (it tells unary callers apart by connection).
  EXPECT_EQ(r->caller_kind, "channel");
  ASSERT_EQ(r->callers.size(), 2u);
  EXPECT_EQ(r->callers[0].ok + r->callers[1].ok, 400u);
}

// Per-caller figures: by default (connections 0) each of the c in-flight slots has its own channel
// (unary) or its own stream, i.e. is its own caller to the server; every measured answer is counted
// for exactly one caller, each caller's percentiles are its own.
TEST(LoadTester, OneCallerPerWorkerWithItsOwnFigures) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--fail-first=2"});
  ASSERT_NE(server.port(), 0);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "unary");
    LoadOptions o = Base(server);
    o.stream = stream;
    o.concurrency = 6;
    o.requests = 300;
    auto r = RunLoad(o, Pool(v1::ARGMAX), kRows);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->caller_kind, stream ? "stream" : "channel");
    ASSERT_EQ(r->callers.size(), 6u);
    uint64_t ok = 0, errors = 0, hist = 0;
    for (const CallerStats& c : r->callers) {
      EXPECT_GT(c.ok, 0u) << "a worker that sent nothing";
      ok += c.ok;
      errors += c.errors;
      hist += c.latency.count();
      EXPECT_EQ(c.latency.count(), c.ok);
      EXPECT_LE(c.latency.Percentile(0.5), c.latency.Percentile(0.99));
      EXPECT_GE(c.latency.Percentile(0.5), static_cast<double>(r->latency.min()) * 0.99);
      EXPECT_LE(c.latency.Percentile(0.99), static_cast<double>(r->latency.max()) * 1.01);
    }
    EXPECT_EQ(ok, r->ok);
    EXPECT_EQ(errors, r->errors);
    EXPECT_EQ(ok + errors, 300u);
    EXPECT_EQ(hist, r->latency.count());
  }
  // --connections=2 with 6 unary slots: 2 callers, 3 slots each.
  LoadOptions shared = Base(server);
  shared.concurrency = 6;
  shared.connections = 2;
  shared.requests = 60;
  auto s = RunLoad(shared, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->callers.size(), 2u);
  EXPECT_EQ(s->callers[0].ok + s->callers[0].errors + s->callers[1].ok + s->callers[1].errors, 60u);
}

// --client-api=blocking: the client library's blocking call on a thread (and a connection) per
// in-flight call; the count, the callers (one each), failures by code and the server's figures
// are counted as in the callback loop; open loop, streams and the lane are refused with it.
TEST(LoadTester, BlockingCallsOneCallerEach) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--fail-first=3"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.blocking = true;
  o.concurrency = 3;
  o.requests = 150;
  o.record_requests = true;
  auto r = RunLoad(o, Pool(v1::TOP_K), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->issued, 150u);
  EXPECT_EQ(r->ok + r->errors, 150u);
  EXPECT_EQ(r->errors_by_code[14], 3u) << "UNAVAILABLE, not retried: every failure counts";
  EXPECT_EQ(r->rows, r->ok * kRows);
  EXPECT_EQ(r->records.size(), 150u);
  EXPECT_EQ(r->batch_rows.Percentile(0.5), static_cast<double>(kRows));
  EXPECT_EQ(r->caller_kind, "channel");
  ASSERT_EQ(r->callers.size(), 3u);
  for (const CallerStats& c : r->callers) EXPECT_GT(c.ok, 0u) << "a thread that sent nothing";
  for (auto bad : {&LoadOptions::stream, &LoadOptions::lane}) {
    LoadOptions b = o;
    b.*bad = true;
    EXPECT_EQ(RunLoad(b, Pool(v1::TOP_K), kRows).status().code(), absl::StatusCode::kInvalidArgument);
  }
  LoadOptions open = o;
  open.rps = 100;
  EXPECT_EQ(RunLoad(open, Pool(v1::TOP_K), kRows).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadTester, DurationBoundAndWarmupNotMeasured) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.concurrency = 4;
  o.duration = absl::Milliseconds(600);
  o.warmup = absl::Milliseconds(300);
  const absl::Time t0 = absl::Now();
  auto r = RunLoad(o, Pool(v1::TOP_K), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  EXPECT_GT(wall, 0.85);
  EXPECT_LT(wall, 5.0);
  EXPECT_GT(r->ok, 0u);
  EXPECT_EQ(r->ok, r->issued);
  EXPECT_LT(r->elapsed_s, 1.5);
  EXPECT_GT(r->elapsed_s, 0.5);
}

TEST(LoadTester, ErrorsCountedByCode) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--fail-first=50"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.concurrency = 4;
  o.requests = 200;
  auto r = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok + r->errors, 200u);
  EXPECT_EQ(r->errors_by_code[14], 50u);  // UNAVAILABLE
  EXPECT_EQ(r->ok, 150u);
  EXPECT_NE(r->error_examples[14].find("fail-first"), std::string::npos);
  // A request the server refuses: every answer is INVALID_ARGUMENT (unary status).
  std::vector<std::string> bad = {Pool(v1::ARGMAX)[0]};
  v1::LogitsRequest q;
  q.ParseFromString(bad[0]);
  q.set_mode(v1::TOP_K);
  q.set_top_k(100000);
  bad[0] = q.SerializeAsString();
  o.requests = 20;
  auto b = RunLoad(o, bad, kRows);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->errors_by_code[3], 20u);
}

TEST(LoadTester, StreamsClosedAndOpenLoop) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.stream = true;
  o.streams = 3;
  o.concurrency = 8;
  o.requests = 300;
  auto r = RunLoad(o, Pool(v1::TOP_K), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 300u);
  EXPECT_EQ(r->errors, 0u);
  EXPECT_EQ(r->stream_failures, 0);
  // Open loop on streams, and in-band errors counted by their code.
  LoadOptions p = Base(server);
  p.stream = true;
  p.rps = 400;
  p.duration = absl::Seconds(1);
  auto s = RunLoad(p, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(static_cast<double>(s->ok), 400.0, 40.0);
  std::vector<std::string> bad = Pool(v1::ARGMAX, 1);
  v1::LogitsRequest q;
  q.ParseFromString(bad[0]);
  q.set_rows(1000);
  bad[0] = q.SerializeAsString();
  o.requests = 30;
  auto e = RunLoad(o, bad, kRows);
  ASSERT_TRUE(e.ok());
  // Every issued request is accounted for: the answer that reaches the count and the one that
  // sends the last message may run at once on one stream (that lost one, once, under ASan).
  EXPECT_EQ(e->issued, 30u);
  EXPECT_EQ(e->errors_by_code[3], 30u) << CodeCounts(*e);  // in-band INVALID_ARGUMENT; the stream went on
  EXPECT_EQ(e->ok + e->errors, 30u) << CodeCounts(*e);
}

// The point of an open loop: a server slower than the offered rate shows as growing latency while
// the client keeps sending on schedule (a closed loop would quietly send slower instead).
TEST(LoadTester, OpenLoopKeepsTheScheduleAgainstASlowServer) {
  // One worker, 2 ms per request: at most 500 requests/s.
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--delay-us=2000", "--workers=1"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.rps = 1000;
  o.duration = absl::Milliseconds(1500);
  o.record_requests = true;
  auto r = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  // Sent on schedule: 1500 in 1.5 s, whatever the server did.
  EXPECT_NEAR(static_cast<double>(r->issued), 1500.0, 30.0);
  // The median, not the tail: on a starved machine (CI's 2 cores under a parallel ctest, ASan) a
  // few sends run late and are caught up, which the count above already allows for; a scheduler
  // that paced itself by the answers would be behind for most of the run.
  EXPECT_LT(r->send_lag.Percentile(0.5), 50e6) << "the scheduler fell behind (ns)";
  EXPECT_EQ(r->ok, r->issued);
  // Answered at the server's pace, so the backlog and the latency grow over the run.
  EXPECT_LT(r->ok_per_s, 700.0);
  ASSERT_EQ(r->records.size(), r->issued);
  const size_t n = r->records.size(), tenth = n / 10;
  double early = 0, late = 0;
  for (size_t i = 0; i < tenth; ++i) early += static_cast<double>(r->records[i].latency_ns);
  for (size_t i = n - tenth; i < n; ++i) late += static_cast<double>(r->records[i].latency_ns);
  EXPECT_GT(late, 5 * early) << "latency did not grow: early " << early / tenth << " ns, late " << late / tenth;
  EXPECT_GT(r->latency.Percentile(0.99), 300e6);  // the last ones waited for ~700 queued ahead
  EXPECT_GT(r->queue_us.Percentile(0.9), 100000.0);  // and the server says it was queueing
  // The same server below its capacity: latency stays near the service time.
  o.rps = 150;
  o.duration = absl::Seconds(1);
  auto c = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(c.ok());
  EXPECT_NEAR(static_cast<double>(c->issued), 150.0, 10.0);
  EXPECT_LT(c->latency.Percentile(0.5), 50e6);
}

// Coordinated omission: when the client itself cannot send on time (here held back by
// max_inflight), the wait still counts, because latency runs from the scheduled send time.
TEST(LoadTester, OpenLoopLatencyCountsFromTheSchedule) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--delay-us=2000", "--workers=1"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.rps = 1000;
  o.duration = absl::Milliseconds(800);
  o.max_inflight = 2;  // against one 2 ms worker: at most 500/s sent, half the schedule
  auto r = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(static_cast<double>(r->issued), 800.0, 20.0);  // every scheduled request went, late
  EXPECT_EQ(r->ok, r->issued);
  // Each answer took ~2-4 ms of service, yet the late ones report their whole delay.
  EXPECT_LT(r->compute_us.Percentile(0.5), 10000.0);
  EXPECT_GT(r->send_lag.max(), 100e6);
  EXPECT_GT(r->latency.Percentile(0.99), 100e6);
  EXPECT_GE(r->latency.max(), r->send_lag.max());
}

// A server that stops answering cannot hang a run: unary calls end at their deadline, streams
// (which have no deadline in a count-bounded run) are cancelled after --timeout without answers.
TEST(LoadTester, AStalledServerEndsTheRun) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--delay-us=60000000", "--workers=1"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o;
  o.target = server.target();
  o.duration = absl::InfiniteDuration();
  o.requests = 6;
  o.concurrency = 3;
  o.timeout = absl::Milliseconds(800);
  const absl::Time t0 = absl::Now();
  auto u = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->ok, 0u);
  EXPECT_EQ(u->errors_by_code[4], 6u);  // DEADLINE_EXCEEDED
  o.stream = true;
  o.streams = 2;
  auto s = RunLoad(o, Pool(v1::ARGMAX), kRows);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ok, 0u);
  EXPECT_EQ(s->errors, 3u);  // the three in flight, cancelled
  EXPECT_EQ(s->errors_by_code[1], 3u);  // CANCELLED
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

TEST(LoadReport, JsonSchemaAndHtml) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=256", "--fail-first=3"});
  ASSERT_NE(server.port(), 0);
  LoadOptions o = Base(server);
  o.requests = 100;
  o.record_requests = true;
  LoadReport rep;
  rep.started_at = "2026-12-02T00:00:00.000Z";
  rep.config = {{"target", o.target}, {"loop", "closed"}};
  rep.sweep = true;
  for (int c : {1, 4}) {
    o.concurrency = c;
    auto r = RunLoad(o, Pool(v1::ARGMAX), kRows);
    ASSERT_TRUE(r.ok()) << r.status();
    rep.runs.push_back(*std::move(r));
  }
  auto c = DraftHeadClient::Connect(o.target, {});
  ASSERT_TRUE(c.ok());
  auto info = (*c)->Info();
  ASSERT_TRUE(info.ok());
  rep.server = *info;
  const nlohmann::ordered_json j = ToJson(rep);
  EXPECT_EQ(j.at("schema_version"), kLoadReportSchemaVersion);
  EXPECT_EQ(j.at("tool"), "drafthead-client load");
  EXPECT_TRUE(j.at("config").is_object());
  EXPECT_EQ(j.at("server").at("hidden_size"), K);
  ASSERT_EQ(j.at("runs").size(), 2u);
  for (const auto& run : j.at("runs")) {
    for (const char* key : {"loop", "concurrency", "rps_target", "elapsed_s", "issued", "answered", "ok", "errors",
                            "errors_by_code", "error_examples", "requests_per_s", "ok_per_s", "rows_per_s", "latency_us",
                            "server_us", "batch_rows_p50", "send_lag_us", "stream_failures", "histogram_relative_error",
                            "latency_histogram", "timeline", "callers", "callers_summary"}) {
      EXPECT_TRUE(run.contains(key)) << key;
    }
    for (const char* p : {"min", "p50", "p90", "p99", "p999", "max", "mean"}) {
      ASSERT_TRUE(run.at("latency_us").at(p).is_number()) << p;
    }
    EXPECT_LE(run.at("latency_us").at("min"), run.at("latency_us").at("p50"));
    EXPECT_LE(run.at("latency_us").at("p50"), run.at("latency_us").at("p99"));
    EXPECT_LE(run.at("latency_us").at("p99"), run.at("latency_us").at("max"));
    for (const char* s : {"queue", "compute", "network_client"}) EXPECT_TRUE(run.at("server_us").at(s).at("p50").is_number());
    EXPECT_EQ(run.at("answered"), 100);
    uint64_t hist = 0;
    for (const auto& b : run.at("latency_histogram")) hist += b.at("count").get<uint64_t>();
    EXPECT_EQ(hist, run.at("ok").get<uint64_t>());
    EXPECT_FALSE(run.at("timeline").empty());
    EXPECT_TRUE(run.at("timeline")[0].contains("p99_us"));
    // One caller per worker (connections 0): callers length == concurrency, counts add up to the run's.
    const auto& callers = run.at("callers");
    ASSERT_EQ(callers.size(), run.at("concurrency").get<size_t>());
    uint64_t count = 0, ok = 0;
    double p50_min = 1e300, p50_max = 0;
    for (const auto& c : callers) {
      for (const char* key : {"caller", "count", "ok", "errors", "p50_us", "p99_us"}) EXPECT_TRUE(c.contains(key)) << key;
      EXPECT_EQ(c.at("count").get<uint64_t>(), c.at("ok").get<uint64_t>() + c.at("errors").get<uint64_t>());
      EXPECT_LE(c.at("p50_us").get<double>(), c.at("p99_us").get<double>());
      count += c.at("count").get<uint64_t>();
      ok += c.at("ok").get<uint64_t>();
      p50_min = std::min(p50_min, c.at("p50_us").get<double>());
      p50_max = std::max(p50_max, c.at("p50_us").get<double>());
    }
    EXPECT_EQ(count, run.at("answered").get<uint64_t>());
    EXPECT_EQ(ok, run.at("ok").get<uint64_t>());
    const auto& sum = run.at("callers_summary");
    EXPECT_EQ(sum.at("kind"), "channel");
    EXPECT_EQ(sum.at("callers").get<size_t>(), callers.size());
    EXPECT_EQ(sum.at("answered").get<size_t>(), callers.size());
    EXPECT_DOUBLE_EQ(sum.at("p50_us_min").get<double>(), p50_min);
    EXPECT_DOUBLE_EQ(sum.at("p50_us_max").get<double>(), p50_max);
    EXPECT_GE(sum.at("p50_max_over_min").get<double>(), 1.0);
    EXPECT_GE(sum.at("p99_us_max").get<double>(), sum.at("p50_us_max").get<double>());
  }
  EXPECT_NE(FormatText(rep).find("callers    4 x channel, 4 answered"), std::string::npos) << FormatText(rep);
  EXPECT_EQ(j.at("runs")[0].at("errors_by_code").at("UNAVAILABLE"), 3);
  const std::string csv = ToCsv(rep);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 201);
  const std::string html = ToHtml(rep);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  EXPECT_EQ(svgs, 2 + 3 * 2u);  // sweep curve, CDF; per run histogram, throughput, latency
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("Concurrency sweep"), std::string::npos);
}

}  // namespace
}  // namespace drafthead::client
