// drafthead-server: parses the command line once, checks it (config.h), then either supervises
// the group (--tp=N --restart=on-failure: launcher.h) or runs this process as one rank
// (rank_process.h). Exit codes: common/exit_codes.h.
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "common/command_line.h"
#include "common/exit_codes.h"
#include "common/heap.h"
#include "common/log.h"
#include "server/app/config.h"
#include "server/app/launcher.h"
#include "server/app/rank_process.h"
#include "server/app/shutdown.h"

int main(int argc, char** argv) {
  using namespace drafthead;
  // Debian's Abseil keeps Mutex deadlock detection on (a global lock-order graph updated at every
  // lock, under its own global lock): the tests keep it; the server's hot path does not pay it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  KeepRequestBuffersInHeap();  // before any thread starts
  SetProgramInfo("drafthead-server", "drafthead-server: tensor-parallel LM-head logits over gRPC");
  const std::vector<std::string> args(argv, argv + argc);  // as given: the launcher passes it on
  std::vector<std::string> storage;
  std::vector<char*> normalized = NormalizeFlagNames(argc, argv, storage);
  absl::ParseCommandLine(argc, normalized.data());

  absl::StatusOr<ServerConfig> config = ServerConfigFromFlags();
  if (!config.ok()) {
    Log(LogLevel::kError, "bad_flags", "error", std::string(config.status().message()));
    return kExitFailed;
  }
  SetLogLevel(config->log_level);
  BlockShutdownSignals();  // before any thread starts, so that only the signal thread takes them
  if (config->launcher && config->restart == RestartPolicy::kOnFailure) return SuperviseGroup(args);
  return RunRank(*config, args);
}
