// One rank of the group: its collective and its compute backend. Rank 0 drives (RunBatch,
// Heartbeat, Shutdown); every other rank loops in RunWorker, answering each broadcast batch with
// its payload. All group traffic goes through here.
//
// Protocol per step: one Broadcast of the step's message from rank 0 (header, row tasks and bf16
// hidden rows: server/group/wire_format.h; the workers compute straight from the received
// buffer), then for kRun one Gather(payload) to rank 0. Rows apart (NCCL with device backends:
// the rows never cross host memory between ranks): the message carries header and tasks only, and
// the rows follow in a second broadcast from rank 0's device buffer (ComputeBackend::UploadRows)
// into each worker's (DeviceRows), where every rank's GEMV reads them. At tp = 1 nothing is sent. When idle, rank
// 0 broadcasts kHeartbeat every kHeartbeatPeriod, so a worker that hears nothing for
// WorkerIdleTimeout knows rank 0 is gone.
//
// Threads: one thread at a time per rank calls into a RankEngine (rank 0: BatchLoop's engine
// lock). Failure: any collective error breaks the group for good (statuses say which rank and
// what); the caller exits the process.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
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

  // Rank 0: where the next batch's hidden rows (bf16 [rows, K]) may be written, inside the
  // message the engine broadcasts (alone: the backend's upload buffer, ComputeBackend::InputRows),
  // so RunBatch need not copy them. Valid until the next call or batch.
  uint16_t* HiddenRowsFor(uint32_t rows);

  // Rank 0: run one batch across the group. x: bf16 [ctl.rows, K] (HiddenRowsFor's buffer or any
  // other). Returns every rank's payload back to back (world * per_rank_bytes), per
  // MakePayloadLayout(ctl.tasks, rows, S), in host memory, valid until the second-next RunBatch
  // call begins (payloads and layouts take turns in several buffers: one batch may be answered
  // from while the next runs, with no copy).
  // `while_running` (may be empty; alone only, at tp > 1 it is not called): the caller's work
  // while the batch is on the device (ComputeBackend::Finish), which may call HiddenRowsFor, write
  // the next batch's rows there (the batch in flight no longer reads them) and LaunchNext it.
  struct Gathered {
    const uint8_t* data = nullptr;
    size_t per_rank_bytes = 0;
    const PayloadLayout* layout = nullptr;  // the batch's row offsets, valid as long as data
    StageTimes stages;                      // where the batch's time went
  };
  absl::StatusOr<Gathered> RunBatch(const BatchControl& ctl, const uint16_t* x,
                                    const std::function<void()>& while_running = nullptr);
  // Rank 0 alone (tp = 1), only from inside RunBatch's while_running: launches the next batch
  // behind the one running, so that the device goes on to it without waiting for the host (x as
  // for RunBatch; ctl must stay unchanged until its RunBatch). The next RunBatch must be that
  // batch (the same ctl): it then only waits for it. A failure launches nothing (RunBatch may
  // launch the batch again, or fail it).
  absl::Status LaunchNext(const BatchControl& ctl, const uint16_t* x);
  bool can_launch_next() const { return world() == 1; }
  // Whether batches may name BatchControl::device_out (alone, on a backend with device memory);
  // RunBatch refuses them elsewhere.
  bool writes_device_rows() const { return world() == 1 && backend_->has_device_memory(); }
  absl::Status Heartbeat();
  absl::Status Shutdown();

  // Ranks other than 0: serve until rank 0 says shutdown (OK) or the group fails (error).
  absl::Status RunWorker();

 private:
  BatchHeader* header() { return reinterpret_cast<BatchHeader*>(msg_.data()); }
  // Rank 0: sizes msg_ for a message of `bytes` and writes its header.
  void StartMessage(BatchOp op, uint32_t rows, size_t bytes);
  // Every rank: the step's message from rank 0 into msg_ (one broadcast of the agreed frame, a
  // second only for a message larger than it); `first_timeout` bounds the first.
  absl::Status BroadcastMessage(std::chrono::milliseconds first_timeout);
  // In a group: this rank's payload of the batch in msg_, gathered to rank 0 (recv; nullptr
  // elsewhere); *times: the backend's stages and the gather.
  absl::StatusOr<const void*> ComputeAndGather(const BatchControl& ctl, const uint16_t* x,
                                               void* recv, StageTimes* times);
  // Rows apart, every rank: rank 0 uploads the batch's host rows x into its backend's device
  // buffer (UploadRows) and sends them from there into the others' (DeviceRows; x unused there).
  // Returns this rank's device copy, for its Launch.
  absl::StatusOr<const uint16_t*> BroadcastRows(const BatchControl& ctl, const uint16_t* x);
  // Alone: launches the batch on the backend (its payload in host memory).
  absl::Status LaunchAlone(const BatchControl& ctl, const uint16_t* x);
  absl::Status CheckRows(uint32_t rows) const;  // 1..max_rows

  std::unique_ptr<Collective> comm_;
  std::unique_ptr<ComputeBackend> backend_;
  ShardGeometry geo_;
  EngineOptions opts_;
  uint64_t seq_ = 0;
  MemorySpace space_ = MemorySpace::kHost;
  bool rows_apart_ = false;          // a group in device memory: the rows travel GPU to GPU
  size_t max_message_bytes_ = 0;     // a batch of opts_.max_rows rows
  size_t frame_bytes_ = kMinFrameBytes;  // the next broadcast's size, agreed the step before
  std::vector<uint8_t> msg_;         // the step's message (16-byte aligned: operator new)
  BatchControl ctl_;                 // workers: the received batch's tasks
  // The batches' payload layouts, in turn like the payloads they describe (RunBatch).
  BufferRing<PayloadLayout, kHostPayloads> layouts_;
  const PayloadLayout& layout() { return layouts_[layouts_.last()]; }  // the last one made
  // Alone: the batches launched and not yet finished, oldest first (at most two).
  struct InFlight {
    const BatchControl* ctl = nullptr;
    const PayloadLayout* layout = nullptr;
  };
  std::deque<InFlight> in_flight_;
};

}  // namespace drafthead
