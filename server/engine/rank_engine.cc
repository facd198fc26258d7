#include "server/engine/rank_engine.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace drafthead {
namespace {

using Clock = std::chrono::steady_clock;

uint32_t MicrosSince(Clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
}

}  // namespace

RankEngine::RankEngine(std::unique_ptr<Collective> comm, std::unique_ptr<ComputeBackend> backend,
                       ShardGeometry geo, EngineOptions opts)
    : comm_(std::move(comm)), backend_(std::move(backend)), geo_(geo), opts_(opts) {
  // Device-resident payloads only when both sides can: NCCL moves them GPU to GPU.
  space_ = (comm_->AcceptsDeviceMemory() && backend_->has_device_memory()) ? MemorySpace::kDevice
                                                                            : MemorySpace::kHost;
  // The same on every rank (one collective, one backend kind); the workers check rank 0's word.
  rows_apart_ = world() > 1 && space_ == MemorySpace::kDevice;
  // Sized by the hard row cap, not --max-rows, so ranks agree on it whatever their flags.
  max_message_bytes_ = std::max(BatchMessageBytes(kMaxRowsLimit, geo_.hidden), kMinFrameBytes);
  msg_.resize(frame_bytes_);
}

absl::StatusOr<std::vector<RankReadyReport>> RankEngine::ExchangeReady(
    const RankReadyReport& mine) {
  std::vector<RankReadyReport> all(rank() == 0 ? world() : 0);
  DH_RETURN_IF_ERROR(comm_->Gather(&mine, sizeof(mine), all.data(), MemorySpace::kHost,
                                   opts_.load_timeout));
  return all;
}

uint16_t* RankEngine::HiddenRowsFor(uint32_t rows) {
  // Alone, nothing is broadcast, and rows apart travel from the backend's device buffer: the rows
  // may go straight into the backend's upload buffer.
  if (world() == 1 || rows_apart_)
    if (uint16_t* in = backend_->InputRows(rows)) return in;
  // At least the frame too, so StartMessage never reallocates under the caller's rows.
  const size_t need = std::max(BatchMessageBytes(rows, geo_.hidden), frame_bytes_);
  if (msg_.size() < need) msg_.resize(need);
  return reinterpret_cast<uint16_t*>(msg_.data() + BatchHiddenOffset(rows));
}

void RankEngine::StartMessage(BatchOp op, uint32_t rows, size_t bytes) {
  const size_t need = std::max(bytes, frame_bytes_);
  if (msg_.size() < need) msg_.resize(need);
  BatchHeader* h = header();
  *h = BatchHeader{};
  h->op = op;
  h->seq = ++seq_;
  h->rows = rows;
  h->message_bytes = bytes;
  h->next_frame_bytes = static_cast<uint32_t>(
      op == BatchOp::kRun ? FrameBytesFor(bytes, max_message_bytes_) : frame_bytes_);
}

absl::Status RankEngine::BroadcastMessage(std::chrono::milliseconds first_timeout) {
  if (world() == 1) return absl::OkStatus();
  if (msg_.size() < frame_bytes_) msg_.resize(frame_bytes_);
  DH_RETURN_IF_ERROR(comm_->Broadcast(msg_.data(), frame_bytes_, MemorySpace::kHost, first_timeout));
  const BatchHeader h = *header();
  if (h.magic != BatchHeader::kMagic || h.message_bytes < sizeof(BatchHeader) ||
      h.message_bytes > max_message_bytes_ || h.next_frame_bytes < kMinFrameBytes ||
      h.next_frame_bytes > max_message_bytes_) {
    return absl::DataLossError(absl::StrCat("rank 0 sent a malformed batch header (magic ", h.magic,
                                            ", ", h.message_bytes, " bytes, next frame ",
                                            h.next_frame_bytes, ")"));
  }
  if (h.message_bytes > frame_bytes_) {  // the tail of a message larger than the agreed frame
    if (msg_.size() < h.message_bytes) msg_.resize(h.message_bytes);
    DH_RETURN_IF_ERROR(comm_->Broadcast(msg_.data() + frame_bytes_, h.message_bytes - frame_bytes_,
                                        MemorySpace::kHost, opts_.op_timeout));
  }
  frame_bytes_ = h.next_frame_bytes;
  return absl::OkStatus();
}

