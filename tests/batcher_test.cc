// The Batcher: packing order, row limits, backpressure, deadlines, cancellation, close; fairness
// between callers (a caller's backlog does not hold back others', FIFO within a caller, the
// per-caller bound) and its metrics. The Completer: a handed-over batch is answered from its own
// copy, in order, before Drain returns.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"

#include "server/api/service.h"
#include "server/sched/batcher.h"
#include "server/sched/completer.h"
#include "server/sched/metrics.h"

namespace drafthead {
namespace {

struct Probe {
  absl::Status status = absl::UnknownError("not completed");
  int calls = 0;
};

BatchItem Item(uint32_t rows, Probe* p, uint64_t id = 0) {
  auto r = std::make_shared<PreparedRequest>();
  r->rows = rows;
  r->request_id = id;
  BatchItem it;
  it.req = r;
  it.enqueued = Clock::now();
  it.done = [p](const absl::Status& s, const BatchRowsResult*) {
    p->status = s;
    ++p->calls;
  };
  return it;
}

TEST(BatcherTest, PacksInArrivalOrderUpToMaxRows) {
  BatcherOptions o;
  o.max_rows = 10;
  Batcher b(o);
  Probe p[5];
  const uint32_t rows[5] = {4, 5, 3, 10, 1};
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(b.Submit(Item(rows[i], &p[i], i)).ok());
  auto b1 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b1.size(), 2u);  // 4 + 5; the 3 would overflow 10 and must not jump the queue
  EXPECT_EQ(b1[0].req->request_id, 0u);
  EXPECT_EQ(b1[1].req->request_id, 1u);
  auto b2 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b2.size(), 1u);
  EXPECT_EQ(b2[0].req->request_id, 2u);
  auto b3 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b3.size(), 1u);
  auto b4 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b4.size(), 1u);
  EXPECT_EQ(b.queued_rows(), 0u);
  for (auto& it : b1) it.done(absl::OkStatus(), nullptr);
}

TEST(BatcherTest, MaxRequestsOneTurnsBatchingOff) {
  BatcherOptions o;
  o.max_requests = 1;
  Batcher b(o);
  Probe p[3];
  for (int i = 0; i < 3; ++i) b.Submit(Item(2, &p[i], i)).IgnoreError();
  for (int i = 0; i < 3; ++i) {
    auto batch = b.Take(std::chrono::milliseconds(0));
    ASSERT_EQ(batch.size(), 1u);
    EXPECT_EQ(batch[0].req->request_id, static_cast<uint64_t>(i));
  }
}

TEST(BatcherTest, RefusesPastTheQueueLimitAtOnce) {
  BatcherOptions o;
  o.max_rows = 8;
  o.max_queue_rows = 10;
  Batcher b(o);
  Probe a, c, d;
  EXPECT_TRUE(b.Submit(Item(6, &a)).ok());
  absl::Status s = b.Submit(Item(5, &c));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.calls, 1);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.Submit(Item(4, &d)).ok());
  EXPECT_EQ(b.dropped().rejected, 1u);
}

TEST(BatcherTest, DropsExpiredAndCancelledBeforeCompute) {
  Batcher b(BatcherOptions{});
  Probe expired, cancelled, live;
  auto e = Item(1, &expired);
  e.deadline = Clock::now() - std::chrono::milliseconds(1);
  auto c = Item(1, &cancelled);
  c.cancelled = [] { return true; };
  b.Submit(std::move(e)).IgnoreError();
  b.Submit(std::move(c)).IgnoreError();
  b.Submit(Item(2, &live)).IgnoreError();
  auto batch = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].req->rows, 2u);
  EXPECT_EQ(expired.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(b.dropped().expired, 1u);
  EXPECT_EQ(b.dropped().cancelled, 1u);
}

