#include "server/sched/batch_loop.h"

#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace drafthead {

BatchLoop::BatchLoop(RankEngine& engine, Batcher& batcher, Metrics* metrics,
                     std::function<void(const absl::Status&)> on_failure, bool take_ahead,
                     bool launch_ahead)
    : engine_(engine),
      batcher_(batcher),
      metrics_(metrics),
      on_failure_(std::move(on_failure)),
      take_ahead_(take_ahead),
      launch_ahead_(take_ahead && launch_ahead && engine.can_launch_next()) {}

void BatchLoop::Stop() { stopping_ = true; }

bool BatchLoop::TryRunInline(BatchItem& item) {
  if (stopping_.load() || item.deadline <= Clock::now()) return false;  // the queue drains / drops it
  if (!engine_mu_.TryLock()) return false;
  // A batch in hand (taken, maybe launched ahead) goes first: Submit saw none, but the loop may
  // have taken one since.
  if (!open_ || batcher_.batch_in_hand()) {
    engine_mu_.Unlock();
    return false;
  }
  inline_batch_.clear();
  inline_batch_.push_back(std::move(item));
  const uint16_t* x = Prepare(inline_batch_, ctl_[0]);
  if (absl::Status s = RunOne(inline_batch_, ctl_[0], x, nullptr); !s.ok()) Fail(s).IgnoreError();
  inline_batch_.clear();
  engine_mu_.Unlock();
  return true;
}

absl::Status BatchLoop::Fail(const absl::Status& cause) {
  const absl::Status fail = absl::UnavailableError(absl::StrCat("the rank group failed: ", cause.message()));
  Log(LogLevel::kError, "group_failed", "error", std::string(cause.message()));
  open_ = false;
  failed_ = fail;
  batcher_.Close(fail);
  if (on_failure_) on_failure_(fail);
  return fail;
}

void BatchLoop::FailInFlight(const absl::Status& status) {
  std::vector<std::function<void(const absl::Status&, const BatchRowsResult*)>> fail;
  {
    absl::MutexLock l(&inflight_mu_);
    if (inflight_ == nullptr) return;
    for (auto& it : *inflight_) fail.push_back(std::move(it.done));
    inflight_ = nullptr;
  }
  for (auto& f : fail) f(status, nullptr);
}

const uint16_t* BatchLoop::Prepare(const std::vector<BatchItem>& batch, BatchControl& ctl) {
  const int64_t K = engine_.geometry().hidden;
  uint32_t rows = 0;
  for (const auto& it : batch) rows += it.rows();
  ctl.rows = rows;
  ctl.device_outs = 0;
  const bool rows_out = engine_.writes_device_rows();
  // The rows go straight into the message the engine broadcasts (and the GEMV reads on rank 0).
  uint16_t* x = engine_.HiddenRowsFor(rows);
  uint32_t r = 0;
  for (const auto& it : batch) {
    const uint32_t n = it.rows();  // a split request's part: its rows from part_begin
    for (uint32_t i = 0; i < n; ++i) {
      ctl.tasks[r + i] = it.req->task;
      ctl.tasks[r + i].row_in_request = it.part_begin + i;
    }
    if (rows_out && it.device_logits != nullptr)  // never split (Batcher::MaySplitHead)
      ctl.device_out[ctl.device_outs++] = DeviceRowsOut{r, n, it.device_logits_pitch, it.device_logits};
    std::memcpy(x + static_cast<size_t>(r) * K, it.req->x.data() + static_cast<size_t>(it.part_begin) * K,
                static_cast<size_t>(n) * K * 2);
    r += n;
  }
  return x;
}

