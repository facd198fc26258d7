#include "server/sched/batcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace drafthead {

bool ParseQueuePolicy(const std::string& text, QueuePolicy* out) {
  if (text == "fair") {
    *out = QueuePolicy::kFair;
  } else if (text == "fifo") {
    *out = QueuePolicy::kFifo;
  } else {
    return false;
  }
  return true;
}

const char* QueuePolicyName(QueuePolicy p) { return p == QueuePolicy::kFifo ? "fifo" : "fair"; }

void Batcher::SetInlineRunner(InlineRunner* runner) {
  absl::MutexLock l(&mu_);
  runner_ = opts_.max_queue_delay.count() == 0 ? runner : nullptr;
}

absl::Status Batcher::Submit(BatchItem item) {
  InlineRunner* runner = nullptr;
  {
    absl::MutexLock l(&mu_);
    if (item.may_run_inline && closed_.ok() && requests_ == 0 && !in_hand_) runner = runner_;
  }
  if (runner != nullptr && runner->TryRunInline(item)) return absl::OkStatus();
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    auto found = callers_.find(item.caller);
    const uint32_t caller_rows = found == callers_.end() ? 0 : found->second->rows;
    const uint32_t rows = item.req->rows;
    if (!closed_.ok()) {
      refused = closed_;
    } else if (rows_ + rows > opts_.max_queue_rows) {
      ++dropped_.rejected;
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "queue full: ", rows_, " rows waiting, limit ", opts_.max_queue_rows, " (--max-queue-rows)"));
    } else if (opts_.max_caller_queue_rows > 0 && caller_rows + rows > opts_.max_caller_queue_rows) {
      ++dropped_.rejected;
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "caller's queue full: ", caller_rows, " rows of this ", item.caller.cls, " caller waiting, limit ",
          opts_.max_caller_queue_rows, " (--max-caller-queue-rows)"));
    } else {
      if (found == callers_.end()) {
        auto c = std::make_unique<Caller>();
        c->key = item.caller;
        c->credit = opts_.max_rows;
        if (opts_.policy == QueuePolicy::kFair) fresh_.push_back(c.get());
        found = callers_.emplace(item.caller, std::move(c)).first;
      }
      Caller& c = *found->second;
      if (opts_.policy == QueuePolicy::kFifo) arrivals_.push_back(&c);
      c.rows += rows;
      rows_ += rows;
      ++requests_;
      c.items.push_back(std::move(item));
    }
  }
  if (!refused.ok()) {
    item.done(refused, nullptr);
    return refused;
  }
  return absl::OkStatus();
}

Batcher::Caller* Batcher::Next() {
  if (cut_ != nullptr) return cut_;
  if (!fresh_.empty()) return fresh_.front();
  if (!rounds_.empty()) return rounds_.front();
  return nullptr;
}

void Batcher::Retire(Caller* c) {
  if (opts_.policy == QueuePolicy::kFair) {
    std::deque<Caller*>& list = c->fresh ? fresh_ : rounds_;
    list.erase(std::find(list.begin(), list.end(), c));
  }
  if (cut_ == c) cut_ = nullptr;
  callers_.erase(c->key);
}

BatchItem Batcher::PopHead(Caller* c) {
  BatchItem it = std::move(c->items.front());
  c->items.pop_front();
  c->rows -= it.rows();
  rows_ -= it.rows();
  --requests_;
  return it;
}

bool Batcher::MaySplitHead(const Caller* c, uint32_t rows) const {
  const BatchItem& head = c->items.front();
  return opts_.split_requests && rows > 0 && head.rows() > rows && head.device_logits == nullptr;
}

BatchItem Batcher::SplitHead(Caller* c, uint32_t rows) {
  BatchItem& head = c->items.front();
  if (head.split == nullptr) head.split = std::make_shared<SplitRequest>(std::move(head.done), head.req->rows);
  BatchItem part;
  part.req = head.req;
  part.caller = head.caller;
  part.enqueued = head.enqueued;
  part.deadline = head.deadline;
  part.cancelled = head.cancelled;
  part.part_begin = head.part_begin;
  part.part_rows = rows;
  part.done = head.split->PartDone(part.part_begin, rows);
  const uint32_t rest = head.rows() - rows;
  head.part_begin += rows;
  head.part_rows = rest;
  head.done = head.split->PartDone(head.part_begin, rest);
  c->rows -= rows;
  rows_ -= rows;
  return part;
}

bool Batcher::DropHeadIfDead(Caller* c, Clock::time_point now, std::vector<BatchItem>& drops,
                             std::vector<absl::Status>& drop_status) {
  const BatchItem& head = c->items.front();
  const bool expired = head.deadline <= now;
  if (!expired && !(head.cancelled && head.cancelled())) return false;
  expired ? ++dropped_.expired : ++dropped_.cancelled;
  drop_status.push_back(expired ? absl::DeadlineExceededError("deadline passed while queued")
                                : absl::CancelledError("cancelled while queued"));
  drops.push_back(PopHead(c));
  return true;
}

std::vector<BatchItem> Batcher::Take(std::chrono::milliseconds idle_wait) {
  std::vector<BatchItem> batch, drops;
  std::vector<absl::Status> drop_status;
  {
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &Batcher::HasWorkOrClosed),
                         absl::FromChrono(idle_wait));
    if (requests_ > 0 && opts_.max_queue_delay.count() > 0) {
      // Let the batch fill until the oldest request has waited max_queue_delay.
      auto oldest = Clock::time_point::max();
      for (const auto& [key, c] : callers_) oldest = std::min(oldest, c->items.front().enqueued);
      mu_.AwaitWithTimeout(absl::Condition(this, &Batcher::BatchFullOrClosed),
                           absl::FromChrono(oldest + opts_.max_queue_delay - Clock::now()));
    }
    ++takes_;
    if (opts_.policy == QueuePolicy::kFifo) {
      TakeFifo(Clock::now(), batch, drops, drop_status);
    } else {
      TakeFair(Clock::now(), batch, drops, drop_status);
    }
    // Set with the dequeue, under one lock: a Submit that sees the queue empty also sees this.
    in_hand_ = !batch.empty();
  }
  for (size_t i = 0; i < drops.size(); ++i) drops[i].done(drop_status[i], nullptr);
  return batch;
}

