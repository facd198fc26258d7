// A lane's stream-ordered calls for a caller on a GPU (lane_cuda.cc says how). Owns the lane
// object's registration with the device and a watchdog thread that answers outstanding requests
// UNAVAILABLE once the server is gone (so no GPU stream waits forever). Not thread-safe beyond the
// LaneRing's own guarantees: Fence / WaitOn from the thread that owns the stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "client/lane/lane_ring.h"

namespace drafthead::lane {

class LaneCuda {
 public:
  LaneCuda() = default;
  ~LaneCuda();  // stops the watchdog, unregisters (call before the ring goes)
  LaneCuda(const LaneCuda&) = delete;
  LaneCuda& operator=(const LaneCuda&) = delete;

  // Registers the ring's object with the current CUDA context. FAILED_PRECONDITION without CUDA.
  LaneError Attach(LaneRing* ring);
  // On `stream` (a CUstream): seq's fence word <- seq + 1, after the stream's earlier work.
  LaneError Fence(uint64_t seq, void* stream);
  // On `stream`: wait until seq's answer is published (done_seq == seq + 1).
  LaneError WaitOn(uint64_t seq, void* stream);

 private:
  LaneRing* ring_ = nullptr;
  void* registered_ = nullptr;
  unsigned long long device_base_ = 0;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace drafthead::lane
