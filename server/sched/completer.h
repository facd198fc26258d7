// The batch loop's second stage: answers a finished batch's requests (combining their shards,
// serializing, handing to gRPC) on its own thread while the batch-loop thread runs the next batch.
// It answers straight from the engine's payload: RankEngine::RunBatch's results stay valid until
// the second-next batch, and one batch at a time is held here (Submit waits until the batch before
// is answered), so the batch the engine runs meanwhile never writes the payload read here. (It
// used to copy each payload: 16.5 MB a batch of 64 rows of bf16 full logits, on the engine's
// thread.) The batch-loop thread computes the next batch meanwhile and then waits for this one to be
// answered before handing the next over (answers are the product: it runs no further ahead of them
// than one batch).
//
// A batch whose answers are large (kParallelAnswerBytes: FULL_LOGITS, ~0.5 ms an answer to combine
// and, on gRPC's callback API, to serialize on the answering thread) is answered by the completer's
// thread and its kAnswerHelpers helpers together, each caller's requests on one thread in batch
// order (a stream's answers stay in order); one thread answered ~10k rows/s of them (gRPC, c = 64,
// M = 5 FULL bf16, an H100 host), whatever the engine's pace.
//
// Threads: Submit, Busy and Drain from whoever drives the engine (one thread at a time: BatchLoop's
// engine lock); the completions run on the completer's thread (and its helpers), one batch at a
// time, in submission order. Drain (also the destructor) answers whatever was submitted before
// returning: a batch handed over always gets its (OK) answers.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/sched/batcher.h"

namespace drafthead {

// Answers each request of a finished batch with its share (rows in batch order), queue_us from
// its enqueue time to `started`.
void AnswerBatch(std::vector<BatchItem>& items, BatchRowsResult result, Clock::time_point started);

// The answer bytes a request's share makes (what its combine writes and gRPC serializes): none of
// its logits where the backend already wrote them to the caller's device memory.
size_t AnswerBytes(const BatchItem& it, const BatchRowsResult& result);

class Completer {
 public:
  static constexpr size_t kParallelAnswerBytes = size_t{2} << 20;  // a batch's answers, in all
  static constexpr int kAnswerHelpers = 3;

  Completer();
  ~Completer();  // Drain, then stops the thread

  // Answers `items` from `result`, whose payload and layout must stay valid until this batch is
  // answered (RunBatch's results: until the second-next batch, which cannot start before this call
  // returns). Waits first until the batch submitted before is answered: one batch at a time.
  void Submit(std::vector<BatchItem> items, const BatchRowsResult& result,
              Clock::time_point started);
  // Whether a submitted batch is not yet fully answered (then a later batch must queue behind it).
  bool Busy() const;
  // Returns once everything submitted is answered.
  void Drain();

 private:
  struct Job {
    std::vector<BatchItem> items;
    BatchRowsResult result;   // gathered / layout point into the engine's buffers
    Clock::time_point started;
  };
  void Loop();
  // AnswerBatch, spread over the helpers when the answers are large.
  void Answer(Job& job);
  void HelperLoop();
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !jobs_.empty() || stop_; }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty() && !running_; }
  bool HelperHasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(helper_mu_) {
    return !shares_.empty() || helpers_stop_;
  }
  bool SharesDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(helper_mu_) { return shares_left_ == 0; }

  mutable absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the thread is answering a job taken off jobs_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // The helpers' work: shares of the batch being answered, each answering its requests in order.
  mutable absl::Mutex helper_mu_;
  std::deque<std::function<void()>> shares_ ABSL_GUARDED_BY(helper_mu_);
  int shares_left_ ABSL_GUARDED_BY(helper_mu_) = 0;  // handed out and not yet finished
  bool helpers_stop_ ABSL_GUARDED_BY(helper_mu_) = false;
  std::vector<std::thread> helpers_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace drafthead
