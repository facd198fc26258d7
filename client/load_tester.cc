// The load tester's engine: call reactors (unary, stream), the open- and closed-loop scheduler,
// per-thread statistics and their merge. One file (~640 lines) because the reactors, the scheduler
// and the merge all work on Run's private state; the wire scanner is apart (response_scan.cc).
#include "client/load_tester.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/kserve_wire.h"
#include "client/response_scan.h"
#include "common/caller_header.h"
#include "common/status_macros.h"

namespace drafthead::client {
namespace {

constexpr char kUnaryMethod[] = "/drafthead.v1.DraftHead/ComputeLogits";
constexpr char kStreamMethod[] = "/drafthead.v1.DraftHead/StreamLogits";
constexpr int kCodes = 17;              // gRPC status codes 0..16

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- per-thread statistics --------------------------------------------------------------------

struct ThreadStats {
  LogLinearHistogram latency{7}, queue{7}, compute{7}, overhead{7}, batch_rows{7};
  std::vector<LogLinearHistogram> stages = std::vector<LogLinearHistogram>(kTimingStages, LogLinearHistogram(7));
  std::array<uint64_t, kCodes> codes{};
  std::array<std::string, kCodes> examples;
  uint64_t ok = 0, rows = 0;
  int64_t last_done = 0;
  std::vector<SecondStats> timeline;
  std::vector<RequestRecord> records;
  std::vector<CallerStats> callers;  // by caller index; grows once per caller seen
};

// Owns every thread's stats of the current run. A thread registers (one lock) the first time it
// records in a run; a new run bumps the generation so stale thread_local pointers are ignored.
class StatsRegistry {
 public:
  static StatsRegistry& Get() {
    static StatsRegistry* r = new StatsRegistry();
    return *r;
  }
  uint64_t NewRun() {
    absl::MutexLock l(&mu_);
    all_.clear();
    return ++generation_;
  }
  ThreadStats* Local(uint64_t gen) {
    thread_local uint64_t my_gen = 0;
    thread_local ThreadStats* mine = nullptr;
    if (my_gen != gen) {
      absl::MutexLock l(&mu_);
      all_.push_back(std::make_unique<ThreadStats>());
      mine = all_.back().get();
      my_gen = gen;
    }
    return mine;
  }
  std::vector<std::unique_ptr<ThreadStats>> Take() {
    absl::MutexLock l(&mu_);
    return std::move(all_);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<ThreadStats>> all_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

class Run;

// One unary call slot, reused call after call (a ClientUnaryReactor may start a new call once
// OnDone has run: gRPC has released the previous call by then).
class UnaryCall final : public grpc::ClientUnaryReactor {
 public:
  UnaryCall(Run* run, size_t index) : run_(run), index_(index) {}
  void Start(int64_t scheduled_ns, uint64_t seq);
  void OnDone(const grpc::Status& s) override;

  UnaryCall* next_free = nullptr;  // the open loop's lock-free free list

 private:
  Run* const run_;
  const size_t index_;
  std::optional<grpc::ClientContext> ctx_;
  grpc::ByteBuffer response_;
  int64_t start_ns_ = 0;
  uint64_t seq_ = 0;
};

// One StreamLogits stream carrying many in-flight messages, answered in order, so the send times
// wait in a FIFO. A mutex per stream orders writes (gRPC allows one outstanding write per stream);
// statistics stay lock-free.
//
// An answer's reaction may decide the stream's next message while gRPC runs the next read's
// reaction on another thread (StartRead is issued before the answer is recorded), and either of
// them may be the one that sees the count reached and closes the stream. So a stream half-closes
// only once no reaction is in progress, and a closing stream still takes a message until then: a
// request counted as issued is always sent, or recorded as failed when the stream broke.
class StreamCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamCall(Run* run, size_t index) : run_(run), index_(index) {}
  // Prepares the call and its first read; Start() sends what was queued before it.
  void Open();
  void Start() { StartCall(); }
  // Queues one message scheduled at `scheduled_ns`; false if the stream is broken or half-closed.
  bool Enqueue(int64_t scheduled_ns, uint64_t seq);
  // No more messages: half-close once the queue has drained.
  void Close();
  void Cancel() { ctx_.TryCancel(); }
  size_t index() const { return index_; }  // its caller index
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

 private:
  struct Pending {
    int64_t scheduled_ns;
    uint64_t seq;
  };
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Run* const run_;
  const size_t index_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer read_buf_;
  absl::Mutex mu_;
  std::deque<Pending> awaiting_ ABSL_GUARDED_BY(mu_);  // sent or queued, not yet answered
  size_t unwritten_ ABSL_GUARDED_BY(mu_) = 0;          // tail of awaiting_ not yet written
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int reacting_ ABSL_GUARDED_BY(mu_) = 0;  // answers being recorded (they may enqueue the next)
};

class Run {
 public:
  Run(const LoadOptions& o, const std::vector<std::string>& requests, uint32_t rows)
      : o_(o), rows_(rows), gen_(StatsRegistry::Get().NewRun()) {
    for (const std::string& r : requests) {
      grpc::Slice s(r);
      pool_.emplace_back(&s, 1);
    }
  }

