// Process management for `drafthead-server --tp=N` on one host: rank 0 (this process) spawns ranks
// 1..N-1 as children running the same binary with --rank/--world/--leader, each dying with its
// parent (PR_SET_PDEATHSIG). A supervisor mode (--restart=on-failure) reruns the whole group when
// it exits non-zero.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace drafthead {

// Spawns ranks 1..world-1: argv is this process's command line; each child gets it plus
// --rank=R --world=N --leader=LEADER appended (later flags win in absl). Returns their pids.
absl::StatusOr<std::vector<pid_t>> SpawnWorkerRanks(const std::vector<std::string>& argv, int world,
                                                    const std::string& leader);

// Waits (on its own thread) for the children; calls on_exit(rank, exit description, clean) for each.
class ChildWatcher {
 public:
  ChildWatcher(std::vector<pid_t> pids,
               std::function<void(int rank, const std::string& how, bool clean)> on_exit);
  ~ChildWatcher();
  // Sends `sig` to every child still running.
  void SignalAll(int sig);
  // Waits up to timeout_ms for all children to exit; returns true if they did.
  bool WaitAll(int timeout_ms);

 private:
  struct State;
  State* s_;
};

// Runs argv (with --restart=no appended) until it exits 0 or a signal asks us to stop; reruns it
// after a failure with a capped exponential backoff. Returns the exit code to use.
int SuperviseGroup(const std::vector<std::string>& argv);

}  // namespace drafthead