void Batcher::TakeFair(Clock::time_point now, std::vector<BatchItem>& batch, std::vector<BatchItem>& drops,
                       std::vector<absl::Status>& drop_status) {
  const int64_t quantum = opts_.max_rows;
  uint32_t rows = 0;
  while (Caller* c = Next()) {
    if (!c->items.empty() && DropHeadIfDead(c, now, drops, drop_status)) continue;
    if (c->items.empty()) {
      Retire(c);
      continue;
    }
    const uint32_t head_rows = c->items.front().rows();
    if (c->credit <= 0) {  // its turn is over: to the back of the round, with the next turn's credit
      (c->fresh ? fresh_ : rounds_).pop_front();  // Next() gave the front (cut_ never has credit <= 0)
      c->fresh = false;
      c->credit += quantum;
      rounds_.push_back(c);
      continue;
    }
    const bool fits = rows + head_rows <= opts_.max_rows || batch.empty();
    const bool room = opts_.max_requests == 0 || batch.size() < opts_.max_requests;
    if (!fits && room && MaySplitHead(c, opts_.max_rows - rows)) {  // the batch ends full
      const uint32_t part = opts_.max_rows - rows;
      c->credit -= part;
      c->taken_in = takes_;
      batch.push_back(SplitHead(c, part));
      if (cut_ == c) cut_ = nullptr;
      break;
    }
    if (!fits || !room) {
      if (c->taken_in != takes_) cut_ = c;  // cut off with nothing in this batch: first in the next
      break;
    }
    rows += head_rows;
    c->credit -= head_rows;
    c->taken_in = takes_;
    batch.push_back(PopHead(c));
    if (cut_ == c) cut_ = nullptr;
    if (c->items.empty()) Retire(c);
  }
}

// The queue before issue 24: the oldest request first, whoever sent it; a batch ends at the first
// request that does not fit.
void Batcher::TakeFifo(Clock::time_point now, std::vector<BatchItem>& batch, std::vector<BatchItem>& drops,
                       std::vector<absl::Status>& drop_status) {
  uint32_t rows = 0;
  while (!arrivals_.empty()) {
    Caller* c = arrivals_.front();  // its head is the oldest request queued (FIFO per caller too)
    if (!DropHeadIfDead(c, now, drops, drop_status)) {
      const uint32_t head_rows = c->items.front().rows();
      if (opts_.max_requests > 0 && batch.size() >= opts_.max_requests) break;
      if (rows + head_rows > opts_.max_rows && !batch.empty()) {
        if (MaySplitHead(c, opts_.max_rows - rows)) batch.push_back(SplitHead(c, opts_.max_rows - rows));
        break;  // the rest, or the whole, stays first in arrivals_
      }
      rows += head_rows;
      batch.push_back(PopHead(c));
    }
    arrivals_.pop_front();
    if (c->items.empty()) Retire(c);
  }
}

std::vector<BatchItem> Batcher::TakeReady() {
  {
    absl::MutexLock l(&mu_);
    if (requests_ == 0 || !closed_.ok() || !BatchFullOrClosed()) return {};
  }
  // Only Submit and Close run meanwhile: the queue can only have grown (Take's batching window, if
  // any, then ends at once: the batch is full) or been closed (Take then finds it empty).
  return Take(std::chrono::milliseconds(0));
}

void Batcher::BatchStarted() {
  absl::MutexLock l(&mu_);
  in_hand_ = false;
}

bool Batcher::batch_in_hand() const {
  absl::MutexLock l(&mu_);
  return in_hand_;
}

bool Batcher::HasWorkOrClosed() const { return requests_ > 0 || !closed_.ok(); }

bool Batcher::BatchFullOrClosed() const {
  return rows_ >= opts_.max_rows || !closed_.ok() ||
         (opts_.max_requests > 0 && requests_ >= opts_.max_requests);
}

void Batcher::Close(const absl::Status& reason) {
  std::map<CallerKey, std::unique_ptr<Caller>> callers;
  {
    absl::MutexLock l(&mu_);
    if (closed_.ok()) closed_ = reason;
    callers.swap(callers_);
    fresh_.clear();
    rounds_.clear();
    arrivals_.clear();
    cut_ = nullptr;
    rows_ = 0;
    requests_ = 0;
  }
  for (auto& [key, c] : callers)
    for (auto& it : c->items) it.done(reason, nullptr);
}

uint32_t Batcher::queued_rows() const {
  absl::MutexLock l(&mu_);
  return rows_;
}

size_t Batcher::queued_requests() const {
  absl::MutexLock l(&mu_);
  return requests_;
}

std::map<std::string, Batcher::ClassDepth> Batcher::depth_by_class() const {
  absl::MutexLock l(&mu_);
  std::map<std::string, ClassDepth> out;
  for (const auto& [key, c] : callers_) {
    ClassDepth& d = out[key.cls];
    d.rows += c->rows;
    ++d.callers;
  }
  return out;
}

Batcher::Dropped Batcher::dropped() const {
  absl::MutexLock l(&mu_);
  return dropped_;
}

}  // namespace drafthead
