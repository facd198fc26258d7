// Rank 0's batch loop (its own thread): takes batches from the Batcher, runs them across the
// group through the RankEngine and completes each request with its share of the gathered payload:
// on the driving thread when nothing else waits, else on the Completer's thread (completer.h) while
// the engine runs the next batch. While idle it beats the group's heartbeat. On a group failure it
// fails everything pending and queued with UNAVAILABLE, closes the batcher and reports through
// on_failure (once); on Stop it drains the queue first.
// Inline runs: while Run serves, a request submitted with nothing queued and the engine idle runs
// on the submitting (RPC) thread (TryRunInline), so at low load no thread wakes to run it; under
// load requests queue and batch as before. One engine lock makes whoever drives the engine
// (Run's thread or an RPC thread) the only caller of the RankEngine and the Completer at a time.
//
// Ahead: while a batch is on the device (alone: tp = 1) and a full batch waits, Run takes it
// (Batcher::TakeReady) and writes its rows into the backend's upload buffer, so the device waits
// only for the next launch; with launch_ahead also launches it behind the running one
// (RankEngine::LaunchNext), so the device goes on to it at once while the running batch is
// answered. That batch is in hand, so nothing runs inline ahead of it.
//
// Threads: Run on one dedicated thread; Stop, FailInFlight and TryRunInline from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/sched/batcher.h"
#include "server/sched/completer.h"
#include "server/engine/rank_engine.h"
#include "server/sched/metrics.h"

namespace drafthead {

class BatchLoop : public InlineRunner {
 public:
  // take_ahead false: no batch is taken while another runs (--take-ahead=false, for comparison).
  // launch_ahead (with take_ahead, alone only): a batch taken ahead is also launched ahead
  // (--launch-ahead; for a device backend: one without a device would compute it before the
  // running batch is answered).
  BatchLoop(RankEngine& engine, Batcher& batcher, Metrics* metrics,
            std::function<void(const absl::Status&)> on_failure, bool take_ahead = true,
            bool launch_ahead = false);

  // Serves until Stop (drains the queue, shuts the workers down: returns OK) or a group failure
  // (returns it).
  absl::Status Run();
  void Stop();  // asynchronous: Run returns once the queue is empty
  // Completes the requests of the batch now running with `status` (the group failed and that
  // batch will never finish); their later completion by Run is suppressed.
  void FailInFlight(const absl::Status& status);
  // InlineRunner: runs `item` now if Run serves, the engine is free and the loop is not stopping.
  bool TryRunInline(BatchItem& item) override;
  // Batches Run took and wrote while the one before them computed (tests, metrics).
  uint64_t batches_taken_ahead() const { return taken_ahead_.load(); }
  // Of those, the ones launched behind the batch before them (launch_ahead).
  uint64_t batches_launched_ahead() const { return launched_ahead_.load(); }

 private:
  // The next batch, taken and prepared (ctl filled, rows written at x) during the current one.
  struct Ahead {
    std::vector<BatchItem> batch;
    const BatchControl* ctl = nullptr;
    const uint16_t* x = nullptr;
  };
  // Fills ctl with the batch's row tasks and writes its rows where the engine wants them.
  const uint16_t* Prepare(const std::vector<BatchItem>& batch, BatchControl& ctl)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);
  // Runs the prepared batch and answers it; `ahead` (Run's loop only) receives the next batch.
  absl::Status RunOne(std::vector<BatchItem>& batch, const BatchControl& ctl, const uint16_t* x,
                      Ahead* ahead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);
  // The group failed: closes the engine to inline runs, fails the batcher, reports once.
  absl::Status Fail(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);

  RankEngine& engine_;
  Batcher& batcher_;
  Metrics* metrics_;
  std::function<void(const absl::Status&)> on_failure_;
  const bool take_ahead_;
  const bool launch_ahead_;
  std::atomic<bool> stopping_{false};
  absl::Mutex inflight_mu_;
  // The batch now running, until RunOne claims it back to complete it; FailInFlight may take its
  // completions first (then RunOne leaves them alone). One pointer, no per-request wrapper.
  std::vector<BatchItem>* inflight_ ABSL_GUARDED_BY(inflight_mu_) = nullptr;
  absl::Mutex engine_mu_;  // held by whichever thread drives the engine
  bool open_ ABSL_GUARDED_BY(engine_mu_) = false;  // Run serves and the group has not failed
  absl::Status failed_ ABSL_GUARDED_BY(engine_mu_);
  // Two: the batch running and the one prepared ahead of it.
  BatchControl ctl_[2] ABSL_GUARDED_BY(engine_mu_);
  std::atomic<uint64_t> taken_ahead_{0}, launched_ahead_{0};
  std::vector<BatchItem> inline_batch_ ABSL_GUARDED_BY(engine_mu_);  // reused by TryRunInline
  std::unique_ptr<Completer> completer_;  // made by Run (its thread lives while Run serves)
};

}  // namespace drafthead
