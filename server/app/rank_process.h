// One drafthead-server process as one rank of the group, from a validated config to its exit
// code, in named steps (rank_process.cc):
//
//   ProbeModel       the head's shape and this rank's rows; a bad checkpoint fails before any wait
//   StartRendezvous  rank 0: the rendezvous store, and in launcher mode ranks 1..N-1 as children
//   StartFront       rank 0: gRPC (health NOT_SERVING) and /metrics, up while the group loads
//   JoinGroup        every rank: the collective (Gloo or NCCL) through the rendezvous
//   LoadShard        every rank: its backend and its shard, reported to rank 0 in one gather
//   ServeAsRank0     rank 0: serve until SIGTERM (drain, exit 0) or a group failure (exit 2)
//   RunAsWorker      ranks > 0: answer rank 0's batches until it shuts the group down
//
// docs/NOTES.md "The rank group's life" tells the same story from the group's side.
#pragma once

#include <string>
#include <vector>

#include "server/app/config.h"

namespace drafthead {

// Runs this process as config.rank and returns its exit code (common/exit_codes.h). `argv` is the
// process's command line as given, for the launcher to start the other ranks with. SIGTERM and
// SIGINT must already be blocked (BlockShutdownSignals). May end the process itself (_exit) where
// nothing can be unwound: a signal or failure during start-up, a group failure while serving.
int RunRank(const ServerConfig& config, const std::vector<std::string>& argv);

}  // namespace drafthead