absl::StatusOr<const uint16_t*> RankEngine::BroadcastRows(const BatchControl& ctl, const uint16_t* x) {
  const uint16_t* dx = nullptr;
  if (rank() == 0) {
    DH_ASSIGN_OR_RETURN(dx, backend_->UploadRows(ctl, x));
  } else {
    dx = static_cast<const uint16_t*>(backend_->DeviceRows(ctl.rows));
    if (dx == nullptr)
      return absl::InternalError(absl::StrCat("rank ", rank(), ": no device buffer for ", ctl.rows, " rows"));
  }
  // The root only reads its buffer.
  DH_RETURN_IF_ERROR(comm_->Broadcast(const_cast<uint16_t*>(dx), BatchRowsBytes(ctl.rows, geo_.hidden),
                                      MemorySpace::kDevice, opts_.op_timeout));
  return dx;
}

absl::StatusOr<const void*> RankEngine::ComputeAndGather(const BatchControl& ctl,
                                                         const uint16_t* x, void* recv,
                                                         StageTimes* times) {
  // Rows apart, rank 0: the rows go to the device and from there to the workers before any GEMV
  // (sent while its own GEMV ran, the broadcast's kernels could wait for the GEMV's SMs).
  uint32_t rows_us = 0;
  if (rows_apart_ && rank() == 0) {
    const auto t0 = Clock::now();
    DH_ASSIGN_OR_RETURN(x, BroadcastRows(ctl, x));
    rows_us = MicrosSince(t0);
  }
  DH_ASSIGN_OR_RETURN(const void* payload, backend_->Run(ctl, x, space_));
  *times = backend_->stage_times();
  times->broadcast_us = rows_us;
  const auto t0 = Clock::now();
  DH_RETURN_IF_ERROR(comm_->Gather(payload, layout().bytes(), recv, space_, opts_.op_timeout));
  times->gather_us = MicrosSince(t0);
  return static_cast<const void*>(recv);
}

absl::Status RankEngine::LaunchAlone(const BatchControl& ctl, const uint16_t* x) {
  PayloadLayout& layout = layouts_.Next();
  layout = MakePayloadLayout(ctl.tasks, ctl.rows, geo_.shard_rows);
  // Alone, the payload is read on the host at once: the backend's one download serves.
  DH_RETURN_IF_ERROR(backend_->Launch(ctl, x, MemorySpace::kHost));
  in_flight_.push_back(InFlight{&ctl, &layout});
  return absl::OkStatus();
}

absl::Status RankEngine::CheckRows(uint32_t rows) const {
  if (rows == 0 || rows > static_cast<uint32_t>(opts_.max_rows))
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows"));
  return absl::OkStatus();
}

absl::Status RankEngine::LaunchNext(const BatchControl& ctl, const uint16_t* x) {
  if (world() != 1 || in_flight_.size() != 1)
    return absl::FailedPreconditionError("LaunchNext: only alone, from inside RunBatch");
  DH_RETURN_IF_ERROR(CheckRows(ctl.rows));
  return LaunchAlone(ctl, x);
}

