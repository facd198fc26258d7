// Rank 0's batch loop (the engine thread): takes batches from the Batcher, runs them across the
// group through the RankEngine and completes each request with its share of the gathered payload:
// on the engine thread when nothing else waits, else on the Completer's thread (completer.h) while
// the engine runs the next batch. While idle it beats the group's heartbeat. On a group failure it fails everything pending and queued with
// UNAVAILABLE, closes the batcher and reports through on_failure; on Stop it drains the queue first.
//
// Threads: Run on one dedicated thread; Stop and the accessors from any thread.
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

class BatchLoop {
 public:
  BatchLoop(RankEngine& engine, Batcher& batcher, Metrics* metrics,
         std::function<void(const absl::Status&)> on_failure);

  // Serves until Stop (drains the queue, shuts the workers down: returns OK) or a group failure
  // (returns it).
  absl::Status Run();
  void Stop();  // asynchronous: Run returns once the queue is empty
  // Completes the requests of the batch now running with `status` (the group failed and that
  // batch will never finish); their later completion by Run is suppressed.
  void FailInFlight(const absl::Status& status);

 private:
  absl::Status RunOne(std::vector<BatchItem>& batch);

  RankEngine& engine_;
  Batcher& batcher_;
  Metrics* metrics_;
  std::function<void(const absl::Status&)> on_failure_;
  std::atomic<bool> stopping_{false};
  absl::Mutex inflight_mu_;
  // The batch now running, until RunOne claims it back to complete it; FailInFlight may take its
  // completions first (then RunOne leaves them alone). One pointer, no per-request wrapper.
  std::vector<BatchItem>* inflight_ ABSL_GUARDED_BY(inflight_mu_) = nullptr;
  BatchControl ctl_;
  std::unique_ptr<Completer> completer_;  // made by Run (its thread lives while Run serves)
};

}  // namespace drafthead
