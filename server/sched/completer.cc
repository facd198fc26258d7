#include "server/sched/completer.h"

#include <algorithm>
#include <map>

namespace drafthead {
namespace {

void AnswerOne(BatchItem& it, BatchRowsResult result, uint32_t row0, Clock::time_point started) {
  result.row0 = row0;
  result.logits_on_device = result.logits_on_device && it.device_logits != nullptr;  // the batch's, then its own
  result.queue_us = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(started - it.enqueued).count());
  it.done(absl::OkStatus(), &result);
}

}  // namespace

void AnswerBatch(std::vector<BatchItem>& items, BatchRowsResult result, Clock::time_point started) {
  uint32_t row0 = result.row0;
  for (auto& it : items) {
    AnswerOne(it, result, row0, started);
    row0 += it.rows();
  }
}

size_t AnswerBytes(const BatchItem& it, const BatchRowsResult& result) {
  const RowTask& t = it.req->task;
  const size_t rows = it.rows();
  if (t.mode != RowMode::kFullLogits) return rows * (static_cast<size_t>(t.k) * 8 + 8);
  if (result.logits_on_device && it.device_logits != nullptr) return rows;  // already in place
  return rows * static_cast<size_t>(result.geometry->vocab_size) * OutDTypeBytes(t.dtype);
}

Completer::Completer() {
  for (int i = 0; i < kAnswerHelpers; ++i) helpers_.emplace_back([this] { HelperLoop(); });
  thread_ = std::thread([this] { Loop(); });
}

Completer::~Completer() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();  // Loop answers every job before it sees stop_
  {
    absl::MutexLock l(&helper_mu_);
    helpers_stop_ = true;
  }
  for (auto& h : helpers_) h.join();
}

void Completer::HelperLoop() {
  for (;;) {
    std::function<void()> share;
    {
      absl::MutexLock l(&helper_mu_);
      helper_mu_.Await(absl::Condition(this, &Completer::HelperHasWorkOrStop));
      if (shares_.empty()) return;
      share = std::move(shares_.front());
      shares_.pop_front();
    }
    share();
    absl::MutexLock l(&helper_mu_);
    --shares_left_;
  }
}

void Completer::Answer(Job& job) {
  std::vector<BatchItem>& items = job.items;
  size_t total = 0;
  if (job.result.geometry != nullptr)
    for (const auto& it : items) total += AnswerBytes(it, job.result);
  if (total < kParallelAnswerBytes || items.size() < 2 || helpers_.empty())
    return AnswerBatch(items, job.result, job.started);
  // Each caller's requests, in batch order, on one thread (a stream answers in order); callers
  // spread over the shares by bytes, largest first.
  struct Caller {
    std::vector<size_t> items;
    size_t bytes = 0;
  };
  std::map<CallerKey, Caller> callers;
  std::vector<uint32_t> row0(items.size());
  uint32_t r = job.result.row0;
  for (size_t i = 0; i < items.size(); ++i) {
    row0[i] = r;
    r += items[i].rows();
    Caller& c = callers[items[i].caller];
    c.items.push_back(i);
    c.bytes += AnswerBytes(items[i], job.result);
  }
  std::vector<Caller*> order;
  for (auto& [key, c] : callers) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const Caller* a, const Caller* b) { return a->bytes > b->bytes; });
  const size_t n_shares = std::min<size_t>(order.size(), helpers_.size() + 1);
  std::vector<std::vector<size_t>> shares(n_shares);
  std::vector<size_t> share_bytes(n_shares, 0);
  for (const Caller* c : order) {
    const size_t s = std::min_element(share_bytes.begin(), share_bytes.end()) - share_bytes.begin();
    shares[s].insert(shares[s].end(), c->items.begin(), c->items.end());
    share_bytes[s] += c->bytes;
  }
  auto answer_share = [&](std::vector<size_t>& idx) {
    std::sort(idx.begin(), idx.end());  // batch order within a share
    for (size_t i : idx) AnswerOne(items[i], job.result, row0[i], job.started);
  };
  {
    absl::MutexLock l(&helper_mu_);
    for (size_t s = 1; s < n_shares; ++s) shares_.push_back([&answer_share, &shares, s] { answer_share(shares[s]); });
    shares_left_ += static_cast<int>(n_shares - 1);
  }
  answer_share(shares[0]);
  // The payload and `items` must outlive every share: wait for the helpers' before returning.
  absl::MutexLock l(&helper_mu_);
  helper_mu_.Await(absl::Condition(this, &Completer::SharesDone));
}

void Completer::Submit(std::vector<BatchItem> items, const BatchRowsResult& result,
                       Clock::time_point started) {
  absl::MutexLock l(&mu_);
  // One batch at a time: the engine computes the next while this one is answered, then waits
  // here; so a later batch's answers never queue behind others', and the payload this batch is
  // answered from is not overwritten meanwhile (RunBatch's buffers alternate).
  mu_.Await(absl::Condition(this, &Completer::Idle));
  jobs_.push_back(Job{std::move(items), result, started});
}

bool Completer::Busy() const {
  absl::MutexLock l(&mu_);
  return !Idle();
}

void Completer::Drain() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &Completer::Idle));  // the thread never stops short of Idle
}

void Completer::Loop() {
  for (;;) {
    Job job;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Completer::HasWorkOrStop));
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
    }
    Answer(job);
    absl::MutexLock l(&mu_);
    running_ = false;
  }
}

}  // namespace drafthead
