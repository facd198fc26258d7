// Rank 0's request queue and dynamic batching: requests (unary, streamed, from any API) wait here
// and the engine thread takes them as batches of up to max_rows rows. A request is split only with
// split_requests (server/sched/split_request.h): then a batch that would end short of max_rows takes
// the first rows of the request that does not fit, and the rest stays at its caller's head.
//
// Fair between callers. Every request names its caller (CallerKey: a stream, a connection's unary
// calls, a lane), set by whoever submits. Each caller has its own FIFO queue (its requests are
// taken in submission order, so a stream's answers stay in order); batches are formed across
// callers by deficit round robin on rows (each turn a caller gets max_rows rows of credit), with
// callers that have just become active served first: a caller with nothing queued goes before every
// caller whose first turn is over, so its request waits for about one batch, not for the others'
// backlogs. A batch ends at the first request that does not fit (as a FIFO queue would); a caller
// cut off with nothing in that batch goes first in the next one, so a large request is never
// starved by a run of small newcomers.
// Or FIFO (QueuePolicy::kFifo, --queue-policy=fifo): the queue before fair queueing, kept to
// compare against: batches are formed in submission order across all callers (a caller's backlog
// delays everyone who comes after it); the per-caller queues, their bound and metrics stay.
// Bounded: a request that would push the queue past max_queue_rows, or its caller's queue past
// max_caller_queue_rows, is refused at once (RESOURCE_EXHAUSTED). Expired or cancelled requests are
// answered here and never computed.
//
// Threads: Submit from any thread; Take from the one engine thread; callbacks run on the thread
// that completes the request (Take for drops, the engine thread for results, Close's caller, or
// the submitting thread when an InlineRunner ran the request there).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/sched/prepared_request.h"
#include "server/sched/split_request.h"

namespace drafthead {

using Clock = std::chrono::steady_clock;

// Who a request is queued for. Requests with equal keys share one FIFO queue and one fair share.
// `cls` says what kind of caller it is ("unary", "stream", "kserve_stream", "lane"): the metrics'
// label, and part of the key; `id` tells callers of one class apart (opaque to the batcher: a
// reactor's address, a hash of the connection's peer, a lane number). The default key is one
// caller for everything submitted without one.
struct CallerKey {
  std::string cls = "unary";
  uint64_t id = 0;
  bool operator<(const CallerKey& o) const { return std::tie(cls, id) < std::tie(o.cls, o.id); }
};

// How one request's caller wants it handled, whatever way it came in (gRPC, KServe, a lane).
struct CallControl {
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // may be empty
  bool may_run_inline = false;      // BatchItem::may_run_inline
  CallerKey caller;                 // BatchItem::caller
};

struct BatchItem {
  std::shared_ptr<const PreparedRequest> req;
  CallerKey caller;
  Clock::time_point enqueued{};
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // may be empty
  // The submitting thread may run it itself (InlineRunner): it has nothing else to do meanwhile
  // (a unary call; a stream that has already asked for its next message).
  bool may_run_inline = false;
  // Called exactly once: OK with the request's share of the batch, or the failure (nullptr).
  std::function<void(const absl::Status&, const BatchRowsResult*)> done;
  // FULL_LOGITS into device memory (a CUDA region's slice: rows x device_logits_pitch bytes), kept
  // mapped by device_logits_hold until the item is destroyed. Where the engine can (alone, on a
  // GPU: RankEngine::writes_device_rows) the backend copies the rows there itself, and done() sees
  // BatchRowsResult::logits_on_device; else the answer's builder writes them.
  void* device_logits = nullptr;
  uint64_t device_logits_pitch = 0;
  std::shared_ptr<const void> device_logits_hold;
  // A part of a split request (split_requests): its rows [part_begin, part_begin + part_rows) of
  // req, and `done` is the part's (SplitRequest::PartDone). part_rows 0: the whole request.
  uint32_t part_begin = 0, part_rows = 0;
  std::shared_ptr<SplitRequest> split;  // queued rest of a split request: where its parts answer
  uint32_t rows() const { return part_rows > 0 ? part_rows : req->rows; }
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

// How batches are formed across callers (above): fair (deficit round robin, new callers first) or
// one FIFO queue in submission order.
enum class QueuePolicy { kFair, kFifo };

// "fair" / "fifo"; false for anything else.
bool ParseQueuePolicy(const std::string& text, QueuePolicy* out);
const char* QueuePolicyName(QueuePolicy p);

struct BatcherOptions {
  QueuePolicy policy = QueuePolicy::kFair;
  uint32_t max_rows = 64;
  uint32_t max_queue_rows = 4096;
  uint32_t max_caller_queue_rows = 1024;  // one caller's share of max_queue_rows
  std::chrono::microseconds max_queue_delay{0};
  uint32_t max_requests = 0;  // most requests in one batch (0: no limit; 1: batching off)
  // A batch that would end short of max_rows takes the first rows of the next request (one
  // without a device destination), the rest following in a later batch (split_request.h). Off
  // here (whole requests: what the batcher's own tests assume); the server's --split-requests
  // turns it on by default.
  bool split_requests = false;
};

class Batcher {
 public:
  explicit Batcher(BatcherOptions opts) : opts_(opts) {}

