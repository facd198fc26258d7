// StreamLogits backpressure (server/api/stream_budget.h), against a real server process: callers
// that never read cost only themselves. 30 streams send full-logits requests and read nothing:
// rank 0 computes at most what the budgets allow and its memory stays within them plus a fixed
// margin, while a unary caller and a reading stream beside them keep their latency; a stream that
// reads nothing past --stream-stall-timeout is cancelled; and the same at real proportions
// (answers of MBs, batches of tens of ms): a polite caller waits about one batch, and rank 0's peak
// memory stays within the documented bound. Cost: ~25 s on 2 loaded cores.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "e2e_util.h"
#include "server/api/stream_budget.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::Channel;
using testing::ServerProcess;
using testing::WaitServing;
using Clock = std::chrono::steady_clock;

constexpr int64_t kK = 256;
constexpr int64_t kVocab = 16384;
constexpr int kRows = 8;                                // full logits: 8 x 16384 x 4 = 512 KiB an answer
constexpr uint64_t kAnswer = kRows * kVocab * 4;
constexpr uint64_t kPerStream = 2 * kAnswer - 1;        // two answers held, then not read further
constexpr uint64_t kTotal = 8 * kAnswer;
constexpr int kDeafStreams = 30;
constexpr int kRequestsPerStream = 40;                  // 1200 answers (600 MiB) if nothing held back
constexpr uint64_t kMargin = 64ull << 20;               // allocator, gRPC buffers, request windows
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMemoryMeasurable = false;  // ASan's quarantine keeps freed memory resident
#else
constexpr bool kMemoryMeasurable = true;
#endif

v1::LogitsRequest Req(int rows, v1::Mode mode, uint64_t seed) {
  const auto x = ref::RandomBf16(rows * kK, seed);
  v1::LogitsRequest r;
  r.set_rows(rows);
  r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  r.set_mode(mode);
  r.set_logits_dtype(v1::FP32);
  r.set_request_id(seed);
  return r;
}

uint64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// The value of the /metrics line that starts with `key` (-1: unreadable or absent).
int64_t MetricValue(int metrics_port, const std::string& key) {
  httplib::Client http("127.0.0.1", metrics_port);
  http.set_read_timeout(5, 0);
  auto res = http.Get("/metrics");
  if (!res || res->status != 200) return -1;
  const std::string line = "\n" + key + " ";
  const size_t at = res->body.find(line);
  return at == std::string::npos ? -1 : std::stoll(res->body.substr(at + line.size()));
}

int FullLogitsAnswered(int metrics_port) {
  const int64_t n = MetricValue(metrics_port, "drafthead_requests_total{mode=\"full_logits\",code=\"OK\"}");
  return n < 0 ? 0 : static_cast<int>(n);  // no line yet: none answered
}

double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

// Median latency of n unary M=1 argmax calls, and of n requests on one reading stream.
struct Latency {
  double unary_ms, stream_ms;
  int failed = 0;
};
Latency WellBehavedCaller(const std::string& target, int n) {
  Latency out{};
  auto stub = v1::DraftHead::NewStub(Channel(target));
  std::vector<double> unary, stream;
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::LogitsResponse resp;
    const auto t0 = Clock::now();
    if (!stub->ComputeLogits(&ctx, Req(1, v1::ARGMAX, 100 + i), &resp).ok()) ++out.failed;
    unary.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto rw = stub->StreamLogits(&ctx);
  for (int i = 0; i < n; ++i) {
    v1::LogitsResponse resp;
    const auto t0 = Clock::now();
    if (!rw->Write(Req(1, v1::ARGMAX, 200 + i)) || !rw->Read(&resp) || resp.has_error()) ++out.failed;
    stream.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  rw->WritesDone();
  if (!rw->Finish().ok()) ++out.failed;
  out.unary_ms = MedianMs(unary);
  out.stream_ms = MedianMs(stream);
  return out;
}

// A stream that sends requests and never reads; its writer blocks once flow control stops it,
// until the context is cancelled. Its channel does not probe bandwidth (BDP), so the caller's
// receive window stays at HTTP/2's 64 KiB: what it does not read stays with the server.
std::shared_ptr<grpc::Channel> DeafChannel(const std::string& target) {
  grpc::ChannelArguments ca;
  ca.SetMaxReceiveMessageSize(-1);
  ca.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), ca);
}