// split_requests: the request that does not fit gives its first rows to the batch (which ends
// full) and waits with the rest at its caller's head; its one answer holds every rank's rows in
// request order, as if it had run whole. A part that fails or is dropped answers the request once
// with its status; a device destination is never split.
TEST(BatcherTest, SplitRequestsAreAnsweredOnceFromTheirParts) {
  BatcherOptions o;
  o.max_rows = 4;
  o.split_requests = true;
  Batcher b(o);
  // A payload row is 16 bytes: byte 0 the row's place in its request, byte 1 its rank.
  const ShardGeometry geo = ShardGeometry::Make(2, 0, 32, 64, 64);
  struct Whole {
    int calls = 0;
    absl::Status status = absl::UnknownError("not answered");
    std::vector<uint8_t> rows;  // rank, then row: byte 0 of each 16-byte row
    size_t per_rank_bytes = 0;
  };
  auto item = [](uint32_t rows, Whole* w) {
    Probe unused;
    BatchItem it = Item(rows, &unused);
    it.done = [w](const absl::Status& s, const BatchRowsResult* r) {
      ++w->calls;
      w->status = s;
      if (r == nullptr) return;
      w->per_rank_bytes = r->per_rank_bytes;
      for (int rank = 0; rank < 2; ++rank)
        for (uint32_t i = 0; i < 3; ++i) {
          const uint8_t* row = r->gathered + rank * r->per_rank_bytes + r->layout->row_offset[r->row0 + i];
          w->rows.push_back(static_cast<uint8_t>(row[0] + 10 * row[1]));
        }
    };
    return it;
  };
  // Answers a taken batch as the completer would: every item's rows at its place in the batch.
  auto answer = [&](std::vector<BatchItem>& batch) {
    uint32_t rows = 0;
    for (auto& it : batch) rows += it.rows();
    PayloadLayout layout;
    for (uint32_t i = 0; i <= rows; ++i) layout.row_offset.push_back(16 * i);
    std::vector<uint8_t> gathered(2 * 16 * rows);
    uint32_t r = 0;
    for (auto& it : batch)
      for (uint32_t i = 0; i < it.rows(); ++i, ++r)
        for (int rank = 0; rank < 2; ++rank) {
          gathered[rank * 16 * rows + 16 * r] = static_cast<uint8_t>(it.part_begin + i);
          gathered[rank * 16 * rows + 16 * r + 1] = static_cast<uint8_t>(rank);
        }
    BatchRowsResult result;
    result.layout = &layout;
    result.gathered = gathered.data();
    result.per_rank_bytes = 16 * rows;
    result.geometry = &geo;
    result.batch_rows = rows;
    AnswerBatch(batch, result, Clock::now());
  };
  Whole a, split, c;
  ASSERT_TRUE(b.Submit(item(3, &a)).ok());
  ASSERT_TRUE(b.Submit(item(3, &split)).ok());
  ASSERT_TRUE(b.Submit(item(3, &c)).ok());
  auto b1 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b1.size(), 2u);  // 3 rows of a, the first row of `split`: the batch ends full
  EXPECT_EQ(b1[1].part_begin, 0u);
  EXPECT_EQ(b1[1].rows(), 1u);
  EXPECT_EQ(b.queued_rows(), 5u);
  EXPECT_EQ(b.queued_requests(), 2u);
  auto b2 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b2.size(), 2u);  // the rest of `split` first (its caller's head), then one row of c
  EXPECT_EQ(b2[0].part_begin, 1u);
  EXPECT_EQ(b2[0].rows(), 2u);
  EXPECT_EQ(b2[1].rows(), 2u);
  auto b3 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b3.size(), 1u);
  EXPECT_EQ(b3[0].part_begin, 2u);
  EXPECT_EQ(b3[0].rows(), 1u);
  answer(b1);
  EXPECT_EQ(split.calls, 0);  // a part alone answers nothing
  answer(b2);
  answer(b3);
  for (const Whole* w : {&a, &split, &c}) {
    EXPECT_EQ(w->calls, 1);
    EXPECT_TRUE(w->status.ok()) << w->status;
    EXPECT_EQ(w->rows, (std::vector<uint8_t>{0, 1, 2, 10, 11, 12}));  // each rank's rows in order
  }
  EXPECT_EQ(split.per_rank_bytes, 3u * 16);  // a batch of its own rows (the others: their batch's)

  // A part dropped (expired at its caller's head) answers the request; the other part's answer,
  // coming later, is ignored.
  Whole late;
  Probe other;
  BatchItem e = item(3, &late);
  e.deadline = Clock::now() + std::chrono::milliseconds(50);
  ASSERT_TRUE(b.Submit(Item(3, &other)).ok());
  ASSERT_TRUE(b.Submit(std::move(e)).ok());
  auto b4 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b4.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_TRUE(b.Take(std::chrono::milliseconds(0)).empty());  // the rest expired while queued
  EXPECT_EQ(late.calls, 1);
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded);
  answer(b4);
  EXPECT_EQ(late.calls, 1);
  EXPECT_EQ(other.calls, 1);

  // A failed batch fails the request at once; its later part is ignored.
  Whole failed;
  ASSERT_TRUE(b.Submit(Item(2, &other)).ok());
  ASSERT_TRUE(b.Submit(item(3, &failed)).ok());
  auto b5 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b5.size(), 2u);
  for (auto& it : b5) it.done(absl::UnavailableError("the rank group failed"), nullptr);
  EXPECT_EQ(failed.calls, 1);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kUnavailable);
  auto b6 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b6.size(), 1u);
  answer(b6);
  EXPECT_EQ(failed.calls, 1);

  // Rows bound for device memory are not split: the batch ends short, as without split_requests.
  Whole device;
  ASSERT_TRUE(b.Submit(Item(2, &other)).ok());
  BatchItem d = item(3, &device);
  int sink = 0;
  d.device_logits = &sink;
  ASSERT_TRUE(b.Submit(std::move(d)).ok());
  auto b7 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b7.size(), 1u);
  EXPECT_EQ(b7[0].rows(), 2u);
  auto b8 = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(b8.size(), 1u);
  EXPECT_EQ(b8[0].rows(), 3u);
  EXPECT_EQ(b8[0].part_rows, 0u);  // whole
  b.Close(absl::CancelledError("test over"));
  for (auto* batch : {&b7, &b8})
    for (auto& it : *batch) it.done(absl::CancelledError("test over"), nullptr);
}

