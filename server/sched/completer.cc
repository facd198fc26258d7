#include "server/sched/completer.h"

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
    AnswerBatch(job.items, job.result, job.started);
    absl::MutexLock l(&mu_);
    running_ = false;
  }
}

}  // namespace drafthead