struct DeafStream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::LogitsRequest, v1::LogitsResponse>> rw;
  std::thread writer;
  std::atomic<int> written{0};
  std::atomic<bool> write_failed{false};
};

void StartDeaf(DeafStream& d, v1::DraftHead::Stub& stub, int requests) {
  d.rw = stub.StreamLogits(&d.ctx);
  d.writer = std::thread([&d, requests] {
    for (int i = 0; i < requests; ++i) {
      if (!d.rw->Write(Req(kRows, v1::FULL_LOGITS, 1000 + i))) {
        d.write_failed = true;
        return;
      }
      ++d.written;
    }
  });
}

class StreamBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = "127.0.0.1:" + std::to_string(testing::FreePort());
    metrics_port_ = testing::FreePort();
  }
  std::vector<std::string> Args(const std::string& stall) {
    return {"--tp=1", "--backend=cpu", "--comm=gloo", "--listen=" + target_, "--threads=1",
            "--synthetic=5", "--hidden-size=" + std::to_string(kK), "--padded-vocab=" + std::to_string(kVocab),
            "--metrics-listen=127.0.0.1:" + std::to_string(metrics_port_),
            "--stream-buffer-bytes=" + std::to_string(kPerStream),
            "--stream-buffer-total-bytes=" + std::to_string(kTotal), "--stream-stall-timeout=" + stall};
  }
  testutil::TempDir tmp_;
  std::string target_;
  int metrics_port_ = 0;
};