TEST(BatcherTest, QueueDelayLetsABatchFill) {
  BatcherOptions o;
  o.max_rows = 64;
  o.max_queue_delay = std::chrono::milliseconds(200);
  Batcher b(o);
  Probe p1, p2;
  b.Submit(Item(5, &p1)).IgnoreError();
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b.Submit(Item(5, &p2)).IgnoreError();
  });
  auto batch = b.Take(std::chrono::milliseconds(1000));
  late.join();
  EXPECT_EQ(batch.size(), 2u);
}

TEST(BatcherTest, CloseFailsQueuedAndLaterRequests) {
  Batcher b(BatcherOptions{});
  Probe q, later;
  b.Submit(Item(1, &q)).IgnoreError();
  b.Close(absl::UnavailableError("group failed"));
  EXPECT_EQ(q.status.code(), absl::StatusCode::kUnavailable);
  b.Submit(Item(1, &later)).IgnoreError();
  EXPECT_EQ(later.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(later.calls, 1);
  EXPECT_TRUE(b.Take(std::chrono::milliseconds(0)).empty());
}

BatchItem From(const char* cls, uint64_t caller, uint32_t rows, Probe* p, uint64_t id) {
  BatchItem it = Item(rows, p, id);
  it.caller = CallerKey{cls, caller};
  return it;
}

std::vector<uint64_t> Ids(const std::vector<BatchItem>& batch) {
  std::vector<uint64_t> ids;
  for (const auto& it : batch) ids.push_back(it.req->request_id);
  return ids;
}

// A caller's backlog does not hold back another caller's request: a caller that has just become
// active goes in the next batch (FIFO would put it behind the whole backlog).
TEST(BatcherTest, ANewCallerIsNotQueuedBehindAnotherCallersBacklog) {
  Batcher b(BatcherOptions{});  // max_rows 64
  Probe p[11];
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(b.Submit(From("stream", 1, 64, &p[i], i)).ok());
  ASSERT_TRUE(b.Submit(From("unary", 7, 1, &p[10], 100)).ok());
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({0}));
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({100}));
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({1}));
}

// Callers with backlogs take turns by rows (deficit round robin, max_rows of credit a turn), each
// caller's requests in its submission order, every batch within max_rows.
TEST(BatcherTest, CallersTakeTurnsByRowsInTheirOwnOrder) {
  BatcherOptions o;
  o.max_rows = 64;
  Batcher b(o);
  Probe p[9];
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(b.Submit(From("stream", 1, 32, &p[i], 10 + i)).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(b.Submit(From("stream", 2, 16, &p[3 + i], 20 + i)).ok());
  std::vector<std::vector<uint64_t>> got;
  while (b.queued_requests() > 0) got.push_back(Ids(b.Take(std::chrono::milliseconds(0))));
  const std::vector<std::vector<uint64_t>> want = {{10, 11}, {20, 21, 22, 23}, {12, 24, 25}};
  EXPECT_EQ(got, want);
}

// A caller whose request ended a batch (it did not fit) goes first in the next one, before callers
// that arrived meanwhile: a large request is not starved by a run of small newcomers.
TEST(BatcherTest, TheCallerCutOffGoesFirstInTheNextBatch) {
  Batcher b(BatcherOptions{});
  Probe p[4];
  ASSERT_TRUE(b.Submit(From("stream", 1, 64, &p[0], 1)).ok());
  ASSERT_TRUE(b.Submit(From("stream", 1, 64, &p[1], 2)).ok());
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({1}));
  ASSERT_TRUE(b.Submit(From("unary", 5, 1, &p[2], 50)).ok());
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({50}));  // 2 did not fit
  ASSERT_TRUE(b.Submit(From("unary", 6, 1, &p[3], 60)).ok());
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({2}));
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({60}));
}