  // Queues the item behind its caller's earlier ones, or completes it at once with
  // RESOURCE_EXHAUSTED (the queue or the caller's queue full) or the close reason (after Close).
  // Returns what happened.
  absl::Status Submit(BatchItem item);

  // Waits up to `idle_wait` for work, then up to max_queue_delay for the batch to fill. Returns the
  // batch (possibly empty), formed by the policy (above). Drops expired and cancelled items
  // (completing them). A non-empty batch is "in hand" until BatchStarted: meanwhile the queue is
  // empty and the engine may be free, but nothing runs inline ahead of it.
  std::vector<BatchItem> Take(std::chrono::milliseconds idle_wait);
  // Take without waiting, and only a full batch (max_rows rows, or max_requests requests, queued
  // now): taken early, a batch must not come out smaller than it would at the usual time (a
  // smaller batch costs the GEMV's efficiency: measured, a lane's batches shrank and its c = 64
  // throughput fell 30% when any ready batch was taken). In hand like Take's. For the engine's
  // driver preparing the next batch while the current one computes.
  std::vector<BatchItem> TakeReady();
  // The batch Take returned now holds the engine (or was failed): inline runs may go again.
  void BatchStarted();
  // Whether a batch Take or TakeReady returned has not started yet (an inline runner checks it
  // again under its engine lock: Submit's check and the runner's lock are not one step).
  bool batch_in_hand() const;

  // Fails everything queued with `reason`, and every later Submit.
  void Close(const absl::Status& reason);

  // Submit offers an item that may_run_inline to `runner` first when nothing is queued or in hand
  // and max_queue_delay is 0 (else a wait for batches to fill was asked for); nullptr: off. `runner`
  // must outlive its use here.
  void SetInlineRunner(InlineRunner* runner);

  uint32_t queued_rows() const;
  size_t queued_requests() const;

  // What waits now, per caller class (metrics).
  struct ClassDepth {
    uint32_t rows = 0;
    uint32_t callers = 0;  // callers with something queued
  };
  std::map<std::string, ClassDepth> depth_by_class() const;

  // Counters for metrics.
  struct Dropped {
    uint64_t expired = 0, cancelled = 0, rejected = 0;
  };
  Dropped dropped() const;

 private:
  struct Caller {
    CallerKey key;
    std::deque<BatchItem> items;
    uint32_t rows = 0;     // rows in items
    int64_t credit = 0;    // rows it may still take this turn (deficit round robin)
    bool fresh = true;     // in fresh_ (just became active), else in rounds_
    uint64_t taken_in = 0;  // the last Take (takes_) that took one of its requests
  };
  // Take's wake-up conditions (absl::Mutex re-evaluates them on every unlock).
  bool HasWorkOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BatchFullOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The caller whose turn it is (cut_, else the first fresh one, else the round's), or nullptr.
  Caller* Next() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `c` out of its turn list and forgets it (its queue is empty).
  void Retire(Caller* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take's two ways of filling `batch` (rows counted in `rows`), moving expired and cancelled heads
  // to `drops` with their statuses.
  void TakeFair(Clock::time_point now, std::vector<BatchItem>& batch, std::vector<BatchItem>& drops,
                std::vector<absl::Status>& drop_status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeFifo(Clock::time_point now, std::vector<BatchItem>& batch, std::vector<BatchItem>& drops,
                std::vector<absl::Status>& drop_status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // If `c`'s head has expired or been cancelled: moves it to `drops` (counted) and returns true.
  bool DropHeadIfDead(Caller* c, Clock::time_point now, std::vector<BatchItem>& drops,
                      std::vector<absl::Status>& drop_status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `c`'s head from the queue's counts and returns it.
  BatchItem PopHead(Caller* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `c`'s head may give its first `rows` rows to a batch (split_requests, no device
  // destination, more rows than that); SplitHead: those rows as a part, the rest left at the head.
  bool MaySplitHead(const Caller* c, uint32_t rows) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BatchItem SplitHead(Caller* c, uint32_t rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatcherOptions opts_;
  mutable absl::Mutex mu_;
  // Callers with something queued; each is in exactly one of fresh_ and rounds_.
  std::map<CallerKey, std::unique_ptr<Caller>> callers_ ABSL_GUARDED_BY(mu_);
  std::deque<Caller*> fresh_ ABSL_GUARDED_BY(mu_);   // became active, first turn not yet over
  std::deque<Caller*> rounds_ ABSL_GUARDED_BY(mu_);  // the round robin
  // kFifo only (fresh_ and rounds_ stay empty): each queued request's caller, in submission order.
  std::deque<Caller*> arrivals_ ABSL_GUARDED_BY(mu_);
  Caller* cut_ ABSL_GUARDED_BY(mu_) = nullptr;       // its head ended the last batch: goes first
  uint64_t takes_ ABSL_GUARDED_BY(mu_) = 0;      // Take calls so far
  uint32_t rows_ ABSL_GUARDED_BY(mu_) = 0;       // rows queued, every caller
  size_t requests_ ABSL_GUARDED_BY(mu_) = 0;     // requests queued, every caller
  bool in_hand_ ABSL_GUARDED_BY(mu_) = false;    // Take returned a batch not yet started
  absl::Status closed_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  InlineRunner* runner_ ABSL_GUARDED_BY(mu_) = nullptr;
  Dropped dropped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace drafthead