TEST_F(StreamBudgetTest, CallersThatNeverReadCostOnlyThemselves) {
  ServerProcess p(Args("10m"), tmp_.path() + "/server.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  // Warm up (allocator pools, gRPC threads) with a reading stream of the same answers.
  {
    auto stub = v1::DraftHead::NewStub(Channel(target_));
    grpc::ClientContext ctx;
    auto rw = stub->StreamLogits(&ctx);
    for (int i = 0; i < 8; ++i) {
      v1::LogitsResponse resp;
      ASSERT_TRUE(rw->Write(Req(kRows, v1::FULL_LOGITS, i)) && rw->Read(&resp));
      ASSERT_FALSE(resp.has_error()) << resp.error().message();
      ASSERT_EQ(resp.logits().size(), kAnswer);
    }
    rw->WritesDone();
    ASSERT_TRUE(rw->Finish().ok());
  }
  const Latency before = WellBehavedCaller(target_, 9);
  const uint64_t rss_before = RssBytes(p.pid());
  const int answered_before = FullLogitsAnswered(metrics_port_);

  auto stub = v1::DraftHead::NewStub(DeafChannel(target_));
  std::vector<std::unique_ptr<DeafStream>> deaf;
  for (int s = 0; s < kDeafStreams; ++s) {
    deaf.push_back(std::make_unique<DeafStream>());
    StartDeaf(*deaf.back(), *stub, kRequestsPerStream);
  }
  // Wait until rank 0 stops computing for them: every stream's first answer (a starved one fails
  // below), then the answered count unchanged for 1.5 s.
  int last = -1, answered = 0;
  auto stable_since = Clock::now();
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < until &&
         (answered < kDeafStreams || Clock::now() - stable_since < std::chrono::milliseconds(1500))) {
    answered = FullLogitsAnswered(metrics_port_) - answered_before;
    if (answered != last) {
      last = answered;
      stable_since = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const uint64_t rss_during = RssBytes(p.pid());
  const Latency during = WellBehavedCaller(target_, 9);
  const uint64_t growth = rss_during > rss_before ? rss_during - rss_before : 0;
  std::printf("deaf streams: %d answers computed (of %d sent), rank 0 RSS %.1f -> %.1f MiB (+%.1f, bound %.1f)\n"
              "well-behaved caller: unary argmax median %.1f -> %.1f ms, stream %.1f -> %.1f ms\n",
              answered, kDeafStreams * kRequestsPerStream, rss_before / 1048576.0, rss_during / 1048576.0,
              growth / 1048576.0, (kTotal + kDeafStreams * kAnswer + kMargin) / 1048576.0, before.unary_ms,
              during.unary_ms, before.stream_ms, during.stream_ms);
  // Each deaf stream holds at most two answers (its budget), and rank 0's memory grows by at most
  // the budgets (the total, plus one answer per stream that holds nothing) and a fixed margin.
  EXPECT_LE(answered, 2 * kDeafStreams);
  EXPECT_GE(answered, kDeafStreams);  // every stream got its first answer: none starved
  if (kMemoryMeasurable) {
    EXPECT_LE(growth, kTotal + kDeafStreams * kAnswer + kMargin);
  }
  // The well-behaved caller is not held back (with nothing held back rank 0 computes 600 MiB of
  // answers first: seconds).
  EXPECT_EQ(during.failed + before.failed, 0);
  EXPECT_LT(during.unary_ms, 500) << "before: " << before.unary_ms;
  EXPECT_LT(during.stream_ms, 500) << "before: " << before.stream_ms;
  for (auto& d : deaf) d->ctx.TryCancel();
  for (auto& d : deaf) d->writer.join();
  kill(p.pid(), SIGTERM);
  EXPECT_NE(p.Wait(std::chrono::seconds(30)), -1);
}

int QueuedRequests(int metrics_port) {
  return static_cast<int>(MetricValue(metrics_port, "drafthead_queue_requests"));
}

// Samples a process's RSS every 10 ms until stopped; keeps the largest.
class PeakRss {
 public:
  explicit PeakRss(pid_t pid)
      : thread_([this, pid] {
          while (!stop_) {
            peak_ = std::max<uint64_t>(peak_, RssBytes(pid));
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }) {}
  uint64_t Stop() {
    stop_ = true;
    thread_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

// The issue-24 scenario at CI size but real proportions: answers of 4 MiB (64 rows x 16384 fp32
// logits) and batches of tens of ms (K = 2048, one thread). 24 streams send such requests and read
// nothing; a polite caller then sends unary M=1 argmax calls. The polite caller waits for about
// one batch (fair queueing: FIFO would put it behind the whole backlog, ~30 batches), and rank 0's
// peak RSS stays within the budgets' bound (the total plus one answer per stream) and a margin:
// each answer is held once, serialized, and counted (gRPC's copy of an answer being written used to
// be held beside the answer, uncounted).
// DRAFTHEAD_ISSUE24_SCENARIO=1 runs the issue's own scenario instead (docs/operations.md's
// benchmark): K = 1024, 64000 rows (16 MB answers), 30 streams sending 40 requests each, the
// server's default budgets and threads, the polite call 5 s after the streams start.
TEST(StreamBudgetRealSizes, DeafStreamsDelayNoOtherCallerAndStayWithinTheBound) {
  const bool issue = std::getenv("DRAFTHEAD_ISSUE24_SCENARIO") != nullptr;
  const int64_t K = issue ? 1024 : 2048, kV = issue ? 64000 : 16384;
  const int kM = 64, kDeaf = issue ? 30 : 24, kSent = issue ? 40 : 6;
  const uint64_t kA = kM * kV * 4;                                   // an answer: 4 MiB (16 MB)
  const uint64_t kPerStream = issue ? StreamBudgetOptions{}.per_stream_bytes : 4 * kA;
  const uint64_t kAll = issue ? StreamBudgetOptions{}.total_bytes : 24 * kA;  // 96 MiB (1 GiB)
  const uint64_t kBound = kAll + kDeaf * kA;    // docs/operations.md's formula: 192 MiB (1.5 GB)
  // Beyond the formula: the completer's two payloads and an answer being built (4 answers), the
  // requests read and queued (~50 x 256 KiB), gRPC's buffers and the allocator's slack (the rest).
  const uint64_t kRssMargin = 96ull << 20;
  testutil::TempDir tmp;
  const std::string target = "127.0.0.1:" + std::to_string(testing::FreePort());
  const int metrics_port = testing::FreePort();
  std::vector<std::string> args = {
      "--tp=1", "--backend=cpu", "--comm=gloo", "--listen=" + target, "--synthetic=5",
      "--hidden-size=" + std::to_string(K), "--padded-vocab=" + std::to_string(kV),
      "--metrics-listen=127.0.0.1:" + std::to_string(metrics_port), "--stream-stall-timeout=10m"};
  if (!issue) {
    args.insert(args.end(), {"--threads=1", "--stream-buffer-bytes=" + std::to_string(kPerStream),
                             "--stream-buffer-total-bytes=" + std::to_string(kAll)});
  }
  ServerProcess p(args, tmp.path() + "/server.log");
  ASSERT_TRUE(WaitServing(p, target, std::chrono::seconds(60))) << p.Log();
  auto request = [&](int rows, v1::Mode mode, uint64_t seed) {
    const auto x = ref::RandomBf16(rows * K, seed);
    v1::LogitsRequest r;
    r.set_rows(rows);
    r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
    r.set_mode(mode);
    r.set_logits_dtype(v1::FP32);
    r.set_request_id(seed);
    return r;
  };
  // Warm up with a reading stream of the same answers. The yardstick: one such request's turn
  // (its round trip alone: compute, answer, transfer), measured here, now.
  std::vector<double> batch_ms, turn_ms;
  {
    auto stub = v1::DraftHead::NewStub(Channel(target));
    grpc::ClientContext ctx;
    auto rw = stub->StreamLogits(&ctx);
    for (int i = 0; i < 6; ++i) {
      v1::LogitsResponse resp;
      const auto t0 = Clock::now();
      ASSERT_TRUE(rw->Write(request(kM, v1::FULL_LOGITS, i)) && rw->Read(&resp));
      turn_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      ASSERT_FALSE(resp.has_error()) << resp.error().message();
      ASSERT_EQ(resp.logits().size(), kA);
      batch_ms.push_back(resp.timing().compute_us() / 1000.0);
    }
    rw->WritesDone();
    ASSERT_TRUE(rw->Finish().ok());
  }
  const double batch = MedianMs(batch_ms), turn = MedianMs(turn_ms);
  const int answered_before = FullLogitsAnswered(metrics_port);
  const uint64_t rss_before = RssBytes(p.pid());
  PeakRss peak(p.pid());

  auto deaf_stub = v1::DraftHead::NewStub(DeafChannel(target));
  std::vector<std::unique_ptr<DeafStream>> deaf;
  for (int s = 0; s < kDeaf; ++s) {
    deaf.push_back(std::make_unique<DeafStream>());
    DeafStream& d = *deaf.back();
    d.rw = deaf_stub->StreamLogits(&d.ctx);
    d.writer = std::thread([&d, &request, kSent] {
      for (int i = 0; i < kSent; ++i) {
        if (!d.rw->Write(request(kM, v1::FULL_LOGITS, 1000 + i))) return;
        ++d.written;
      }
    });
  }
  // The backlog builds: each deaf stream's first request and more, up to the budgets. The polite
  // caller comes once every deaf stream has had its first answer (the issue's: 5 s later), while
  // their further requests still wait.
  // The wait is bounded by the turns measured above (kDeaf of them, 3x over), not a fixed time:
  // under the sanitizers a turn took 1.6 s, and a fixed 30 s let the polite caller in while six
  // deaf streams still had their first turn to come (newcomers too: ahead of it, 10 batches).
  if (issue) std::this_thread::sleep_for(std::chrono::seconds(5));
  const auto first_turns = std::chrono::seconds(30) + std::chrono::milliseconds(static_cast<int64_t>(3 * kDeaf * turn));
  for (auto until = Clock::now() + first_turns;
       Clock::now() < until && FullLogitsAnswered(metrics_port) - answered_before < kDeaf;)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // EXPECT: the deaf streams' writers must still be cancelled and joined below.
  EXPECT_GE(FullLogitsAnswered(metrics_port) - answered_before, kDeaf)
      << "the deaf streams' first answers did not all come within " << kDeaf << " turns, 3x over";
  const int queued = QueuedRequests(metrics_port);
  EXPECT_GE(queued, 8) << "no backlog left to queue behind";
  auto stub = v1::DraftHead::NewStub(Channel(target));
  std::vector<double> polite;
  std::vector<int64_t> polite_batches;  // batches run while each polite call was out
  int failed = 0;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::LogitsResponse resp;
    const int64_t batches_before = MetricValue(metrics_port, "drafthead_batches_total");
    const auto t0 = Clock::now();
    if (!stub->ComputeLogits(&ctx, request(1, v1::ARGMAX, 100 + i), &resp).ok()) ++failed;
    polite.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    polite_batches.push_back(MetricValue(metrics_port, "drafthead_batches_total") - batches_before);
    std::printf("polite call %d: %.1f ms, %lld batches run meanwhile; server: queue %.1f ms, batch of %u rows %.1f ms, "
                "in the server %.1f ms\n", i, polite.back(), static_cast<long long>(polite_batches.back()),
                resp.timing().queue_us() / 1e3, resp.timing().batch_rows(), resp.timing().compute_us() / 1e3,
                resp.timing().server_us() / 1e3);
  }
  const int backlog_after = QueuedRequests(metrics_port);
  // Rank 0 computes what the budgets let it; wait until it stops (the queue empty for 1 s).
  auto empty_since = Clock::now();
  for (auto until = Clock::now() + std::chrono::seconds(60);
       Clock::now() < until && Clock::now() - empty_since < std::chrono::seconds(1);) {
    if (QueuedRequests(metrics_port) != 0) empty_since = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const uint64_t rss_peak = peak.Stop();
  const uint64_t growth = rss_peak > rss_before ? rss_peak - rss_before : 0;
  std::printf("%s: batch of %d rows: %.1f ms (a turn: %.1f ms); polite unary M=1 argmax: %.1f, %.1f, %.1f ms (%d queued when sent, %d "
              "after)\nrank 0 RSS %.1f MiB -> peak %.1f MiB (+%.1f; bound %.1f + margin %.1f)\n",
              issue ? "issue 24's scenario" : "CI size", kM, batch, turn, polite[0], polite[1], polite[2], queued, backlog_after, rss_before / 1048576.0,
              rss_peak / 1048576.0, growth / 1048576.0, kBound / 1048576.0, kRssMargin / 1048576.0);
  EXPECT_EQ(failed, 0);
  // Counted in batches, not time (a turn measured once, before, ran 30 % slower later under the
  // sanitizers on a shared 2-core machine, 3.56 turns seen against 4): the batch running when the
  // call came, at most one more (a caller cut off before it, or an answer waiting to be built), its
  // own, and one of slack for the metrics read around the call. FIFO: the whole backlog, `queued`
  // (>= 8, checked above).
  for (int64_t b : polite_batches) EXPECT_LE(b, 4) << "batches run while a polite call waited";
  if (kMemoryMeasurable) {
    EXPECT_LE(growth, kBound + kRssMargin);
  }
  for (auto& d : deaf) d->ctx.TryCancel();
  for (auto& d : deaf) d->writer.join();
  kill(p.pid(), SIGTERM);
  EXPECT_NE(p.Wait(std::chrono::seconds(30)), -1);
}

// One caller's queue is bounded (--max-caller-queue-rows): a stream that pipelines more than that
// gets RESOURCE_EXHAUSTED in-band for the requests past it, every other request answered, all in
// request order, and the stream goes on.
TEST(StreamCallerBound, RequestsPastTheCallersQueueBoundAreRefusedInBand) {
  constexpr int64_t K = 2048, kV = 16384;  // batches of tens of ms: the stream's requests pile up
  testutil::TempDir tmp;
  const std::string target = "127.0.0.1:" + std::to_string(testing::FreePort());
  ServerProcess p({"--tp=1", "--backend=cpu", "--comm=gloo", "--listen=" + target, "--threads=1", "--synthetic=5",
                   "--hidden-size=" + std::to_string(K), "--padded-vocab=" + std::to_string(kV),
                   "--max-caller-queue-rows=128"},
                  tmp.path() + "/server.log");
  ASSERT_TRUE(WaitServing(p, target, std::chrono::seconds(60))) << p.Log();
  auto stub = v1::DraftHead::NewStub(Channel(target));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto rw = stub->StreamLogits(&ctx);
  constexpr int kSent = 16;  // 1024 rows sent at once; 128 may wait
  const auto x = ref::RandomBf16(64 * K, 1);
  for (int i = 0; i < kSent; ++i) {
    v1::LogitsRequest r;
    r.set_request_id(i);
    r.set_rows(64);
    r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
    r.set_mode(v1::ARGMAX);
    ASSERT_TRUE(rw->Write(r));
  }
  rw->WritesDone();
  int ok = 0, refused = 0;
  for (int i = 0; i < kSent; ++i) {
    v1::LogitsResponse resp;
    ASSERT_TRUE(rw->Read(&resp)) << "answer " << i;
    EXPECT_EQ(resp.request_id(), static_cast<uint64_t>(i));
    if (!resp.has_error()) {
      ++ok;
      EXPECT_EQ(resp.token_ids_size(), 64);
    } else {
      ++refused;
      EXPECT_EQ(resp.error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
      EXPECT_NE(resp.error().message().find("--max-caller-queue-rows"), std::string::npos) << resp.error().message();
    }
  }
  EXPECT_TRUE(rw->Finish().ok());
  EXPECT_GT(refused, 0) << "16 requests of 64 rows read at once, 128 rows may wait";
  EXPECT_GE(ok, 3);  // one computing (inline or taken), two queued
  std::printf("caller bound 128 rows: %d answered, %d refused in-band\n", ok, refused);
  kill(p.pid(), SIGTERM);
  EXPECT_NE(p.Wait(std::chrono::seconds(30)), -1);
}

TEST_F(StreamBudgetTest, AStreamThatReadsNothingIsCancelledAfterTheStallTimeout) {
  ServerProcess p(Args("1s"), tmp_.path() + "/server.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  auto stub = v1::DraftHead::NewStub(DeafChannel(target_));
  DeafStream d;
  d.ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  StartDeaf(d, *stub, 1000);  // far more than flow control and the budget let through
  // The server cancels the stream once its first answer has waited 1 s to be written.
  const auto t0 = Clock::now();
  while (p.Log().find("event=stream_cancelled") == std::string::npos && Clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(p.Log().find("event=stream_cancelled"), std::string::npos) << p.Log();
  // The caller learns it when it reads at last (gRPC gives a call's status only after its messages).
  v1::LogitsResponse resp;
  int read = 0;
  while (d.rw->Read(&resp)) ++read;
  EXPECT_LE(read, 2) << "answers the caller got before the cancellation";
  d.writer.join();
  const grpc::Status s = d.rw->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  // The server goes on serving.
  const Latency after = WellBehavedCaller(target_, 3);
  EXPECT_EQ(after.failed, 0);
}

}  // namespace
}  // namespace drafthead
