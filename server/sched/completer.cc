#include "server/sched/completer.h"

#include <cstring>

namespace drafthead {

void AnswerBatch(std::vector<BatchItem>& items, BatchRowsResult result, Clock::time_point started) {
  for (auto& it : items) {
    result.queue_us = static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(started - it.enqueued).count());
    it.done(absl::OkStatus(), &result);
    result.row0 += it.req->rows;
  }
}

Completer::Completer() : thread_([this] { Loop(); }) {}

Completer::~Completer() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();  // Loop answers every job before it sees stop_
}

void Completer::Submit(std::vector<BatchItem> items, const BatchRowsResult& result,
                       Clock::time_point started) {
  Job job;
  {
    absl::MutexLock l(&mu_);
    // One batch at a time: the engine computes the next while this one is answered, then waits
    // here; so one payload copy is held, and a later batch's answers never queue behind others'.
    mu_.Await(absl::Condition(this, &Completer::Idle));
    if (!spare_.empty()) {
      job.bytes = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  const size_t bytes = result.per_rank_bytes * result.geometry->tp;
  job.bytes.resize(bytes);
  std::memcpy(job.bytes.data(), result.gathered, bytes);
  job.layout = *result.layout;
  job.items = std::move(items);
  job.result = result;
  job.started = started;
  absl::MutexLock l(&mu_);
  jobs_.push_back(std::move(job));
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
    job.result.gathered = job.bytes.data();
    job.result.layout = &job.layout;
    AnswerBatch(job.items, job.result, job.started);
    absl::MutexLock l(&mu_);
    spare_.push_back(std::move(job.bytes));
    running_ = false;
  }
}

}  // namespace drafthead