absl::StatusOr<RankEngine::Gathered> RankEngine::RunBatch(
    const BatchControl& ctl, const uint16_t* x, const std::function<void()>& while_running) {
  const uint32_t rows = ctl.rows;
  DH_RETURN_IF_ERROR(CheckRows(rows));
  if (ctl.device_outs > 0 && !writes_device_rows())
    return absl::InvalidArgumentError("RunBatch: rows to device memory, but not alone on a GPU");
  Gathered g;
  if (world() == 1) {  // nothing to broadcast or gather: straight to the backend
    if (in_flight_.empty()) DH_RETURN_IF_ERROR(LaunchAlone(ctl, x));
    const InFlight step = in_flight_.front();
    if (step.ctl != &ctl) return absl::InternalError("RunBatch: not the batch launched next");
    DH_ASSIGN_OR_RETURN(const void* payload, backend_->Finish(while_running));
    in_flight_.pop_front();
    g.stages = backend_->stage_times();
    g.data = static_cast<const uint8_t*>(payload);
    g.per_rank_bytes = step.layout->bytes();
    g.layout = step.layout;
    return g;
  }
  // In a group, msg_ (where the next rows would go) is the broadcast buffer: no overlap there.
  // Rows apart, they stay where they are (the backend uploads them and sends them on).
  const uint16_t* mx = x;
  if (!rows_apart_) {
    uint16_t* in_msg = HiddenRowsFor(rows);
    if (in_msg != x) std::memcpy(in_msg, x, BatchRowsBytes(rows, geo_.hidden));
    mx = in_msg;
  }
  StartMessage(BatchOp::kRun, rows, BatchMessageBytes(rows, geo_.hidden, rows_apart_));
  header()->rows_apart = rows_apart_ ? 1 : 0;
  std::memcpy(msg_.data() + sizeof(BatchHeader), ctl.tasks, rows * sizeof(RowTask));
  const auto t0 = Clock::now();
  DH_RETURN_IF_ERROR(BroadcastMessage(opts_.op_timeout));
  const uint32_t broadcast_us = MicrosSince(t0);
  layouts_.Next() = MakePayloadLayout(ctl.tasks, rows, geo_.shard_rows);
  const size_t total = layout().bytes() * world();
  DH_ASSIGN_OR_RETURN(void* recv, backend_->ScratchBuffer(total, space_));
  // The workers' payloads may land while rank 0 computes its own. Not with rows apart: the rows'
  // broadcast comes before the gather, and a posted gather must be the next call (collective.h).
  const auto t1 = Clock::now();
  if (!rows_apart_) DH_RETURN_IF_ERROR(comm_->PostGather(recv, layout().bytes(), space_));
  const uint32_t post_us = MicrosSince(t1);
  DH_ASSIGN_OR_RETURN(const void* out, ComputeAndGather(ctl, mx, recv, &g.stages));
  g.stages.broadcast_us += broadcast_us;  // the message's and (rows apart) the rows'
  g.stages.gather_us += post_us;  // posting the receives is part of the gather
  if (space_ == MemorySpace::kDevice) {
    const auto t2 = Clock::now();
    DH_ASSIGN_OR_RETURN(void* host, backend_->ScratchBuffer(total, MemorySpace::kHost));
    DH_RETURN_IF_ERROR(backend_->CopyToHost(host, out, total, space_));
    g.stages.d2h_us += MicrosSince(t2);
    out = host;
  }
  g.data = static_cast<const uint8_t*>(out);
  g.per_rank_bytes = layout().bytes();
  g.layout = &layout();
  return g;
}

absl::Status RankEngine::Heartbeat() {
  StartMessage(BatchOp::kHeartbeat, 0, sizeof(BatchHeader));
  return BroadcastMessage(opts_.op_timeout);
}

absl::Status RankEngine::Shutdown() {
  StartMessage(BatchOp::kShutdown, 0, sizeof(BatchHeader));
  return BroadcastMessage(opts_.op_timeout);
}

absl::Status RankEngine::RunWorker() {
  const auto idle_timeout = WorkerIdleTimeout(opts_);
  for (;;) {
    absl::Status s = BroadcastMessage(idle_timeout);
    if (s.code() == absl::StatusCode::kDataLoss) return s;
    if (!s.ok())
      return absl::UnavailableError(absl::StrCat("lost rank 0 (", s.message(), ")"));
    const BatchHeader h = *header();
    if (h.op == BatchOp::kShutdown) return absl::OkStatus();
    if (h.op == BatchOp::kHeartbeat) continue;
    if (h.op != BatchOp::kRun || h.rows == 0 || h.rows > kMaxRowsLimit ||
        h.message_bytes != BatchMessageBytes(h.rows, geo_.hidden, h.rows_apart != 0))
      return absl::DataLossError(absl::StrCat("rank 0 sent an unknown op ", static_cast<int>(h.op),
                                              " or a batch of ", h.rows, " rows in ",
                                              h.message_bytes, " bytes"));
    if ((h.rows_apart != 0) != rows_apart_)
      return absl::DataLossError(absl::StrCat(
          "rank 0 sends the hidden rows ", h.rows_apart ? "apart, in device memory" : "in its message",
          "; rank ", rank(), " (", comm_->name(), ", ", backend_->name(), ") expects them ",
          rows_apart_ ? "apart" : "in the message"));
    ctl_.rows = h.rows;
    std::memcpy(ctl_.tasks, msg_.data() + sizeof(BatchHeader), h.rows * sizeof(RowTask));
    layouts_.Next() = MakePayloadLayout(ctl_.tasks, h.rows, geo_.shard_rows);
    const uint16_t* x = nullptr;
    if (rows_apart_) {
      DH_ASSIGN_OR_RETURN(x, BroadcastRows(ctl_, nullptr));
    } else {
      x = reinterpret_cast<const uint16_t*>(msg_.data() + BatchHiddenOffset(h.rows));
    }
    StageTimes unused;
    DH_RETURN_IF_ERROR(ComputeAndGather(ctl_, x, nullptr, &unused).status());
  }
}

}  // namespace drafthead
