#include "server/comm/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace drafthead {
namespace {

using Clock = std::chrono::steady_clock;

// The collective is aborted on any failure (Fail), which reports it as a group failure
// (UNAVAILABLE, collective.h); later calls answer UNAVAILABLE too.
#define DH_NCCL_CHECK(expr) DH_RETURN_IF_ERROR(Fail(DH_NCCL_STATUS(expr, rank_, comm_)))
#define DH_CUDA_CHECK(expr) DH_RETURN_IF_ERROR(Fail(DH_CUDA_STATUS(expr, rank_)))

class NcclCollective : public Collective {
 public:
  NcclCollective(int rank, int world, int device) : rank_(rank), world_(world), device_(device) {}

  ~NcclCollective() override {
    if (device_ >= 0) cudaSetDevice(device_);
    if (comm_ != nullptr) {
      bool clean = false;
      if (!broken_ && ncclCommFinalize(comm_) != ncclSystemError) {
        // Finalize flushes outstanding work; bounded so a vanished peer cannot hang shutdown.
        const auto deadline = Clock::now() + std::chrono::seconds(5);
        ncclResult_t st = ncclInProgress;
        while (Clock::now() < deadline) {
          if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess || st != ncclInProgress) break;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        clean = st == ncclSuccess;
      }
      if (clean) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    for (void* p : {dsend_, drecv_})
      if (p) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init(KvClient& store, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    // No fallback rule here: a second rule could put NCCL on another GPU than the backend's data.
    if (device_ < 0) return absl::InvalidArgumentError("nccl: no device given");  // misuse, not a group failure
    DH_CUDA_CHECK(cudaSetDevice(device_));
    DH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (rank_ == 0) {
      DH_NCCL_CHECK(ncclGetUniqueId(&id));
      DH_RETURN_IF_ERROR(Fail(store.Set(kUidKey, std::string(id.internal, sizeof(id.internal)))));
    } else {
      auto v = store.Get(kUidKey, timeout);
      if (!v.ok()) return Fail(v.status());
      if (v->size() != sizeof(id.internal))
        return Fail(absl::InternalError(absl::StrCat("nccl: the unique id under '", kUidKey,
                                                     "' has ", v->size(), " bytes, expected ",
                                                     sizeof(id.internal))));
      std::memcpy(id.internal, v->data(), sizeof(id.internal));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DH_NCCL_CHECK(ncclCommInitRankConfig(&comm_, world_, id, rank_, &config));
    return WaitComm(deadline, "ncclCommInitRankConfig");
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "nccl"; }
  bool AcceptsDeviceMemory() const override { return true; }

  absl::Status Broadcast(void* data, size_t bytes, MemorySpace space,
                         std::chrono::milliseconds timeout) override {
    DH_RETURN_IF_ERROR(Usable());
    if (bytes == 0) return absl::OkStatus();
    const auto deadline = Clock::now() + timeout;
    DH_CUDA_CHECK(cudaSetDevice(device_));
    void* buf = data;
    if (space == MemorySpace::kHost) {
      DH_RETURN_IF_ERROR(Reserve(&dsend_, &send_cap_, bytes));
      buf = dsend_;
      if (rank_ == 0) DH_CUDA_CHECK(cudaMemcpyAsync(buf, data, bytes, cudaMemcpyHostToDevice, stream_));
    }
    DH_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, 0, comm_, stream_));
    DH_RETURN_IF_ERROR(WaitComm(deadline, "ncclBroadcast"));
    if (space == MemorySpace::kHost && rank_ != 0)
      DH_CUDA_CHECK(cudaMemcpyAsync(data, buf, bytes, cudaMemcpyDeviceToHost, stream_));
    return WaitStream(deadline, "Broadcast");
  }

  absl::Status Gather(const void* send, size_t bytes, void* recv, MemorySpace space,
                      std::chrono::milliseconds timeout) override {
    DH_RETURN_IF_ERROR(Usable());
    if (bytes == 0) return absl::OkStatus();
    const auto deadline = Clock::now() + timeout;
    DH_CUDA_CHECK(cudaSetDevice(device_));
    const void* dsend = send;
    void* drecv = recv;
    if (space == MemorySpace::kHost) {
      DH_RETURN_IF_ERROR(Reserve(&dsend_, &send_cap_, bytes));
      DH_CUDA_CHECK(cudaMemcpyAsync(dsend_, send, bytes, cudaMemcpyHostToDevice, stream_));
      dsend = dsend_;
      if (rank_ == 0) {
        DH_RETURN_IF_ERROR(Reserve(&drecv_, &recv_cap_, bytes * world_));
        drecv = drecv_;
      }
    }
    // Point to point into rank 0 (a gather, not an all-gather: only rank 0 needs the results).
    DH_NCCL_CHECK(ncclGroupStart());
    if (rank_ == 0) {
      DH_CUDA_CHECK(cudaMemcpyAsync(drecv, dsend, bytes, cudaMemcpyDeviceToDevice, stream_));
      for (int r = 1; r < world_; ++r)
        DH_NCCL_CHECK(ncclRecv(static_cast<uint8_t*>(drecv) + static_cast<size_t>(r) * bytes,
                               bytes, ncclUint8, r, comm_, stream_));
    } else {
      DH_NCCL_CHECK(ncclSend(dsend, bytes, ncclUint8, 0, comm_, stream_));
    }
    DH_NCCL_CHECK(ncclGroupEnd());
    DH_RETURN_IF_ERROR(WaitComm(deadline, "ncclGroupEnd (gather)"));
    if (space == MemorySpace::kHost && rank_ == 0)
      DH_CUDA_CHECK(cudaMemcpyAsync(recv, drecv, bytes * world_, cudaMemcpyDeviceToHost, stream_));
    return WaitStream(deadline, "Gather");
  }

 private:
  static constexpr const char* kUidKey = "nccl/uid";

  absl::Status Fail(absl::Status s) {
    if (!s.ok() && !broken_) {
      broken_ = true;
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    return GroupFailure(s);
  }

  absl::Status Usable() const {
    if (broken_)
      return absl::UnavailableError(
          absl::StrCat("nccl (rank ", rank_, "): the collective failed earlier and was aborted"));
    return absl::OkStatus();
  }

  absl::Status Reserve(void** p, size_t* cap, size_t bytes) {
    if (bytes <= *cap) return absl::OkStatus();
    if (*p) cudaFree(*p);
    *p = nullptr;
    *cap = 0;
    DH_CUDA_CHECK(cudaMalloc(p, bytes));
    *cap = bytes;
    return absl::OkStatus();
  }

  // Until the communicator has no call in progress (a non-blocking init or enqueue).
  absl::Status WaitComm(Clock::time_point deadline, const char* what) {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      DH_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
      if (st == ncclSuccess) return absl::OkStatus();
      if (st != ncclInProgress)
        return Fail(NcclCallStatus(st, what, __FILE__, __LINE__, rank_, &comm_));
      if (Clock::now() >= deadline)
        return Fail(absl::DeadlineExceededError(
            absl::StrCat("nccl (rank ", rank_, "): ", what, " did not complete in time")));
      std::this_thread::yield();
    }
  }

  // Until the stream's work is done, watching the communicator for asynchronous errors.
  absl::Status WaitStream(Clock::time_point deadline, const char* what) {
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Fail(CudaCallStatus(q, what, __FILE__, __LINE__, rank_));
      ncclResult_t st = ncclSuccess;
      DH_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
      if (st != ncclSuccess && st != ncclInProgress)
        return Fail(NcclCallStatus(st, what, __FILE__, __LINE__, rank_, &comm_));
      if (Clock::now() >= deadline)
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            "nccl (rank ", rank_, "): ", what, " timed out waiting for the peers")));
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  int rank_, world_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool broken_ = false;
  void* dsend_ = nullptr;
  void* drecv_ = nullptr;
  size_t send_cap_ = 0, recv_cap_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(int rank, int world, int device,
                                                              KvClient& store,
                                                              std::chrono::milliseconds timeout) {
  if (world < 1 || rank < 0 || rank >= world)
    return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", rank, " of world ", world));
  auto c = std::make_unique<NcclCollective>(rank, world, device);
  DH_RETURN_IF_ERROR(c->Init(store, timeout));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace drafthead