  absl::StatusOr<LoadResult> Execute();

  // Called by the calls.
  const grpc::ByteBuffer* RequestFor(uint64_t seq) const { return &pool_[seq % pool_.size()]; }
  grpc::GenericStub* Stub(size_t i) { return stubs_[i % stubs_.size()].get(); }
  // The caller (CallerStats index) of unary call slot `i`: its channel, as the server tells unary
  // callers apart by connection.
  size_t UnaryCaller(size_t i) const { return i % stubs_.size(); }
  // kCallerHeader's value for channel `i` (the server's caller where peers read alike: unix:).
  const std::string& CallerId(size_t i) const { return caller_ids_[i % caller_ids_.size()]; }
  std::chrono::system_clock::time_point UnaryDeadline() const {
    return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(o_.timeout);
  }
  bool IsStream() const { return o_.stream; }
  const char* UnaryMethod() const { return kserve() ? kKServeUnaryMethod : kUnaryMethod; }
  const char* StreamMethod() const { return kserve() ? kKServeStreamMethod : kStreamMethod; }
  // ScanAnswer for the protocol in use.
  int Scan(grpc::ByteBuffer* answer, bool stream, ScannedResponse* out, const std::string** msg) const {
    return kserve() ? ScanKServeAnswer(answer, stream, out, msg) : ScanAnswer(answer, out, msg);
  }
  std::optional<std::chrono::system_clock::time_point> StreamDeadline() const { return stream_deadline_; }

  // Decides whether a request scheduled at `t` is sent; counts measured requests.
  bool ShouldIssue(int64_t t) {
    if (stop_.load(std::memory_order_relaxed)) return false;
    if (t >= end_ns_) {
      stop_.store(true, std::memory_order_relaxed);
      return false;
    }
    if (t >= warm_end_ns_) {
      const int64_t n = measured_issued_.fetch_add(1, std::memory_order_relaxed);
      if (o_.requests > 0 && n >= o_.requests) {
        measured_issued_.fetch_sub(1, std::memory_order_relaxed);
        stop_.store(true, std::memory_order_relaxed);
        return false;
      }
    }
    return true;
  }
  uint64_t NextSeq() { return seq_.fetch_add(1, std::memory_order_relaxed); }

  // Records an answer as a message (the lane's, the client library's) or its failure.
  void RecordMessage(int64_t start_ns, int64_t done_ns, uint64_t seq, size_t caller,
                     const absl::StatusOr<v1::LogitsResponse>& r) {
    ScannedResponse sr;
    if (!r.ok()) {
      const std::string msg(r.status().message());
      Record(start_ns, done_ns, seq, caller, static_cast<int>(r.status().code()), sr, &msg);
      return;
    }
    const v1::Timing& t = r->timing();
    sr.rows = r->rows();
    sr.queue_us = t.queue_us();
    sr.compute_us = t.compute_us();
    sr.batch_rows = t.batch_rows();
    const uint32_t stages[kTimingStages] = {t.validate_us(), t.broadcast_us(), t.h2d_us(),
                                            t.gemv_us(), t.epilogue_us(), t.gather_us(),
                                            t.d2h_us(), t.combine_us(), t.server_us()};
    std::copy(stages, stages + kTimingStages, sr.stage_us);
    sr.step_untimed = t.step_untimed();
    Record(start_ns, done_ns, seq, caller, 0, sr, nullptr);
  }

