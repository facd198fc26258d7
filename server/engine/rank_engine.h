// One rank of the group: its collective and its compute backend. Rank 0 drives (RunBatch,
// Heartbeat, Shutdown); every other rank loops in RunWorker, answering each broadcast batch with
// its payload. All group traffic goes through here.
//
// Protocol per step: Broadcast(BatchControl) from rank 0; for kRun, Broadcast(hidden rows, bf16)
// then Gather(payload) to rank 0. When idle, rank 0 broadcasts kHeartbeat every kHeartbeatPeriod,
// so a worker that hears nothing for WorkerIdleTimeout knows rank 0 is gone.
//
// Threads: one thread per rank calls into a RankEngine. Failure: any collective error breaks the
// group for good (statuses say which rank and what); the caller exits the process.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/compute_backend.h"
#include "server/group/wire_format.h"
#include "server/comm/collective.h"
#include "server/group/shard_geometry.h"

namespace drafthead {

// Rank 0's idle beat: BatchLoop waits this long for work before it calls Heartbeat.
inline constexpr std::chrono::milliseconds kHeartbeatPeriod{100};

struct EngineOptions {
  std::chrono::milliseconds op_timeout{5000};      // one batch's collectives
  std::chrono::milliseconds load_timeout{1800000}; // waiting for every rank's shard at start
  int max_rows = 64;
};

// How long a worker waits for rank 0's next broadcast before it declares rank 0 gone: 20 beats
// (2 s: room for a batch's fill wait and response building between broadcasts) plus one batch's
// collectives (a slow batch delays the next beat).
constexpr std::chrono::milliseconds WorkerIdleTimeout(const EngineOptions& opts) {
  return kHeartbeatPeriod * 20 + opts.op_timeout;
}

// What a rank reports to rank 0 once its shard is loaded (or failed to load).
struct RankReadyReport {
  int32_t ok = 0;
  int32_t rank = 0;
  uint64_t weight_bytes = 0;
  double load_seconds = 0;
  double twin_seconds = 0;
  char backend[16] = {};
  char message[472] = {};
};
static_assert(std::is_trivially_copyable_v<RankReadyReport>);

class RankEngine {
 public:
  RankEngine(std::unique_ptr<Collective> comm, std::unique_ptr<ComputeBackend> backend,
             ShardGeometry geo, EngineOptions opts);

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world(); }
  const ShardGeometry& geometry() const { return geo_; }
  ComputeBackend& backend() { return *backend_; }

  // Every rank: send this rank's load outcome to rank 0. On rank 0 returns all ranks' reports
  // (index = rank); on the others an empty vector.
  absl::StatusOr<std::vector<RankReadyReport>> ExchangeReady(const RankReadyReport& mine);

  // Rank 0: run one batch across the group. x: bf16 [ctl.rows, K]. Returns every rank's payload
  // back to back (world * per_rank_bytes), per MakePayloadLayout(ctl.tasks, rows, S).
  struct Gathered {
    const uint8_t* data = nullptr;
    size_t per_rank_bytes = 0;
    const PayloadLayout* layout = nullptr;  // the batch's row offsets, valid until the next batch
  };
  absl::StatusOr<Gathered> RunBatch(const BatchControl& ctl, const uint16_t* x);
  absl::Status Heartbeat();
  absl::Status Shutdown();

  // Ranks other than 0: serve until rank 0 says shutdown (OK) or the group fails (error).
  absl::Status RunWorker();

 private:
  absl::Status BroadcastControl(BatchControl* ctl, std::chrono::milliseconds timeout);
  absl::Status ComputeAndGather(const BatchControl& ctl, const uint16_t* x,
                                const PayloadLayout& layout, void* recv);

  std::unique_ptr<Collective> comm_;
  std::unique_ptr<ComputeBackend> backend_;
  ShardGeometry geo_;
  EngineOptions opts_;
  uint64_t seq_ = 0;
  MemorySpace space_ = MemorySpace::kHost;
  std::vector<uint16_t> x_;           // workers: the broadcast hidden rows
  std::vector<uint8_t> gathered_;     // rank 0: host copy of the gathered payloads
  PayloadLayout layout_;              // the current batch's payload layout
};

}  // namespace drafthead
