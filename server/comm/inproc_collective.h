// An in-process Collective for unit tests: `world` ranks as threads of one process, exchanging
// through shared memory with a generation barrier. Honors timeouts (UNAVAILABLE, as every
// Collective's group failure) so tests can exercise a rank that stops answering. With
// device_memory it also takes MemorySpace::kDevice buffers (for device doubles whose "device
// memory" is host memory: the engine's device paths on machines without a GPU).
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/comm/collective.h"

namespace drafthead::testing {

class InProcGroup {
 public:
  explicit InProcGroup(int world) : world_(world), slots_(world) {}

  // Every rank calls with its buffer; the last arrival runs fn over all slots, then all leave.
  absl::Status Exchange(int rank, void* buf, size_t bytes, std::chrono::milliseconds timeout,
                        const std::function<void(std::vector<std::pair<void*, size_t>>&)>& fn) {
    absl::MutexLock l(&mu_);
    if (broken_) return absl::UnavailableError("inproc: group broken");
    const uint64_t gen = gen_;
    slots_[rank] = {buf, bytes};
    if (++arrived_ == world_) {
      fn(slots_);
      arrived_ = 0;
      ++gen_;
      cv_.SignalAll();
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    while (gen_ == gen && !broken_) {
      if (cv_.WaitWithDeadline(&mu_, deadline) && gen_ == gen && !broken_) {
        broken_ = true;
        cv_.SignalAll();
        return absl::UnavailableError(absl::StrCat("inproc: rank ", rank, " timed out waiting for the group"));
      }
    }
    if (broken_ && gen_ == gen) return absl::UnavailableError("inproc: group broken");
    return absl::OkStatus();
  }

 private:
  const int world_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when a generation completes or the group breaks
  std::vector<std::pair<void*, size_t>> slots_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t gen_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

class InProcCollective : public Collective {
 public:
  InProcCollective(std::shared_ptr<InProcGroup> g, int rank, int world, bool device_memory = false)
      : g_(std::move(g)), rank_(rank), world_(world), device_memory_(device_memory) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "inproc"; }
  bool AcceptsDeviceMemory() const override { return device_memory_; }

  absl::Status Broadcast(void* data, size_t bytes, MemorySpace space,
                         std::chrono::milliseconds timeout) override {
    if (space != MemorySpace::kHost && !device_memory_)
      return absl::InvalidArgumentError("inproc: host memory only");
    return g_->Exchange(rank_, data, bytes, timeout, [](auto& s) {
      for (size_t r = 1; r < s.size(); ++r) std::memcpy(s[r].first, s[0].first, s[0].second);
    });
  }

  absl::Status Gather(const void* send, size_t bytes, void* recv, MemorySpace space,
                      std::chrono::milliseconds timeout) override {
    if (space != MemorySpace::kHost && !device_memory_)
      return absl::InvalidArgumentError("inproc: host memory only");
    // Slot 0 carries rank 0's recv buffer; others their send buffers.
    if (rank_ == 0) {
      std::memcpy(recv, send, bytes);
      return g_->Exchange(0, recv, bytes, timeout, [](auto& s) {
        for (size_t r = 1; r < s.size(); ++r)
          std::memcpy(static_cast<char*>(s[0].first) + r * s[0].second, s[r].first, s[r].second);
      });
    }
    return g_->Exchange(rank_, const_cast<void*>(send), bytes, timeout, [](auto& s) {
      for (size_t r = 1; r < s.size(); ++r)
        std::memcpy(static_cast<char*>(s[0].first) + r * s[0].second, s[r].first, s[r].second);
    });
  }

 private:
  std::shared_ptr<InProcGroup> g_;
  int rank_, world_;
  bool device_memory_;
};

}  // namespace drafthead::testing
