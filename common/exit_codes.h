// Exit codes of every drafthead program, one list so that scripts, supervisors and the deploy
// manifests can rely on them. The numbers are part of the command-line contract: never renumber.
// (deploy/entrypoint.sh exits 64 on a configuration error before any program runs.)
#pragma once

namespace drafthead {

// All programs: the work is done (server: stopped cleanly after a drain).
inline constexpr int kExitOk = 0;

// All programs: the work failed (the reason is logged, or on stderr). drafthead-server: it could
// not start (bad flags too: 2 means something else there), or, on a rank other than 0, its group
// stopped with an error (rank 0 reports the group's failure as kExitGroupFailed).
// drafthead-client: the server or the run failed.
inline constexpr int kExitFailed = 1;
// drafthead-server, rank 0: the rank group failed while serving (a rank died, or a collective
// failed or timed out); a supervisor restarts it.
inline constexpr int kExitGroupFailed = 2;
// drafthead-server: a collective library threw from its own thread (std::terminate): the process
// ends at once.
inline constexpr int kExitFatalCollectiveFailure = 3;
// drafthead-server: stopped by a signal during start-up, before serving: 128 + the signal number,
// the shell's convention for a process killed by that signal.
inline constexpr int kExitSignalBase = 128;

// drafthead-client, drafthead-quantize, drafthead-fake-server: bad usage or input.
inline constexpr int kExitUsage = 2;

}  // namespace drafthead
