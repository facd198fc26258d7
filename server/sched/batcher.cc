#include "server/sched/batcher.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace drafthead {

void Batcher::SetInlineRunner(InlineRunner* runner) {
  absl::MutexLock l(&mu_);
  runner_ = opts_.max_queue_delay.count() == 0 ? runner : nullptr;
}

absl::Status Batcher::Submit(BatchItem item) {
  InlineRunner* runner = nullptr;
  {
    absl::MutexLock l(&mu_);
    if (item.may_run_inline && closed_.ok() && q_.empty()) runner = runner_;
  }
  if (runner != nullptr && runner->TryRunInline(item)) return absl::OkStatus();
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    if (!closed_.ok()) {
      refused = closed_;
    } else if (rows_ + item.req->rows > opts_.max_queue_rows) {
      ++dropped_.rejected;
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "queue full: ", rows_, " rows waiting, limit ", opts_.max_queue_rows, " (--max-queue-rows)"));
    } else {
      rows_ += item.req->rows;
      q_.push_back(std::move(item));
    }
  }
  if (!refused.ok()) {
    item.done(refused, nullptr);
    return refused;
  }
  return absl::OkStatus();
}

std::vector<BatchItem> Batcher::Take(std::chrono::milliseconds idle_wait) {
  std::vector<BatchItem> batch, drops;
  std::vector<absl::Status> drop_status;
  {
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &Batcher::HasWorkOrClosed),
                         absl::FromChrono(idle_wait));
    if (!q_.empty() && opts_.max_queue_delay.count() > 0) {
      // Let the batch fill until the oldest request has waited max_queue_delay.
      const auto until = q_.front().enqueued + opts_.max_queue_delay;
      mu_.AwaitWithTimeout(absl::Condition(this, &Batcher::BatchFullOrClosed),
                           absl::FromChrono(until - Clock::now()));
    }
    const auto now = Clock::now();
    uint32_t rows = 0;
    while (!q_.empty()) {
      BatchItem& it = q_.front();
      if (it.deadline <= now || (it.cancelled && it.cancelled())) {
        const bool expired = it.deadline <= now;
        expired ? ++dropped_.expired : ++dropped_.cancelled;
        drop_status.push_back(expired ? absl::DeadlineExceededError("deadline passed while queued")
                                      : absl::CancelledError("cancelled while queued"));
        rows_ -= it.req->rows;
        drops.push_back(std::move(it));
        q_.pop_front();
        continue;
      }
      if (rows + it.req->rows > opts_.max_rows) break;
      if (opts_.max_requests > 0 && batch.size() >= opts_.max_requests) break;
      rows += it.req->rows;
      rows_ -= it.req->rows;
      batch.push_back(std::move(it));
      q_.pop_front();
    }
  }
  for (size_t i = 0; i < drops.size(); ++i) drops[i].done(drop_status[i], nullptr);
  return batch;
}

bool Batcher::HasWorkOrClosed() const { return !q_.empty() || !closed_.ok(); }

bool Batcher::BatchFullOrClosed() const {
  return rows_ >= opts_.max_rows || !closed_.ok() ||
         (opts_.max_requests > 0 && q_.size() >= opts_.max_requests);
}

void Batcher::Close(const absl::Status& reason) {
  std::deque<BatchItem> q;
  {
    absl::MutexLock l(&mu_);
    if (closed_.ok()) closed_ = reason;
    q.swap(q_);
    rows_ = 0;
  }
  for (auto& it : q) it.done(reason, nullptr);
}

uint32_t Batcher::queued_rows() const {
  absl::MutexLock l(&mu_);
  return rows_;
}

size_t Batcher::queued_requests() const {
  absl::MutexLock l(&mu_);
  return q_.size();
}

Batcher::Dropped Batcher::dropped() const {
  absl::MutexLock l(&mu_);
  return dropped_;
}

}  // namespace drafthead