absl::Status BatchLoop::RunOne(std::vector<BatchItem>& batch, const BatchControl& ctl,
                               const uint16_t* x, Ahead* ahead) {
  const uint32_t rows = ctl.rows;
  {
    absl::MutexLock l(&inflight_mu_);
    inflight_ = &batch;
  }
  const auto t0 = Clock::now();
  if (metrics_)
    for (const auto& it : batch)
      metrics_->RecordCallerWait(it.caller.cls, std::chrono::duration<double>(t0 - it.enqueued).count());
  // While this batch is on the device, the next one (if one is ready) is taken and its rows
  // written, so that the device waits only for its launch.
  std::function<void()> take_ahead;
  if (ahead != nullptr && take_ahead_) {
    take_ahead = [this, ahead, &ctl] {
      engine_mu_.AssertHeld();  // called inside RunBatch, on this thread
      ahead->batch = batcher_.TakeReady();
      if (ahead->batch.empty()) return;
      BatchControl& other = &ctl == &ctl_[0] ? ctl_[1] : ctl_[0];
      ahead->ctl = &other;
      ahead->x = Prepare(ahead->batch, other);
      // Behind this batch on the device, so that it goes on without waiting for the host. A
      // failed launch launches nothing: the batch's own RunBatch launches it (or reports why not).
      const bool launched = launch_ahead_ && engine_.LaunchNext(other, ahead->x).ok();
      if (metrics_) metrics_->CountBatchTakenAhead(launched);
      ++taken_ahead_;
      if (launched) ++launched_ahead_;
    };
  }
  auto gathered = engine_.RunBatch(ctl, x, take_ahead);
  const auto t1 = Clock::now();
  bool claimed;
  {
    absl::MutexLock l(&inflight_mu_);
    claimed = inflight_ != nullptr;  // else FailInFlight answered the batch
    inflight_ = nullptr;
  }
  if (!gathered.ok()) {
    const absl::Status fail = absl::UnavailableError(
        absl::StrCat("the rank group failed: ", gathered.status().message()));
    if (claimed)
      for (auto& it : batch) it.done(fail, nullptr);
    return gathered.status();  // the cause: Fail words it for everyone else
  }
  if (!claimed) return absl::OkStatus();
  const double compute_s = std::chrono::duration<double>(t1 - t0).count();
  if (metrics_) metrics_->RecordBatch(rows, static_cast<uint32_t>(batch.size()), compute_s, gathered->stages);
  BatchRowsResult result;
  result.layout = gathered->layout;
  result.gathered = gathered->data;
  result.per_rank_bytes = gathered->per_rank_bytes;
  result.geometry = &engine_.geometry();
  result.batch_rows = rows;
  result.compute_us = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count());
  result.stages = gathered->stages;
  result.logits_on_device = ctl.device_outs > 0;  // each item's own: AnswerBatch
  // Pipelined under load: while requests wait, the completer answers this batch and the engine
  // goes on to the next at once. Alone (c = 1), answering here saves the hand-off.
  const bool more = (ahead != nullptr && !ahead->batch.empty()) || batcher_.queued_requests() > 0;
  if (completer_->Busy() || more) {
    completer_->Submit(std::move(batch), result, t0);
  } else {
    AnswerBatch(batch, result, t0);
  }
  return absl::OkStatus();
}

absl::Status BatchLoop::Run() {
  completer_ = std::make_unique<Completer>();
  // Every batch handed over is answered before Run returns (also on a group failure: those
  // batches finished), and no inline run outlives Run.
  struct OnExit {
    BatchLoop* loop;
    ~OnExit() {
      loop->batcher_.SetInlineRunner(nullptr);
      {
        absl::MutexLock l(&loop->engine_mu_);
        loop->open_ = false;
      }
      loop->completer_->Drain();
    }
  } on_exit{this};
  {
    absl::MutexLock l(&engine_mu_);
    open_ = true;
  }
  batcher_.SetInlineRunner(this);
  Ahead ahead;  // the next batch, taken and written while the last one ran
  for (;;) {
    const bool stopping = stopping_.load();
    // Idle for a heartbeat period: beat, so the workers know rank 0 is alive.
    const auto idle_wait = stopping ? std::chrono::milliseconds(0) : kHeartbeatPeriod;
    std::vector<BatchItem> batch;
    const BatchControl* ctl = nullptr;
    const uint16_t* x = nullptr;
    if (!ahead.batch.empty()) {
      batch = std::move(ahead.batch);
      ahead.batch.clear();
      ctl = ahead.ctl;
      x = ahead.x;
    } else {
      batch = batcher_.Take(idle_wait);
    }
    if (metrics_) {
      metrics_->SetQueueDepth(batcher_.queued_rows(),
                              static_cast<uint32_t>(batcher_.queued_requests()));
      std::map<std::string, std::pair<uint32_t, uint32_t>> by_class;
      for (const auto& [cls, d] : batcher_.depth_by_class()) by_class[cls] = {d.rows, d.callers};
      metrics_->SetCallerQueues(by_class);
    }
    absl::MutexLock l(&engine_mu_);
    // The batch holds the engine now: an inline run can no longer overtake it.
    batcher_.BatchStarted();
    if (!failed_.ok()) {  // an inline run failed the group (and closed the batcher)
      for (auto& it : batch) it.done(failed_, nullptr);
      return failed_;
    }
    absl::Status s;
    if (!batch.empty()) {
      if (x == nullptr) {
        ctl = &ctl_[0];
        x = Prepare(batch, ctl_[0]);
      }
      s = RunOne(batch, *ctl, x, &ahead);
    } else if (stopping && batcher_.queued_requests() == 0) {
      open_ = false;
      s = engine_.Shutdown();
      if (!s.ok()) Log(LogLevel::kWarn, "shutdown_broadcast_failed", "error", std::string(s.message()));
      return absl::OkStatus();
    } else {
      s = engine_.Heartbeat();
    }
    if (!s.ok()) {
      const absl::Status failed = Fail(s);
      for (auto& it : ahead.batch) it.done(failed, nullptr);  // taken, never to run
      return failed;
    }
  }
}

}  // namespace drafthead
