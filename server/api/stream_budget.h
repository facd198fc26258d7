// Backpressure for StreamLogits: answers waiting to be written count against a byte budget per
// stream and one for the whole server, so that a caller who never reads costs only itself.
//
// A stream reserves its answer's expected size (ExpectedAnswerBytes) when it reads a request,
// settles that to the real size when the answer is ready (serialized once, raw_messages.h: the
// bytes counted are the bytes held), and releases it once gRPC has written the answer
// (OnWriteDone) or it is dropped. A stream reads its next request only while MayRead(): it
// holds nothing, or its bytes are under the per-stream budget and the server's under the total.
// A stream holding nothing may always read one request, so a single answer larger than a budget
// still goes through and a well-behaved caller is never starved by the misbehaving ones (the
// server then holds at most the total plus one answer per stream). No stream waits without an
// event to wake it: one holding bytes has answers in compute or in writing, whose completions pump
// it again. A stream whose answer has been waiting to be written for longer than the stall limit
// (its caller reads nothing) is cancelled by the budget's watchdog thread.
//
// Threads: StreamBudget and StreamAccount are thread-safe. Lifetime: every StreamAccount is
// destroyed before its StreamBudget. The watchdog calls an account's cancel on its own thread
// while it holds the budget's registry lock, so an account's destructor waits for it: cancel must
// not destroy the account itself (ctx->TryCancel(): gRPC runs the reactions on its own threads).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "drafthead/v1/drafthead.pb.h"

namespace drafthead {

struct StreamBudgetOptions {
  uint64_t per_stream_bytes = 64ull << 20;  // --stream-buffer-bytes
  uint64_t total_bytes = 1ull << 30;        // --stream-buffer-total-bytes
  std::chrono::milliseconds stall_limit{20000};  // --stream-stall-timeout
  std::chrono::milliseconds watch_period{100};   // how often the watchdog looks
};

// An upper bound of the answer to `req` in bytes (rows x vocab x 4 for full logits; ids, values
// and probabilities for the others), before it is computed.
uint64_t ExpectedAnswerBytes(const v1::LogitsRequest& req, int64_t vocab_size);

class StreamAccount;

class StreamBudget {
 public:
  explicit StreamBudget(StreamBudgetOptions options);
  ~StreamBudget();  // stops the watchdog; every account must be gone
  const StreamBudgetOptions& options() const { return options_; }
  uint64_t total_bytes() const { return total_.load(std::memory_order_relaxed); }

 private:
  friend class StreamAccount;
  void Watch();

  const StreamBudgetOptions options_;
  std::atomic<uint64_t> total_{0};
  absl::Mutex mu_;
  std::set<StreamAccount*> accounts_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

// The read / write / finish state both bidi reactors (StreamLogits, ModelStreamInfer) keep under
// their lock: at most one read and one write in flight; a stream reads on while its input has not
// ended, its caller is there, and it is under its in-flight cap and its byte budget; it is over
// once the input has ended (or the caller is gone) and nothing is in flight or unanswered.
struct StreamFlow {
  bool reading = false, reads_done = false, writing = false, broken = false, finished = false;

  bool MayRead(size_t unanswered, size_t cap, const StreamAccount& account) const;
  // True once, when the stream is over: the caller then Finishes it (outside its lock: Finish may
  // lead to OnDone, which deletes the reactor).
  bool Finishing(size_t unanswered) {
    if (finished || writing || reading || unanswered > 0) return false;
    if (!reads_done && !broken) return false;
    finished = true;
    return true;
  }
};

class StreamAccount {
 public:
  // cancel: ends the stream (ctx->TryCancel()).
  StreamAccount(StreamBudget& budget, std::function<void()> cancel);
  ~StreamAccount();  // releases what is still held
  StreamAccount(const StreamAccount&) = delete;
  StreamAccount& operator=(const StreamAccount&) = delete;

  bool MayRead() const;
  void Reserve(uint64_t bytes);                     // a request read
  void Settle(uint64_t reserved, uint64_t actual);  // its answer is ready
  void Release(uint64_t bytes);                     // written or dropped
  // An answer handed to gRPC / gRPC done with it: the stall clock runs in between.
  void WriteStarted();
  void WriteDone();
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  friend class StreamBudget;
  void Add(int64_t delta);

  StreamBudget& budget_;
  const std::function<void()> cancel_;
  std::atomic<uint64_t> bytes_{0};
  // Steady-clock ns when the pending write started; 0: none pending.
  std::atomic<int64_t> write_started_ns_{0};
  std::atomic<bool> cancelled_{false};
};

inline bool StreamFlow::MayRead(size_t unanswered, size_t cap, const StreamAccount& account) const {
  return !reading && !reads_done && !broken && unanswered < cap && account.MayRead();
}

}  // namespace drafthead
