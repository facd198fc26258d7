#include "server/engine/rank_engine.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace drafthead {

RankEngine::RankEngine(std::unique_ptr<Collective> comm, std::unique_ptr<ComputeBackend> backend,
                       ShardGeometry geo, EngineOptions opts)
    : comm_(std::move(comm)), backend_(std::move(backend)), geo_(geo), opts_(opts) {
  // Device-resident payloads only when both sides can: NCCL moves them GPU to GPU.
  space_ = (comm_->AcceptsDeviceMemory() && backend_->name() == "cuda") ? MemorySpace::kDevice
                                                                          : MemorySpace::kHost;
}

absl::StatusOr<std::vector<RankReadyReport>> RankEngine::ExchangeReady(
    const RankReadyReport& mine) {
  std::vector<RankReadyReport> all(rank() == 0 ? world() : 0);
  DH_RETURN_IF_ERROR(comm_->Gather(&mine, sizeof(mine), all.data(), MemorySpace::kHost,
                                   opts_.load_timeout));
  return all;
}

absl::Status RankEngine::BroadcastControl(BatchControl* ctl, std::chrono::milliseconds timeout) {
  // Only the header and the used tasks travel.
  const size_t bytes = offsetof(BatchControl, tasks) + sizeof(RowTask) * kMaxRowsLimit;
  return comm_->Broadcast(ctl, bytes, MemorySpace::kHost, timeout);
}

absl::Status RankEngine::ComputeAndGather(const BatchControl& ctl, const uint16_t* x,
                                          const PayloadLayout& layout, void* recv) {
  DH_ASSIGN_OR_RETURN(const void* payload, backend_->Run(ctl, x, space_));
  return comm_->Gather(payload, layout.bytes(), recv, space_, opts_.op_timeout);
}

absl::StatusOr<RankEngine::Gathered> RankEngine::RunBatch(const BatchControl& ctl_in,
                                                          const uint16_t* x) {
  if (ctl_in.rows == 0 || ctl_in.rows > static_cast<uint32_t>(opts_.max_rows))
    return absl::InvalidArgumentError(absl::StrCat("batch of ", ctl_in.rows, " rows"));
  BatchControl ctl = ctl_in;
  ctl.magic = BatchControl::kMagic;
  ctl.op = BatchOp::kRun;
  ctl.seq = ++seq_;
  DH_RETURN_IF_ERROR(BroadcastControl(&ctl, opts_.op_timeout));
  const size_t xbytes = static_cast<size_t>(ctl.rows) * geo_.hidden * 2;
  // Gloo's broadcast writes into the root's buffer too, so rank 0 broadcasts from a copy.
  x_.resize(xbytes / 2);
  std::memcpy(x_.data(), x, xbytes);
  DH_RETURN_IF_ERROR(comm_->Broadcast(x_.data(), xbytes, MemorySpace::kHost, opts_.op_timeout));
  layout_ = MakePayloadLayout(ctl.tasks, ctl.rows, geo_.shard_rows);
  const size_t total = layout_.bytes() * world();
  DH_ASSIGN_OR_RETURN(void* recv, backend_->ScratchBuffer(total, space_));
  DH_RETURN_IF_ERROR(ComputeAndGather(ctl, x_.data(), layout_, recv));
  gathered_.resize(total);
  DH_RETURN_IF_ERROR(backend_->CopyToHost(gathered_.data(), recv, total, space_));
  return Gathered{gathered_.data(), layout_.bytes(), &layout_};
}

absl::Status RankEngine::Heartbeat() {
  BatchControl ctl;
  ctl.op = BatchOp::kHeartbeat;
  ctl.seq = ++seq_;
  return BroadcastControl(&ctl, opts_.op_timeout);
}

absl::Status RankEngine::Shutdown() {
  BatchControl ctl;
  ctl.op = BatchOp::kShutdown;
  ctl.seq = ++seq_;
  return BroadcastControl(&ctl, opts_.op_timeout);
}

absl::Status RankEngine::RunWorker() {
  const auto idle_timeout = WorkerIdleTimeout(opts_);
  BatchControl ctl;
  for (;;) {
    absl::Status s = BroadcastControl(&ctl, idle_timeout);
    if (!s.ok())
      return absl::UnavailableError(absl::StrCat("lost rank 0 (", s.message(), ")"));
    if (ctl.magic != BatchControl::kMagic)
      return absl::DataLossError("rank 0 sent a malformed batch header");
    if (ctl.op == BatchOp::kShutdown) return absl::OkStatus();
    if (ctl.op == BatchOp::kHeartbeat) continue;
    if (ctl.op != BatchOp::kRun || ctl.rows == 0 || ctl.rows > kMaxRowsLimit)
      return absl::DataLossError(absl::StrCat("rank 0 sent an unknown op ", static_cast<int>(ctl.op)));
    const size_t xbytes = static_cast<size_t>(ctl.rows) * geo_.hidden * 2;
    x_.resize(xbytes / 2);
    DH_RETURN_IF_ERROR(comm_->Broadcast(x_.data(), xbytes, MemorySpace::kHost, opts_.op_timeout));
    layout_ = MakePayloadLayout(ctl.tasks, ctl.rows, geo_.shard_rows);
    DH_RETURN_IF_ERROR(ComputeAndGather(ctl, x_.data(), layout_, nullptr));
  }
}

}  // namespace drafthead
