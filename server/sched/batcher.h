// Rank 0's request queue and dynamic batching: requests (unary and streamed alike) wait here
// and the engine thread takes them as batches of up to max_rows rows, in arrival order (a request
// is never split). Bounded: a request that would push the queue past max_queue_rows is refused at
// once (RESOURCE_EXHAUSTED). Expired or cancelled requests are answered here and never computed.
//
// Threads: Submit from any thread; Take from the one engine thread; callbacks run on the thread
// that completes the request (Take for drops, the engine thread for results, Close's caller, or
// the submitting thread when an InlineRunner ran the request there).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/sched/prepared_request.h"

namespace drafthead {

using Clock = std::chrono::steady_clock;

// How one request's caller wants it handled, whatever way it came in (gRPC, KServe, a lane).
struct CallControl {
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // may be empty
  bool may_run_inline = false;      // BatchItem::may_run_inline
};

struct BatchItem {
  std::shared_ptr<const PreparedRequest> req;
  Clock::time_point enqueued{};
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // may be empty
  // The submitting thread may run it itself (InlineRunner): it has nothing else to do meanwhile
  // (a unary call; a stream that has already asked for its next message).
  bool may_run_inline = false;
  // Called exactly once: OK with the request's share of the batch, or the failure (nullptr).
  std::function<void(const absl::Status&, const BatchRowsResult*)> done;
};

// Runs a request at once on the submitting thread when the engine is idle (BatchLoop), saving the
// engine thread's wake-up: at concurrency 1 that hand-off is most of the queue time.
class InlineRunner {
 public:
  virtual ~InlineRunner() = default;
  // Runs `item` to completion (its done() called) and returns true, or leaves it untouched and
  // returns false (it is then queued). Must not block waiting for the engine.
  virtual bool TryRunInline(BatchItem& item) = 0;
};

struct BatcherOptions {
  uint32_t max_rows = 64;
  uint32_t max_queue_rows = 4096;
  std::chrono::microseconds max_queue_delay{0};
  uint32_t max_requests = 0;  // most requests in one batch (0: no limit; 1: batching off)
};

class Batcher {
 public:
  explicit Batcher(BatcherOptions opts) : opts_(opts) {}

  // Queues the item, or completes it at once with RESOURCE_EXHAUSTED (queue full) or the close
  // reason (after Close). Returns what happened.
  absl::Status Submit(BatchItem item);

  // Waits up to `idle_wait` for work, then up to max_queue_delay for the batch to fill. Returns the
  // batch (possibly empty). Drops expired and cancelled items (completing them).
  std::vector<BatchItem> Take(std::chrono::milliseconds idle_wait);

  // Fails everything queued with `reason`, and every later Submit.
  void Close(const absl::Status& reason);

  // Submit offers an item that may_run_inline to `runner` first when nothing is queued and
  // max_queue_delay is 0 (else a wait for batches to fill was asked for); nullptr: off. `runner`
  // must outlive its use here.
  void SetInlineRunner(InlineRunner* runner);

  uint32_t queued_rows() const;
  size_t queued_requests() const;

  // Counters for metrics.
  struct Dropped {
    uint64_t expired = 0, cancelled = 0, rejected = 0;
  };
  Dropped dropped() const;

 private:
  // Take's wake-up conditions (absl::Mutex re-evaluates them on every unlock).
  bool HasWorkOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BatchFullOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatcherOptions opts_;
  mutable absl::Mutex mu_;
  std::deque<BatchItem> q_ ABSL_GUARDED_BY(mu_);
  uint32_t rows_ ABSL_GUARDED_BY(mu_) = 0;  // rows in q_
  absl::Status closed_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  InlineRunner* runner_ ABSL_GUARDED_BY(mu_) = nullptr;
  Dropped dropped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace drafthead