  // Records one answer (or failure) of a request sent at `start_ns` by caller `caller` (CallerStats).
  void Record(int64_t start_ns, int64_t done_ns, uint64_t seq, size_t caller, int code, const ScannedResponse& r,
              const std::string* message) {
    completed_.fetch_add(1, std::memory_order_relaxed);
    if (code != 0) errors_.fetch_add(1, std::memory_order_relaxed);
    if (start_ns < warm_end_ns_) return;  // warmup: not measured
    ThreadStats* t = StatsRegistry::Get().Local(gen_);
    if (code < 0 || code >= kCodes) code = 2;  // UNKNOWN
    const int64_t lat = std::max<int64_t>(0, done_ns - start_ns);
    ++t->codes[code];
    if (code != 0 && t->examples[code].empty() && message) t->examples[code] = *message;
    if (caller >= t->callers.size()) t->callers.resize(caller + 1);
    CallerStats& cs = t->callers[caller];
    if (code == 0) {
      ++cs.ok;
      cs.latency.Record(static_cast<uint64_t>(lat));
    } else {
      ++cs.errors;
    }
    if (code == 0) {
      ++t->ok;
      const uint32_t rows = r.rows ? r.rows : rows_;  // a server that leaves `rows` unset
      t->rows += rows;
      t->latency.Record(static_cast<uint64_t>(lat));
      t->queue.Record(r.queue_us);
      t->compute.Record(r.compute_us);
      t->batch_rows.Record(r.batch_rows);
      for (int i = 0; i < kTimingStages; ++i)
        if (!(r.step_untimed && IsStepStage(i))) t->stages[i].Record(r.stage_us[i]);
      const int64_t server_ns = (int64_t{r.queue_us} + r.compute_us) * 1000;
      t->overhead.Record(static_cast<uint64_t>(std::max<int64_t>(0, lat - server_ns)));
    }
    t->last_done = std::max(t->last_done, done_ns);
    const size_t sec = static_cast<size_t>(std::max<int64_t>(0, done_ns - warm_end_ns_) / 1000000000);
    if (sec >= t->timeline.size()) t->timeline.resize(sec + 1);  // once a second
    SecondStats& s = t->timeline[sec];
    if (code == 0) {
      ++s.ok;
      s.rows += r.rows ? r.rows : rows_;
      s.latency.Record(static_cast<uint64_t>(lat));
    } else {
      ++s.errors;
    }
    if (o_.record_requests) {
      t->records.push_back({seq, start_ns - warm_end_ns_, lat, code, r.queue_us, r.compute_us, r.batch_rows});
    }
  }

  // Closed loop: a slot's call ended at `now`; start its next one or retire it.
  void UnaryDone(UnaryCall* c, int64_t now) {
    if (closed_loop_) {
      if (ShouldIssue(now)) {
        c->Start(now, NextSeq());
        return;
      }
    } else {
      // Open loop: back on the free list (Treiber push; the scheduler takes the whole list).
      UnaryCall* head = free_.load(std::memory_order_relaxed);
      do {
        c->next_free = head;
      } while (!free_.compare_exchange_weak(head, c, std::memory_order_release, std::memory_order_relaxed));
    }
    inflight_.fetch_sub(1, std::memory_order_acq_rel);
  }
  // A stream answered one message at `now`.
  void StreamMessageDone(StreamCall* s, int64_t now) {
    inflight_.fetch_sub(1, std::memory_order_acq_rel);
    if (!closed_loop_) return;
    if (ShouldIssue(now)) {
      inflight_.fetch_add(1, std::memory_order_acq_rel);
      const uint64_t seq = NextSeq();
      if (!s->Enqueue(now, seq)) {
        RecordBroken(now, seq, s->index());
        inflight_.fetch_sub(1, std::memory_order_acq_rel);
        s->Close();
      }
    } else {
      s->Close();
    }
  }
  // A request counted as issued that its stream could not take (broken): a failure, not a loss.
  void RecordBroken(int64_t scheduled_ns, uint64_t seq, size_t stream) {
    static const std::string kBroken = "stream broken";
    Record(scheduled_ns, NowNs(), seq, stream, static_cast<int>(grpc::StatusCode::UNAVAILABLE), ScannedResponse{},
           &kBroken);
  }
  void StreamLost(int64_t n) { inflight_.fetch_sub(n, std::memory_order_acq_rel); }
  void StreamEnded(bool failed) {
    if (failed) stream_failures_.fetch_add(1, std::memory_order_relaxed);
    streams_done_.fetch_add(1, std::memory_order_acq_rel);
  }

 private:
  void OpenLoop();
  absl::Status LaneLoop();
  absl::Status BlockingLoop();
  // The request pool as messages (the lane and the client library take LogitsRequests).
  absl::StatusOr<std::vector<v1::LogitsRequest>> PoolMessages() const;
  // Starts the measured clock of a loop that drives itself (LaneLoop, BlockingLoop).
  void StartClock();
  // Reports until the run stops and every call has returned (LaneLoop, BlockingLoop).
  void WaitWhileRunning();
  void WaitForQuiet();
  void Report(int64_t now);
  void StallGuard(int64_t now);
  LoadResult Merge();

  bool kserve() const { return o_.protocol == Protocol::kKServe; }