// One caller's queue is bounded on its own: past max_caller_queue_rows it is refused, while other
// callers still queue.
TEST(BatcherTest, RefusesACallerPastItsOwnQueueLimit) {
  BatcherOptions o;
  o.max_rows = 8;
  o.max_queue_rows = 100;
  o.max_caller_queue_rows = 10;
  Batcher b(o);
  Probe a, c, d;
  EXPECT_TRUE(b.Submit(From("stream", 1, 6, &a, 1)).ok());
  const absl::Status s = b.Submit(From("stream", 1, 5, &c, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max-caller-queue-rows"), std::string::npos) << s.message();
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.Submit(From("stream", 2, 5, &d, 3)).ok());
  EXPECT_EQ(b.dropped().rejected, 1u);
  const auto depth = b.depth_by_class();
  ASSERT_EQ(depth.count("stream"), 1u);
  EXPECT_EQ(depth.at("stream").rows, 11u);
  EXPECT_EQ(depth.at("stream").callers, 2u);
}

// --queue-policy=fifo, the queue before fair queueing: batches in submission order across callers
// (a newcomer waits behind the whole backlog, a backlog's next request goes before a later
// caller's), FIFO within each caller, the per-caller bound and metrics as with fair queueing.
TEST(BatcherTest, FifoPolicyServesEveryCallerInSubmissionOrder) {
  BatcherOptions o;
  o.policy = QueuePolicy::kFifo;
  o.max_rows = 64;
  o.max_caller_queue_rows = 130;
  Batcher b(o);
  Probe p[9];
  ASSERT_TRUE(b.Submit(From("stream", 1, 32, &p[0], 10)).ok());
  ASSERT_TRUE(b.Submit(From("stream", 2, 16, &p[1], 20)).ok());
  ASSERT_TRUE(b.Submit(From("stream", 1, 32, &p[2], 11)).ok());
  ASSERT_TRUE(b.Submit(From("unary", 7, 1, &p[3], 70)).ok());
  ASSERT_TRUE(b.Submit(From("stream", 2, 16, &p[4], 21)).ok());
  ASSERT_TRUE(b.Submit(From("stream", 1, 64, &p[5], 12)).ok());
  const absl::Status refused = b.Submit(From("stream", 1, 8, &p[6], 13));  // caller 1: 128 + 8 > 130
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max-caller-queue-rows"), std::string::npos) << refused.message();
  ASSERT_TRUE(b.Submit(From("unary", 8, 1, &p[7], 80)).ok());
  const auto depth = b.depth_by_class();
  EXPECT_EQ(depth.at("stream").callers, 2u);
  EXPECT_EQ(depth.at("stream").rows, 160u);
  EXPECT_EQ(depth.at("unary").callers, 2u);
  std::vector<std::vector<uint64_t>> got;
  for (int i = 0; i < 8 && b.queued_requests() > 0; ++i) {
    got.push_back(Ids(b.Take(std::chrono::milliseconds(0))));
    b.BatchStarted();
  }
  // Fair queueing would give {10, 11}, {20, 21, 70, 80}, {12}: callers 2, 7 and 8 ahead of
  // caller 1's second request.
  const std::vector<std::vector<uint64_t>> want = {{10, 20}, {11, 70, 21}, {12}, {80}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(b.queued_rows(), 0u);
  EXPECT_TRUE(b.depth_by_class().empty());

  // A caller's expired head is dropped in its place in the order, not computed.
  Probe late, live;
  BatchItem e = From("stream", 3, 4, &late, 30);
  e.deadline = Clock::now() - std::chrono::milliseconds(1);
  ASSERT_TRUE(b.Submit(std::move(e)).ok());
  ASSERT_TRUE(b.Submit(From("stream", 3, 4, &live, 31)).ok());
  EXPECT_EQ(Ids(b.Take(std::chrono::milliseconds(0))), std::vector<uint64_t>({31}));
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b.dropped().expired, 1u);
}

TEST(BatcherTest, ParsesTheQueuePolicy) {
  QueuePolicy p = QueuePolicy::kFair;
  EXPECT_TRUE(ParseQueuePolicy("fifo", &p));
  EXPECT_EQ(p, QueuePolicy::kFifo);
  EXPECT_STREQ(QueuePolicyName(p), "fifo");
  EXPECT_TRUE(ParseQueuePolicy("fair", &p));
  EXPECT_EQ(p, QueuePolicy::kFair);
  EXPECT_STREQ(QueuePolicyName(p), "fair");
  EXPECT_FALSE(ParseQueuePolicy("FIFO", &p));
  EXPECT_FALSE(ParseQueuePolicy("", &p));
  EXPECT_EQ(BatcherOptions{}.policy, QueuePolicy::kFair);
}

// Queued rows per caller class and the waits are exported.
TEST(MetricsTest, ExportsQueuedRowsPerCallerClassAndTheWaits) {
  Metrics m(1);
  m.SetCallerQueues({{"stream", {12, 3}}, {"unary", {1, 1}}});
  m.RecordCallerWait("stream", 0.002);
  const std::string text = m.Render();
  EXPECT_NE(text.find("drafthead_caller_queue_rows{class=\"stream\"} 12"), std::string::npos) << text;
  EXPECT_NE(text.find("drafthead_caller_queue_callers{class=\"stream\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("drafthead_caller_queue_seconds_count{class=\"stream\"} 1"), std::string::npos) << text;
  m.SetCallerQueues({});
  EXPECT_NE(m.Render().find("drafthead_caller_queue_rows{class=\"unary\"} 0"), std::string::npos);
}

// A batch whose device stages were not timed (sampled stage events) adds no sample to their
// histograms, and KServe's statistics count its wall time less the broadcast as infer; a timed
// one splits as before.
TEST(MetricsTest, UntimedStepsAddNoStageSamplesAndCountTheirWallTimeAsInfer) {
  Metrics m(2);
  StageTimes timed;
  timed.broadcast_us = 5;
  timed.h2d_us = 10;
  timed.gemv_us = 200;
  timed.epilogue_us = 20;
  timed.gather_us = 7;
  timed.d2h_us = 3;
  StageTimes untimed;
  untimed.broadcast_us = 4;
  untimed.gather_us = 6;
  untimed.step_untimed = true;
  m.RecordBatch(5, 1, 250e-6, timed);
  m.RecordBatch(5, 1, 240e-6, untimed);
  const std::string text = m.Render();
  EXPECT_NE(text.find("drafthead_stage_seconds_count{stage=\"gemv\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("drafthead_stage_seconds_count{stage=\"d2h\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("drafthead_stage_seconds_count{stage=\"gather\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("drafthead_compute_seconds_count 2\n"), std::string::npos) << text;
  // Per batch: (5 + 10) + (4) input, (200 + 20 + 7) + (240 - 4) infer, 3 + 0 output.
  const InferenceStats after_batches = m.inference_stats();
  const ComputeStats& b = after_batches.batches.at(1);
  EXPECT_EQ(b.input.ns, 19'000u);
  EXPECT_EQ(b.infer.ns, 463'000u);
  EXPECT_EQ(b.output.ns, 3'000u);
  EXPECT_EQ(b.infer.count, 2u);
  // Per request, from the response's Timing: the same rule, plus its own validate / combine.
  RequestStages rs;
  rs.validate_us = 2;
  rs.combine_us = 1;
  rs.compute_us = 240;
  rs.batch = untimed;
  m.RecordInference(true, 1, 300'000, &rs);
  const InferenceStats after_request = m.inference_stats();
  const ComputeStats& c = after_request.compute;
  EXPECT_EQ(c.input.ns, 6'000u);
  EXPECT_EQ(c.infer.ns, 236'000u);
  EXPECT_EQ(c.output.ns, 1'000u);
}

// Records what it is offered; runs (completes) an item only when told to.
class FakeRunner : public InlineRunner {
 public:
  bool TryRunInline(BatchItem& item) override {
    ++offered;
    if (!run) return false;
    item.done(absl::OkStatus(), nullptr);
    return true;
  }
  bool run = true;
  int offered = 0;
};

// The inline offer: only for items that may run inline, only while nothing is queued, never with a
// queue delay; a refused offer queues the item as usual.
TEST(BatcherTest, OffersAnItemToTheInlineRunnerOnlyWhenNothingWaits) {
  Batcher b(BatcherOptions{});
  FakeRunner runner;
  b.SetInlineRunner(&runner);
  Probe p[5];
  BatchItem a = Item(1, &p[0]);
  ASSERT_TRUE(b.Submit(std::move(a)).ok());  // may_run_inline unset: queued, not offered
  EXPECT_EQ(runner.offered, 0);
  EXPECT_EQ(b.queued_requests(), 1u);
  BatchItem c = Item(1, &p[1]);
  c.may_run_inline = true;
  ASSERT_TRUE(b.Submit(std::move(c)).ok());  // something waits: queued behind it
  EXPECT_EQ(runner.offered, 0);
  EXPECT_EQ(b.Take(std::chrono::milliseconds(0)).size(), 2u);
  b.BatchStarted();
  BatchItem d = Item(1, &p[2]);
  d.may_run_inline = true;
  ASSERT_TRUE(b.Submit(std::move(d)).ok());  // nothing waits: run by the runner
  EXPECT_EQ(runner.offered, 1);
  EXPECT_EQ(p[2].calls, 1);
  EXPECT_EQ(b.queued_requests(), 0u);
  runner.run = false;  // the engine is busy: the runner declines and the item queues
  BatchItem e = Item(1, &p[3]);
  e.may_run_inline = true;
  ASSERT_TRUE(b.Submit(std::move(e)).ok());
  EXPECT_EQ(runner.offered, 2);
  EXPECT_EQ(p[3].calls, 0);
  EXPECT_EQ(b.queued_requests(), 1u);

  BatcherOptions delayed;
  delayed.max_queue_delay = std::chrono::microseconds(100);
  Batcher q(delayed);
  FakeRunner never;
  q.SetInlineRunner(&never);
  BatchItem f = Item(1, &p[4]);
  f.may_run_inline = true;
  ASSERT_TRUE(q.Submit(std::move(f)).ok());
  EXPECT_EQ(never.offered, 0) << "a queue delay asks for batches to fill";
  EXPECT_EQ(q.queued_requests(), 1u);
}

// The review's overtaking bug: between Take handing a batch to the engine thread and that thread
// taking the engine, the queue is empty and the engine free; a request arriving then must queue
// behind the batch in hand, not run inline ahead of it.
TEST(BatcherTest, NothingRunsInlineAheadOfABatchInHand) {
  Batcher b(BatcherOptions{});
  FakeRunner runner;
  b.SetInlineRunner(&runner);
  Probe p[3];
  ASSERT_TRUE(b.Submit(Item(1, &p[0], 1)).ok());
  const std::vector<BatchItem> in_hand = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(in_hand.size(), 1u);
  BatchItem late = Item(1, &p[1], 2);
  late.may_run_inline = true;
  ASSERT_TRUE(b.Submit(std::move(late)).ok());
  EXPECT_EQ(runner.offered, 0) << "offered inline while a taken batch had not started";
  EXPECT_EQ(p[1].calls, 0);
  EXPECT_EQ(b.queued_requests(), 1u);
  b.BatchStarted();
  const std::vector<BatchItem> next = b.Take(std::chrono::milliseconds(0));
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].req->request_id, 2u);
  b.BatchStarted();
  BatchItem after = Item(1, &p[2], 3);
  after.may_run_inline = true;
  ASSERT_TRUE(b.Submit(std::move(after)).ok());  // nothing queued or in hand: inline again
  EXPECT_EQ(runner.offered, 1);
  EXPECT_EQ(p[2].calls, 1);
  // An empty Take leaves nothing in hand.
  EXPECT_TRUE(b.Take(std::chrono::milliseconds(0)).empty());
  Probe q;
  BatchItem idle = Item(1, &q, 4);
  idle.may_run_inline = true;
  ASSERT_TRUE(b.Submit(std::move(idle)).ok());
  EXPECT_EQ(runner.offered, 2);
}

// TakeReady (the engine's next batch, taken while one computes) never waits and takes only a full
// batch (one taken early must not be smaller than at the usual time), with or without a batching
// window; what it takes is in hand like Take's.
TEST(BatcherTest, TakeReadyTakesOnlyAFullBatchAndHoldsItInHand) {
  for (auto delay : {std::chrono::milliseconds(0), std::chrono::milliseconds(500)}) {
    BatcherOptions o;
    o.max_rows = 4;
    o.max_queue_delay = delay;
    Batcher b(o);
    FakeRunner runner;
    b.SetInlineRunner(&runner);
    EXPECT_TRUE(b.TakeReady().empty());
    Probe p[4];
    ASSERT_TRUE(b.Submit(Item(3, &p[0], 1)).ok());
    const auto t0 = Clock::now();
    EXPECT_TRUE(b.TakeReady().empty()) << "3 of 4 rows were taken early";
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(100)) << "TakeReady waited";
    ASSERT_TRUE(b.Submit(Item(1, &p[1], 2)).ok());  // full: 4 rows
    const std::vector<BatchItem> got = b.TakeReady();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].req->request_id, 1u);
    EXPECT_EQ(got[1].req->request_id, 2u);
    BatchItem late = Item(1, &p[2], 3);
    late.may_run_inline = true;
    ASSERT_TRUE(b.Submit(std::move(late)).ok());
    EXPECT_EQ(runner.offered, 0) << "ran inline ahead of a batch TakeReady took";
    b.BatchStarted();
    EXPECT_EQ(b.queued_requests(), 1u);
  }
}

// Unary callers are their connections; over a Unix socket every connection's peer reads the same
// ("unix:" plus the path), so the clients' kCallerHeader tells them apart; without it a call counts
// as its connection's, as before.
TEST(BatcherTest, UnaryCallersOverOneSocketAreToldApartByTheirHeader) {
  using S = DraftHeadService;
  const std::string sock = "unix:/run/drafthead.sock";
  EXPECT_NE(S::UnaryCallerKey(sock, "a1-0").id, S::UnaryCallerKey(sock, "a1-1").id);
  EXPECT_NE(S::UnaryCallerKey(sock, "a1-0").id, S::UnaryCallerKey(sock, "b7-0").id);
  EXPECT_EQ(S::UnaryCallerKey(sock, "a1-0").id, S::UnaryCallerKey(sock, "a1-0").id);
  EXPECT_EQ(S::UnaryCallerKey(sock, "").id, S::UnaryCallerKey(sock, "").id);
  EXPECT_NE(S::UnaryCallerKey("ipv4:127.0.0.1:40001", "").id, S::UnaryCallerKey("ipv4:127.0.0.1:40002", "").id);
  EXPECT_NE(S::UnaryCallerKey("ipv4:127.0.0.1:40001", "x").id, S::UnaryCallerKey("ipv4:127.0.0.1:40002", "x").id);
  EXPECT_EQ(S::UnaryCallerKey(sock, "a1-0").cls, "unary");
  // Two such callers each get their own share of a batch.
  Batcher b(BatcherOptions{});
  Probe p[2];
  BatchItem x = Item(1, &p[0], 1), y = Item(1, &p[1], 2);
  x.caller = S::UnaryCallerKey(sock, "a1-0");
  y.caller = S::UnaryCallerKey(sock, "a1-1");
  ASSERT_TRUE(b.Submit(std::move(x)).ok());
  ASSERT_TRUE(b.Submit(std::move(y)).ok());
  EXPECT_EQ(b.depth_by_class().at("unary").callers, 2u);
}

// A finished batch's result over `gathered` (what BatchLoop hands the completer).
BatchRowsResult ResultOver(const PayloadLayout& layout, const uint8_t* gathered, size_t per_rank_bytes,
                           const ShardGeometry& geo, uint32_t batch_rows) {
  BatchRowsResult r;
  r.layout = &layout;
  r.gathered = gathered;
  r.per_rank_bytes = per_rank_bytes;
  r.geometry = &geo;
  r.batch_rows = batch_rows;
  return r;
}

// The completer answers from the engine's own payload (no copy), each request with its rows, in
// order, before Drain returns; an engine that writes its two payload buffers in turn (as RunBatch
// does) never overwrites one still being answered from, since Submit waits for the batch before.
TEST(CompleterTest, AnswersFromTheEnginesBuffersInTurnInOrderBeforeDrainReturns) {
  ShardGeometry geo = ShardGeometry::Make(2, 0, 64, 64, 64);  // tp = 2: two blocks
  PayloadLayout layout;
  layout.row_offset = {0, 16, 32, 48};
  std::vector<uint8_t> buffers[2] = {std::vector<uint8_t>(96), std::vector<uint8_t>(96)};
  auto pattern = [](int batch) {
    std::vector<uint8_t> p(96);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * (batch + 1));
    return p;
  };
  struct Seen {
    int batch = 0;
    uint32_t row0 = 0;
    const uint8_t* gathered = nullptr;
    std::vector<uint8_t> bytes;
  };
  std::vector<Seen> seen;  // written by the completer's thread only, read after Drain
  Completer c;
  const int batches = 6;
  for (int n = 0; n < batches; ++n) {
    std::vector<uint8_t>& buf = buffers[n % 2];
    const std::vector<uint8_t> p = pattern(n);
    std::copy(p.begin(), p.end(), buf.begin());  // the engine's batch n (after Submit of n - 1)
    const BatchRowsResult base = ResultOver(layout, buf.data(), 48, geo, 3);
    std::vector<BatchItem> items;
    for (uint32_t rows : {1u, 2u}) {
      auto r = std::make_shared<PreparedRequest>();
      r->rows = rows;
      BatchItem it;
      it.req = r;
      it.enqueued = Clock::now();
      it.done = [&seen, n](const absl::Status& s, const BatchRowsResult* res) {
        ASSERT_TRUE(s.ok());
        ASSERT_NE(res, nullptr);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // answering takes a while
        seen.push_back({n, res->row0, res->gathered, std::vector<uint8_t>(res->gathered, res->gathered + 96)});
      };
      items.push_back(std::move(it));
    }
    c.Submit(std::move(items), base, Clock::now());
  }
  c.Drain();
  EXPECT_FALSE(c.Busy());
  ASSERT_EQ(seen.size(), 2u * batches);
  for (size_t i = 0; i < seen.size(); ++i) {
    const int n = static_cast<int>(i / 2);
    EXPECT_EQ(seen[i].batch, n);
    EXPECT_EQ(seen[i].row0, i % 2 == 0 ? 0u : 1u);
    EXPECT_EQ(seen[i].gathered, buffers[n % 2].data()) << "answered from a copy";
    EXPECT_EQ(seen[i].bytes, pattern(n)) << "batch " << n << "'s payload was overwritten while answered";
  }
}

// Large answers (FULL_LOGITS, kParallelAnswerBytes in all) are answered by several threads, each
// caller's requests on one thread in batch order, every request with its own rows, all before
// Drain; small ones stay on the completer's one thread, in order, and so do FULL_LOGITS answers
// whose logits the backend already wrote to the callers' device memory.
TEST(CompleterTest, LargeAnswersSpreadOverThreadsEachCallerInOrder) {
  // One FULL bf16 row of this vocabulary is 2 MB of answer; the payload itself is never read here.
  const ShardGeometry geo = ShardGeometry::Make(1, 0, 64, 1 << 20, 1 << 20);
  PayloadLayout layout;
  std::vector<uint8_t> gathered(16);
  struct Seen {
    std::thread::id thread;
    uint64_t caller;
    size_t index;
    uint32_t row0;
  };
  absl::Mutex mu;
  std::vector<Seen> seen;
  uint8_t device_rows[1];  // never written: only whether a request names device memory matters
  auto batch = [&](RowMode mode, const std::vector<uint64_t>& callers, bool on_device = false) {
    std::vector<BatchItem> items;
    for (size_t i = 0; i < callers.size(); ++i) {
      auto r = std::make_shared<PreparedRequest>();
      r->rows = static_cast<uint32_t>(i % 3) + 1;
      r->task.mode = mode;
      r->task.dtype = OutDType::kBf16;
      r->task.k = mode == RowMode::kFullLogits ? 0 : 8;
      BatchItem it;
      it.req = r;
      it.caller = CallerKey{"stream", callers[i]};
      it.enqueued = Clock::now();
      if (on_device) it.device_logits = device_rows;
      it.done = [&, i, caller = callers[i]](const absl::Status& s, const BatchRowsResult* res) {
        ASSERT_TRUE(s.ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // answering takes a while
        absl::MutexLock l(&mu);
        seen.push_back({std::this_thread::get_id(), caller, i, res->row0});
      };
      items.push_back(std::move(it));
    }
    return items;
  };
  const std::vector<uint64_t> callers = {1, 2, 1, 3, 4, 2, 1, 5, 6, 3};
  auto check = [&](size_t want_threads_at_least, size_t want_threads_at_most) {
    absl::MutexLock l(&mu);
    ASSERT_EQ(seen.size(), callers.size());
    std::vector<uint32_t> row0(callers.size());
    for (size_t i = 1; i < callers.size(); ++i) row0[i] = row0[i - 1] + static_cast<uint32_t>((i - 1) % 3) + 1;
    std::map<uint64_t, std::pair<std::thread::id, size_t>> last;  // caller -> (thread, last index)
    std::set<std::thread::id> threads;
    for (const Seen& v : seen) {
      EXPECT_EQ(v.row0, row0[v.index]) << "request " << v.index;
      threads.insert(v.thread);
      auto it = last.find(v.caller);
      if (it != last.end()) {
        EXPECT_EQ(it->second.first, v.thread) << "caller " << v.caller << " answered on two threads";
        EXPECT_LT(it->second.second, v.index) << "caller " << v.caller << " answered out of order";
      }
      last[v.caller] = {v.thread, v.index};
    }
    EXPECT_GE(threads.size(), want_threads_at_least);
    EXPECT_LE(threads.size(), want_threads_at_most);
    seen.clear();
  };
  Completer c;
  c.Submit(batch(RowMode::kFullLogits, callers), ResultOver(layout, gathered.data(), 16, geo, 20), Clock::now());
  c.Drain();
  check(2, 1 + Completer::kAnswerHelpers);
  c.Submit(batch(RowMode::kTopK, callers), ResultOver(layout, gathered.data(), 16, geo, 20), Clock::now());
  c.Drain();
  check(1, 1);
  BatchRowsResult written = ResultOver(layout, gathered.data(), 16, geo, 20);
  written.logits_on_device = true;
  c.Submit(batch(RowMode::kFullLogits, callers, /*on_device=*/true), written, Clock::now());
  c.Drain();
  check(1, 1);
}

// The engine runs at most one batch ahead of the answers: while a batch is being answered, the
// next Submit blocks until it is (so two payload buffers in turn suffice; no answers queue behind
// others').
TEST(CompleterTest, ASubmitterWaitsWhileABatchIsBeingAnswered) {
  ShardGeometry geo = ShardGeometry::Make(1, 0, 64, 64, 64);
  PayloadLayout layout;
  layout.row_offset = {0, 16};
  std::vector<uint8_t> gathered(16);
  const BatchRowsResult base = ResultOver(layout, gathered.data(), 16, geo, 1);
  absl::Notification release;
  std::atomic<int> answered{0};
  auto batch = [&](bool block) {
    auto r = std::make_shared<PreparedRequest>();
    r->rows = 1;
    BatchItem it;
    it.req = r;
    it.done = [&, block](const absl::Status&, const BatchRowsResult*) {
      if (block) release.WaitForNotification();
      ++answered;
    };
    std::vector<BatchItem> items;
    items.push_back(std::move(it));
    return items;
  };
  Completer c;
  c.Submit(batch(true), base, Clock::now());  // being answered (blocked)
  std::atomic<bool> second_in{false};
  std::thread engine([&] {
    c.Submit(batch(false), base, Clock::now());
    second_in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second_in) << "a second batch was taken while one was being answered";
  release.Notify();
  engine.join();
  c.Drain();
  EXPECT_EQ(answered, 2);
}

}  // namespace
}  // namespace drafthead
