// How drafthead-server learns that it must stop, and how it ends when it cannot go on.
//
// One ShutdownSignal per process is notified by whoever sees the reason: the SignalThread (SIGTERM,
// SIGINT from outside) and internal failures (a worker rank exiting, the batch loop failing). The
// main thread waits on it once serving, then drains (a signal) or exits 2 (a failure).
#pragma once

#include <pthread.h>

#include <atomic>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace drafthead {

// Why the process stops: a signal, a failure, or both (a failure seen while draining).
struct ShutdownReason {
  int signal = 0;         // SIGTERM or SIGINT from outside; 0: none
  absl::Status failure;   // the first internal failure; OK: none
  bool failed() const { return !failure.ok(); }

  static ShutdownReason Signal(int sig) { return {sig, absl::OkStatus()}; }
  static ShutdownReason Failure(absl::Status s) { return {0, std::move(s)}; }
};

// Threads: every method may be called from any thread.
class ShutdownSignal {
 public:
  enum class Role {
    kRank0,   // a signal starts the drain
    kWorker,  // once serving, a signal is logged and ignored: rank 0 drains the group and shuts
              // this rank down (a drain needs every rank), or it exits when rank 0 disappears
  };
  explicit ShutdownSignal(Role role) : role_(role) {}

  // Records the reason (a failure wins over a signal: the process then exits 2) and wakes Wait().
  // Before MarkServing() there is nothing to drain and a pod deleted while loading must not wait
  // for its kill, so it ends the process at once instead: _exit(128 + signal) after logging
  // stopped_during_startup, or _exit(1) after logging start_failed. Ranks started by the launcher
  // follow through PR_SET_PDEATHSIG.
  void Notify(const ShutdownReason& reason);

  // From now on a notification wakes Wait() instead of ending the process.
  void MarkServing();

  // Blocks until notified once serving.
  void Wait() const;
  ShutdownReason reason() const;

 private:
  const Role role_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  ShutdownReason reason_ ABSL_GUARDED_BY(mu_);
};

// Blocks SIGTERM and SIGINT in the calling thread and so in every thread it starts later; ignores
// SIGPIPE. Call first in main, before any thread exists, so that only SignalThread takes them.
void BlockShutdownSignals();

// Takes SIGTERM and SIGINT (sigwait) on its own thread and passes each to shutdown.Notify.
class SignalThread {
 public:
  explicit SignalThread(ShutdownSignal& shutdown);
  // Stops the thread (a signal sent to it alone) and joins it.
  ~SignalThread();

 private:
  ShutdownSignal& shutdown_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Installs the std::terminate handler: Gloo may throw from its own I/O thread when a peer dies, and
// that ends there. It logs fatal_collective_failure and _exit(3)s at once, so a supervisor restarts
// the group (clients see the connection drop: UNAVAILABLE).
void ExitOnTerminate();

}  // namespace drafthead