  const LoadOptions& o_;
  const uint32_t rows_;
  const uint64_t gen_;
  std::vector<grpc::ByteBuffer> pool_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::vector<std::string> caller_ids_;  // one per channel (stubs_)
  std::vector<std::unique_ptr<UnaryCall>> unary_;
  std::vector<std::unique_ptr<StreamCall>> streams_;
  std::optional<std::chrono::system_clock::time_point> stream_deadline_;
  bool closed_loop_ = true;
  size_t callers_ = 0;  // callers the run opened (LoadResult::callers)
  const char* caller_kind_ = "channel";
  int64_t t0_ = 0, warm_end_ns_ = 0, end_ns_ = INT64_MAX;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> measured_issued_{0};
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> inflight_{0};
  std::atomic<uint64_t> completed_{0}, errors_{0};
  std::atomic<int64_t> stream_failures_{0};
  std::atomic<int> streams_done_{0};
  std::atomic<UnaryCall*> free_{nullptr};
  LogLinearHistogram send_lag_{7};
  int64_t last_report_ = 0;
  uint64_t stall_seen_ = 0;     // completions at the last progress, for StallGuard
  int64_t stall_since_ = 0;
  bool streams_cancelled_ = false;
};

void UnaryCall::Start(int64_t scheduled_ns, uint64_t seq) {
  start_ns_ = scheduled_ns;
  seq_ = seq;
  ctx_.emplace();
  ctx_->set_deadline(run_->UnaryDeadline());
  ctx_->AddMetadata(kCallerHeader, run_->CallerId(index_));
  response_.Clear();
  run_->Stub(index_)->PrepareUnaryCall(&*ctx_, run_->UnaryMethod(), grpc::StubOptions(), run_->RequestFor(seq), &response_,
                                       this);
  StartCall();
}

void UnaryCall::OnDone(const grpc::Status& s) {
  const int64_t now = NowNs();
  ScannedResponse r;
  int code = static_cast<int>(s.error_code());
  const std::string status_message = s.ok() ? std::string() : s.error_message();
  const std::string* msg = &status_message;
  if (s.ok()) code = run_->Scan(&response_, false, &r, &msg);
  run_->Record(start_ns_, now, seq_, run_->UnaryCaller(index_), code, r, msg);
  run_->UnaryDone(this, now);
}

void StreamCall::Open() {
  if (auto d = run_->StreamDeadline()) ctx_.set_deadline(*d);
  run_->Stub(index_)->PrepareBidiStreamingCall(&ctx_, run_->StreamMethod(), grpc::StubOptions(), this);
  AddHold();  // writes come from outside reactions (scheduler, other streams): keep OnDone away
  StartRead(&read_buf_);
}

bool StreamCall::Enqueue(int64_t scheduled_ns, uint64_t seq) {
  absl::MutexLock l(&mu_);
  if (released_ || broken_) return false;
  awaiting_.push_back({scheduled_ns, seq});
  ++unwritten_;
  if (!writing_) WriteNextLocked();
  return true;
}

void StreamCall::WriteNextLocked() {
  const Pending& p = awaiting_[awaiting_.size() - unwritten_];
  --unwritten_;
  writing_ = true;
  ++written_;
  StartWrite(run_->RequestFor(p.seq));
}

void StreamCall::Close() {
  absl::MutexLock l(&mu_);
  closing_ = true;
  MaybeFinishLocked();
}

void StreamCall::MaybeFinishLocked() {
  if (released_ || writing_ || reacting_ > 0) return;
  if (broken_ || (closing_ && awaiting_.empty())) {
    released_ = true;
    if (!broken_) StartWritesDone();
    RemoveHold();
  }
}

void StreamCall::OnWriteDone(bool ok) {
  absl::MutexLock l(&mu_);
  writing_ = false;
  if (!ok) broken_ = true;
  if (!broken_ && unwritten_ > 0) {
    WriteNextLocked();
    return;
  }
  MaybeFinishLocked();
}

void StreamCall::OnReadDone(bool ok) {
  const int64_t now = NowNs();
  if (!ok) {
    absl::MutexLock l(&mu_);
    broken_ = true;
    MaybeFinishLocked();
    return;
  }
  ScannedResponse r;
  const std::string* msg = nullptr;
  const int code = run_->Scan(&read_buf_, true, &r, &msg);
  Pending p{0, 0};
  bool matched = false;
  {
    absl::MutexLock l(&mu_);
    if (awaiting_.size() > unwritten_) {
      p = awaiting_.front();
      awaiting_.pop_front();
      matched = true;
      ++reacting_;
    }
  }
  StartRead(&read_buf_);
  if (!matched) return;  // an answer to nothing we sent: ignore (the server broke ordering)
  run_->Record(p.scheduled_ns, now, p.seq, index_, code, r, msg);
  run_->StreamMessageDone(this, now);
  // The stream was closed (by this reaction, another one, or the open-loop scheduler) while
  // answers were outstanding: the last reaction half-closes it.
  absl::MutexLock l(&mu_);
  --reacting_;
  MaybeFinishLocked();
}

void StreamCall::OnDone(const grpc::Status& s) {
  const int64_t now = NowNs();
  std::deque<Pending> lost;
  {
    absl::MutexLock l(&mu_);
    lost.swap(awaiting_);
    unwritten_ = 0;
    broken_ = true;
  }
  const int code = s.ok() ? static_cast<int>(grpc::StatusCode::UNAVAILABLE) : static_cast<int>(s.error_code());
  static const std::string kEnded = "stream ended before answering";
  const std::string message = s.ok() ? kEnded : s.error_message();
  for (const Pending& p : lost) run_->Record(p.scheduled_ns, now, p.seq, index_, code, ScannedResponse{}, &message);
  run_->StreamLost(static_cast<int64_t>(lost.size()));
  run_->StreamEnded(!s.ok());
}

void Run::Report(int64_t now) {
  if (!o_.progress || now - last_report_ < 200000000) return;
  last_report_ = now;
  LoadProgress p;
  p.elapsed_s = static_cast<double>(now - t0_) * 1e-9;
  p.warming_up = now < warm_end_ns_;
  p.completed = completed_.load(std::memory_order_relaxed);
  p.errors = errors_.load(std::memory_order_relaxed);
  p.inflight = inflight_.load(std::memory_order_relaxed);
  o_.progress(p);
}

void Run::OpenLoop() {
  std::mt19937_64 rng(o_.arrival_seed);
  std::exponential_distribution<double> exp_gap(o_.rps);
  const double gap_ns = 1e9 / o_.rps;
  double next = static_cast<double>(t0_);
  UnaryCall* local_free = nullptr;
  size_t next_stream = 0;
  for (uint64_t i = 0;; ++i) {
    const int64_t sched = static_cast<int64_t>(next);
    if (!ShouldIssue(sched)) break;
    // Wait for the scheduled time: sleep while far, yield when close (a busy spin would take a
    // core from gRPC on small machines). Late sends are not skipped: they go out at once and their
    // lateness counts in their latency.
    for (int64_t now = NowNs(); now < sched; now = NowNs()) {
      Report(now);
      const int64_t left = sched - now;
      if (left > 200000) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(left - 100000, 100000000)));
      } else {
        std::this_thread::yield();
      }
    }
    // Safety valve: at max_inflight, wait (latency keeps counting from `sched`).
    while (inflight_.load(std::memory_order_acquire) >= o_.max_inflight) {
      Report(NowNs());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    const uint64_t seq = NextSeq();
    inflight_.fetch_add(1, std::memory_order_acq_rel);
    if (o_.stream) {
      StreamCall* s = streams_[next_stream++ % streams_.size()].get();
      if (!s->Enqueue(sched, seq)) {
        RecordBroken(sched, seq, s->index());
        inflight_.fetch_sub(1, std::memory_order_acq_rel);
      }
    } else {
      if (!local_free) local_free = free_.exchange(nullptr, std::memory_order_acquire);
      UnaryCall* c = local_free;
      if (c) {
        local_free = c->next_free;
      } else {
        unary_.push_back(std::make_unique<UnaryCall>(this, unary_.size()));  // grows to the peak in flight
        c = unary_.back().get();
      }
      c->Start(sched, seq);
    }
    const int64_t sent = NowNs();
    if (sched >= warm_end_ns_) send_lag_.Record(static_cast<uint64_t>(std::max<int64_t>(0, sent - sched)));
    Report(sent);
    next += (o_.arrival == Arrival::kPoisson) ? exp_gap(rng) * 1e9 : gap_ns;
  }
  for (auto& s : streams_) s->Close();
}

// Unary calls end by their deadline; a stream has none when the run is bounded by count only, so a
// server that stops answering would hang the run: after --timeout without a single answer while
// messages are in flight, the streams are cancelled (their messages count as CANCELLED).
void Run::StallGuard(int64_t now) {
  if (streams_.empty() || streams_cancelled_) return;
  const uint64_t c = completed_.load(std::memory_order_relaxed);
  if (c != stall_seen_ || inflight_.load(std::memory_order_relaxed) == 0) {
    stall_seen_ = c;
    stall_since_ = now;
    return;
  }
  if (now - stall_since_ > absl::ToInt64Nanoseconds(o_.timeout)) {
    streams_cancelled_ = true;
    stop_.store(true);
    for (auto& st : streams_) st->Cancel();
  }
}

void Run::WaitForQuiet() {
  for (;;) {
    const bool calls_done = inflight_.load(std::memory_order_acquire) == 0;
    const bool streams_done = streams_done_.load(std::memory_order_acquire) == static_cast<int>(streams_.size());
    if (calls_done && streams_done) return;
    Report(NowNs());
    StallGuard(NowNs());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

absl::StatusOr<LoadResult> Run::Execute() {
  if (pool_.empty()) return absl::InvalidArgumentError("no requests to send");
  if (o_.connections < 0) return absl::InvalidArgumentError("--connections must be >= 0 (0: one per caller)");
  if (o_.rps < 0 || !std::isfinite(o_.rps)) return absl::InvalidArgumentError("--rps must be >= 0");
  if (o_.rps == 0 && o_.concurrency < 1) return absl::InvalidArgumentError("--concurrency must be >= 1");
  if (o_.duration == absl::InfiniteDuration() && o_.requests <= 0) {
    return absl::InvalidArgumentError("give a duration or a request count: the run must end");
  }
  if (o_.duration <= absl::ZeroDuration()) return absl::InvalidArgumentError("--duration must be > 0");
  if (o_.max_inflight < 1) return absl::InvalidArgumentError("--max-inflight must be >= 1");
  closed_loop_ = o_.rps == 0;
  if (o_.lane || o_.blocking) {
    if (!closed_loop_ || o_.stream || kserve() || (o_.lane && o_.blocking))
      return absl::InvalidArgumentError(absl::StrCat(
          o_.lane ? "--lane=shm" : "--client-api=blocking",
          " drives a closed loop of native unary calls (no --rps, --stream, --protocol=kserve",
          o_.lane && o_.blocking ? ", and not both" : "", ")"));
    if (o_.lane) {
      callers_ = 1;  // one lane, whatever the concurrency: one caller to the server
      caller_kind_ = "lane";
      DH_RETURN_IF_ERROR(LaneLoop());
    } else {
      callers_ = static_cast<size_t>(o_.concurrency);  // a connection each
      DH_RETURN_IF_ERROR(BlockingLoop());
    }
    return Merge();
  }
  // One channel per caller unless told: closed loop, each in-flight slot its own connection (unary)
  // or its own stream on its own connection, so that c workers are c callers to the server.
  const int connections = o_.connections > 0 ? o_.connections : (closed_loop_ ? o_.concurrency : 1);
  const int streams = o_.streams > 0 ? o_.streams : connections;
  if (o_.stream) {
    caller_kind_ = "stream";
    callers_ = static_cast<size_t>(closed_loop_ ? std::min(streams, o_.concurrency) : streams);
  } else {
    callers_ = static_cast<size_t>(closed_loop_ ? std::min(connections, o_.concurrency) : connections);
  }
  caller_ids_ = NewCallerIds(static_cast<size_t>(connections));
  for (int i = 0; i < connections; ++i) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = MakeChannel(o_.target, o_.client, i);
    if (!ch.ok()) return ch.status();
    channels_.push_back(*ch);
    stubs_.push_back(std::make_unique<grpc::GenericStub>(*ch));
  }
  // Connect every channel before the clock starts: connection set-up is not the server's latency.
  for (auto& ch : channels_) {
    if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", o_.target, " within 10 s"));
    }
  }
  t0_ = NowNs();
  last_report_ = t0_;
  stall_since_ = t0_;
  warm_end_ns_ = t0_ + absl::ToInt64Nanoseconds(o_.warmup);
  if (o_.duration != absl::InfiniteDuration()) end_ns_ = warm_end_ns_ + absl::ToInt64Nanoseconds(o_.duration);
  if (end_ns_ != INT64_MAX) {
    stream_deadline_ = std::chrono::system_clock::now() + std::chrono::nanoseconds(end_ns_ - t0_) +
                       absl::ToChronoNanoseconds(o_.timeout);
  }
  if (o_.stream) {
    for (int i = 0; i < streams; ++i) streams_.push_back(std::make_unique<StreamCall>(this, static_cast<size_t>(i)));
    for (auto& s : streams_) s->Open();
  }
  if (closed_loop_) {
    if (o_.stream) {
      // Spread the in-flight messages over the streams, queued before the calls start so no answer
      // can race the first sends; each answer then sends the next on its stream.
      for (int i = 0; i < o_.concurrency; ++i) {
        const int64_t now = NowNs();
        if (!ShouldIssue(now)) break;
        inflight_.fetch_add(1, std::memory_order_acq_rel);
        const uint64_t seq = NextSeq();
        if (!streams_[i % streams_.size()]->Enqueue(now, seq)) {
          RecordBroken(now, seq, i % streams_.size());
          inflight_.fetch_sub(1, std::memory_order_acq_rel);
        }
      }
      for (auto& s : streams_) s->Start();
      // Streams that got nothing (concurrency < streams) close at once.
      for (size_t i = static_cast<size_t>(o_.concurrency); i < streams_.size(); ++i) streams_[i]->Close();
      if (stop_.load()) {
        for (auto& s : streams_) s->Close();
      }
    } else {
      for (int i = 0; i < o_.concurrency; ++i) unary_.push_back(std::make_unique<UnaryCall>(this, static_cast<size_t>(i)));
      for (auto& c : unary_) {
        const int64_t now = NowNs();
        if (!ShouldIssue(now)) break;
        inflight_.fetch_add(1, std::memory_order_acq_rel);
        c->Start(now, NextSeq());
      }
    }
    // The calls drive themselves; wait for the stop condition and the drain.
    while (!stop_.load(std::memory_order_relaxed)) {
      const int64_t now = NowNs();
      if (now >= end_ns_) stop_.store(true);
      Report(now);
      StallGuard(now);
      if (inflight_.load() == 0) break;  // every slot retired (count reached)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } else {
    for (auto& s : streams_) s->Start();
    OpenLoop();
  }
  WaitForQuiet();
  return Merge();
}

// The lane: one client, one lane of depth `concurrency`. A lane call is synchronous for its
// caller (spin, then sleep), so the in-flight calls are spread over a few threads (at most
// kLaneThreads, each keeping its share in flight with LaneClient::Start / Finish) rather than one
// spinning thread per call.
absl::Status Run::LaneLoop() {
  constexpr int kLaneThreads = 4;
  ClientOptions co = o_.client;
  co.lane = LaneMode::kRequired;
  co.lane_options.depth = static_cast<uint32_t>(o_.concurrency);
  co.lane_options.spin_ns = o_.lane_spin_ns;
  co.retry.max_attempts = 1;
  DH_ASSIGN_OR_RETURN(std::unique_ptr<DraftHeadClient> client, DraftHeadClient::Connect(o_.target, co));
  DH_ASSIGN_OR_RETURN(std::shared_ptr<LaneClient> lane, client->Lane());
  DH_ASSIGN_OR_RETURN(const std::vector<v1::LogitsRequest> pool, PoolMessages());
  StartClock();
  const int threads_n = std::min(o_.concurrency, kLaneThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    const int window = o_.concurrency / threads_n + (t < o_.concurrency % threads_n ? 1 : 0);
    threads.emplace_back([&, window] {
      struct InFlight {
        LaneClient::Pending call;
        int64_t start;
        uint64_t seq;
      };
      std::deque<InFlight> inflight;
      // A call counted as issued whose slot was not free yet (slot n % depth still holds the call
      // depth before, maybe another thread's): this thread finishes its own oldest call first
      // instead of blocking on the slot while holding calls of its own (which could deadlock).
      std::optional<std::pair<int64_t, uint64_t>> deferred;
      auto try_start = [&](int64_t start, uint64_t seq) {
        const absl::Time until = inflight.empty() ? absl::Now() + o_.timeout : absl::Now();
        absl::StatusOr<LaneClient::Pending> call = lane->Start(pool[seq % pool.size()], until);
        if (call.ok()) {
          inflight.push_back({*call, start, seq});
          return;
        }
        if (call.status().code() == absl::StatusCode::kResourceExhausted && !inflight.empty()) {
          deferred.emplace(start, seq);
          return;
        }
        const std::string msg(call.status().message());
        Record(start, NowNs(), seq, 0, static_cast<int>(call.status().code()), ScannedResponse{}, &msg);
        inflight_.fetch_sub(1, std::memory_order_acq_rel);
      };
      auto start_one = [&]() -> bool {
        const int64_t start = NowNs();
        if (!ShouldIssue(start)) return false;
        inflight_.fetch_add(1, std::memory_order_acq_rel);
        try_start(start, NextSeq());
        return true;
      };
      // Keeps `window` calls issued (in flight, or one deferred): after a deferred call starts,
      // the window is filled again (once only the deferred one took a finished call's place, and
      // each deferral cost the window a call for good: 64 callers ran ~17 calls in flight).
      auto fill = [&] {
        while (!deferred && static_cast<int>(inflight.size()) < window && start_one()) {
        }
      };
      fill();
      while (!inflight.empty()) {
        const InFlight f = inflight.front();
        inflight.pop_front();
        absl::StatusOr<v1::LogitsResponse> r = lane->Finish(f.call, absl::Now() + o_.timeout, /*copy_logits=*/false);
        RecordMessage(f.start, NowNs(), f.seq, 0, r);
        inflight_.fetch_sub(1, std::memory_order_acq_rel);
        if (deferred) {
          const auto [start, seq] = *deferred;
          deferred.reset();
          try_start(start, seq);
        }
        fill();
      }
    });
  }
  WaitWhileRunning();
  for (std::thread& t : threads) t.join();
  return absl::OkStatus();
}

// Blocking calls: `concurrency` threads, each with a client (one connection) of its own, calling
// DraftHeadClient::Compute back to back; thread i is caller i.
absl::Status Run::BlockingLoop() {
  ClientOptions co = o_.client;
  co.lane = LaneMode::kOff;
  co.channels = 1;
  co.retry.max_attempts = 1;  // every failure counts, as in the other loops
  std::vector<std::unique_ptr<DraftHeadClient>> clients;
  for (int i = 0; i < o_.concurrency; ++i) {
    DH_ASSIGN_OR_RETURN(std::unique_ptr<DraftHeadClient> c, DraftHeadClient::Connect(o_.target, co));
    // Connected before the clock starts: connection set-up is not the server's latency.
    if (!c->channel(0)->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
      return absl::UnavailableError(absl::StrCat("cannot connect to ", o_.target, " within 10 s"));
    clients.push_back(std::move(c));
  }
  DH_ASSIGN_OR_RETURN(const std::vector<v1::LogitsRequest> pool, PoolMessages());
  StartClock();
  std::vector<std::thread> threads;
  for (int i = 0; i < o_.concurrency; ++i) {
    threads.emplace_back([&, i] {
      for (;;) {
        const int64_t start = NowNs();
        if (!ShouldIssue(start)) return;
        inflight_.fetch_add(1, std::memory_order_acq_rel);
        const uint64_t seq = NextSeq();
        absl::StatusOr<v1::LogitsResponse> r = clients[i]->Compute(pool[seq % pool.size()], o_.timeout);
        RecordMessage(start, NowNs(), seq, static_cast<size_t>(i), r);
        inflight_.fetch_sub(1, std::memory_order_acq_rel);
      }
    });
  }
  WaitWhileRunning();
  for (std::thread& t : threads) t.join();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::LogitsRequest>> Run::PoolMessages() const {
  std::vector<v1::LogitsRequest> pool(pool_.size());
  for (size_t i = 0; i < pool_.size(); ++i) {
    std::vector<grpc::Slice> slices;
    pool_[i].Dump(&slices).IgnoreError();
    std::string bytes;
    for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    if (!pool[i].ParseFromString(bytes)) return absl::InvalidArgumentError("a request of the pool does not parse");
  }
  return pool;
}

void Run::StartClock() {
  t0_ = NowNs();
  last_report_ = t0_;
  warm_end_ns_ = t0_ + absl::ToInt64Nanoseconds(o_.warmup);
  if (o_.duration != absl::InfiniteDuration()) end_ns_ = warm_end_ns_ + absl::ToInt64Nanoseconds(o_.duration);
}

void Run::WaitWhileRunning() {
  while (!stop_.load(std::memory_order_relaxed)) {
    const int64_t now = NowNs();
    if (now >= end_ns_) stop_.store(true);
    Report(now);
    if (inflight_.load() == 0 && stop_.load()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

LoadResult Run::Merge() {
  LoadResult r;
  r.concurrency = closed_loop_ ? o_.concurrency : 0;
  r.rps_target = o_.rps;
  r.issued = static_cast<uint64_t>(measured_issued_.load());
  r.stream_failures = stream_failures_.load();
  r.send_lag = send_lag_;
  int64_t last_done = warm_end_ns_;
  std::array<uint64_t, kCodes> codes{};
  for (auto& t : StatsRegistry::Get().Take()) {
    r.latency.Merge(t->latency);
    r.queue_us.Merge(t->queue);
    r.compute_us.Merge(t->compute);
    r.overhead.Merge(t->overhead);
    r.batch_rows.Merge(t->batch_rows);
    for (int i = 0; i < kTimingStages; ++i) r.stage_us[i].Merge(t->stages[i]);
    for (int c = 0; c < kCodes; ++c) {
      codes[c] += t->codes[c];
      if (c != 0 && !t->examples[c].empty() && !r.error_examples.count(c)) r.error_examples[c] = t->examples[c];
    }
    r.ok += t->ok;
    r.rows += t->rows;
    last_done = std::max(last_done, t->last_done);
    if (t->timeline.size() > r.timeline.size()) r.timeline.resize(t->timeline.size());
    for (size_t s = 0; s < t->timeline.size(); ++s) {
      r.timeline[s].ok += t->timeline[s].ok;
      r.timeline[s].errors += t->timeline[s].errors;
      r.timeline[s].rows += t->timeline[s].rows;
      r.timeline[s].latency.Merge(t->timeline[s].latency);
    }
    r.records.insert(r.records.end(), t->records.begin(), t->records.end());
    if (t->callers.size() > r.callers.size()) r.callers.resize(t->callers.size());
    for (size_t i = 0; i < t->callers.size(); ++i) {
      r.callers[i].ok += t->callers[i].ok;
      r.callers[i].errors += t->callers[i].errors;
      r.callers[i].latency.Merge(t->callers[i].latency);
    }
  }
  if (r.callers.size() < callers_) r.callers.resize(callers_);  // callers never answered count too
  r.caller_kind = caller_kind_;
  for (int c = 1; c < kCodes; ++c) {
    if (codes[c]) {
      r.errors_by_code[c] = codes[c];
      r.errors += codes[c];
    }
  }
  std::sort(r.records.begin(), r.records.end(), [](const RequestRecord& a, const RequestRecord& b) { return a.seq < b.seq; });
  r.elapsed_s = std::max(1e-9, static_cast<double>(last_done - warm_end_ns_) * 1e-9);
  r.requests_per_s = static_cast<double>(r.ok + r.errors) / r.elapsed_s;
  r.ok_per_s = static_cast<double>(r.ok) / r.elapsed_s;
  r.rows_per_s = static_cast<double>(r.rows) / r.elapsed_s;
  return r;
}

}  // namespace

absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const std::vector<std::string>& requests,
                                   uint32_t rows_per_request) {
  Run run(options, requests, rows_per_request);
  return run.Execute();
}

}  // namespace drafthead::client
