// drafthead-server's command line as one validated value. The absl flags are defined in config.cc
// (and nowhere else); main.cc parses them once, then ServerConfigFromFlags checks them all and
// derives what start-up needs, so a bad flag fails before any port is bound or any rank waits.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "server/api/stream_budget.h"
#include "server/api/unary_api.h"
#include "server/backends/compute_backend.h"
#include "server/engine/rank_engine.h"
#include "server/regions/region_registry.h"
#include "server/sched/batcher.h"
#include "server/weights/shard_weights.h"

namespace drafthead {

// --tls-cert/--tls-key/--tls-client-ca: all empty (plaintext), cert and key (TLS), or all three
// (mutual TLS). The files are read when rank 0's gRPC server starts.
struct TlsFiles {
  std::string cert, key, client_ca;
  bool enabled() const { return !cert.empty(); }
  const char* mode() const { return !enabled() ? "off" : client_ca.empty() ? "on" : "mutual"; }
};

enum class RestartPolicy { kNo, kOnFailure };

struct ServerConfig {
  // ---- The group and this process's place in it.
  int rank = 0;
  int world = 1;
  int local_rank = 0;     // index among the ranks on this host (the GPU's default: ChooseDevice)
  int local_ranks = 1;    // ranks sharing this host's cores (the launcher's whole group, else 1)
  bool launcher = false;  // --tp alone: this process is rank 0 and starts ranks 1..N-1 itself
  // Rank 0's rendezvous HOST:PORT, as given; empty only in launcher mode (a free loopback port).
  std::string leader;
  std::string bind_host;  // where this rank's collectives listen (empty: from the leader's host)
  std::chrono::milliseconds join_timeout{120000};
  RestartPolicy restart = RestartPolicy::kNo;  // kOnFailure only matters in launcher mode

  // ---- Weights and compute.
  WeightsConfig weights;  // .threads: the loader's threads, the same as the backend's
  int64_t vocab_size = 0; // 0: every row of the head (checked against the head once it is probed)
  std::string backend;    // "cpu" or "cuda"
  std::string comm;       // "gloo" or "nccl"
  bool same_host_links = true;  // --comm=gloo: Unix-socket links when every rank shares rank 0's host
  int requested_device = -1;       // --devices[local_rank]; -1: not given (ChooseDevice decides)
  // threads resolved (> 0). .device stays -1 here: RunRank sets it (and shared_memory.cuda_device)
  // to ChooseDevice's one answer before anything touches a GPU.
  BackendOptions backend_options;
  EngineOptions engine;            // op/load timeouts, max_rows
  bool take_ahead = true;          // --take-ahead: BatchLoop prepares the next batch during one
  bool launch_ahead = true;        // --launch-ahead: ... and launches it behind the running one

  // ---- Rank 0's front.
  std::string listen;          // gRPC HOST:PORT or unix:PATH (CheckListenAddress)
  std::string metrics_listen;  // Prometheus HOST:PORT; empty: off
  std::string model_name = "drafthead";  // the KServe v2 API's one model
  TlsFiles tls;
  BatcherOptions batcher;      // .max_rows: the most rows in one request and one batch
  uint32_t max_top_k = 256;
  UnaryApi unary_api = UnaryApi::kCallback;  // --unary-api: which gRPC API serves ComputeLogits
  uint32_t sync_max_pollers = 256;           // --sync-max-pollers (kSync only)
  regions::RegistryOptions shared_memory;  // --shared-memory (both kinds off by default)
  uint32_t lanes = 0;                      // --lanes: same-host lanes open at once (0: off)
  std::chrono::microseconds lane_spin{50};  // --lane-spin-us
  absl::Duration drain_grace = absl::ZeroDuration();
  absl::Duration drain_timeout = absl::Seconds(30);
  StreamBudgetOptions stream_budget;  // StreamLogits backpressure

  LogLevel log_level = LogLevel::kInfo;
};

// Reads the parsed flags (absl::ParseCommandLine must have run) and checks them. The error is
// InvalidArgument (Unimplemented for what this build lacks) and names the flag, e.g.
// "--max-rows must be in 1..256".
absl::StatusOr<ServerConfig> ServerConfigFromFlags();

// --listen's forms: HOST:PORT ([v6]:PORT; port 0 picks a free one) or unix:PATH (unix:///PATH too),
// the path short enough for a Unix socket. INVALID_ARGUMENT saying what is wrong.
absl::Status CheckListenAddress(const std::string& address);
// The socket path of a unix:PATH (unix:///PATH) address; nullopt for any other form.
std::optional<std::string> UnixSocketPath(const std::string& address);

// This rank's one CUDA device: the backend, the NCCL communicator and CUDA shared-memory regions
// all use this number (one rule, so NCCL never runs on another GPU than its data). `requested`
// (--devices[local_rank], -1: not given) when given, else local_rank % visible: ranks share GPUs
// round robin when a host has fewer GPUs than local ranks (e.g. --tp=4 on one GPU for testing).
// `visible` is injected (cudaGetDeviceCount at start-up) so the rule is testable without a GPU.
// FAILED_PRECONDITION when no device is visible or `requested` is not one of them.
absl::StatusOr<int> ChooseDevice(int requested, int local_rank, int visible);

}  // namespace drafthead
