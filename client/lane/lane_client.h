// A same-host lane as the C++ client library uses it: LaneRing (the shared-memory rings and an
// arena) plus OpenLane / CloseLane over gRPC, and the conversion between a LogitsRequest with its
// hidden bytes and a lane descriptor (rows copied into the slot's arena area, answers read back
// into a LogitsResponse). DraftHeadClient::Compute goes through it when ClientOptions::lane allows.
//
// Contract: thread-safe (up to `depth` calls at once, more wait for a slot). Failure: the lane's
// own (DEADLINE_EXCEEDED, UNAVAILABLE once the server is gone) and the server's answer status;
// Open fails with the server's reason (FAILED_PRECONDITION when lanes are off, INVALID_ARGUMENT
// when the server cannot open the object, e.g. on another host).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/lane/lane_ring.h"
#include "drafthead/v1/drafthead.grpc.pb.h"

namespace drafthead::client {

// How a client reaches the server: a lane when it can, never, or only a lane.
enum class LaneMode { kAuto, kOff, kRequired };

struct LaneClientOptions {
  uint32_t depth = 8;
  // A waiting call spins this long (ns), then sleeps on the doorbell; -1 (lane::kSpinAuto): for
  // 1.5x the lane's recent call time when it is the only call in flight, 50 us .. 2 ms; else
  // 200 us (LaneRing::Wait).
  int64_t spin_ns = -1;
};

// This host's boot id, compared with ModelInfo.host_id ("same host?").
std::string LocalHostId();

// The OpenLane request for `ring` from this process, its arena (when it has one) registered as the
// lane's region 0 under `arena_name`.
v1::OpenLaneRequest OpenLaneRequestFor(const lane::LaneRing& ring, const std::string& arena_name);

class LaneClient {
 public:
  // Opens a lane sized for the server's shapes (info: hidden_size, vocab_size, max_rows, max_top_k).
  static absl::StatusOr<std::unique_ptr<LaneClient>> Open(v1::DraftHead::Stub* stub, const v1::ModelInfo& info,
                                                          const LaneClientOptions& options);
  ~LaneClient();  // CloseLane (bounded), then the objects go

  // Whether `req` can travel the lane (its hidden rows inline, no caller regions).
  static bool Carries(const v1::LogitsRequest& req);
  // One call. An answer's in-band error is the returned status.
  absl::StatusOr<v1::LogitsResponse> Compute(const v1::LogitsRequest& req, absl::Time deadline);

  // The same in two halves, for a caller keeping several calls in flight from one thread (the load
  // tester): Start copies the rows in and publishes; Finish waits for that call's answer. Every
  // started call must be finished (in any order). Start waits (up to its deadline) for slot
  // n % depth to be free, i.e. for call n - depth to be finished: a thread holding unfinished
  // calls should give Start no time (a past deadline: RESOURCE_EXHAUSTED at once) and finish its
  // own first, or threads pipelining on one lane can wait on each other for ever.
  struct Pending {
    uint64_t seq = 0;
    v1::Mode mode = v1::FULL_LOGITS;
    uint64_t logits_bytes = 0;
  };
  absl::StatusOr<Pending> Start(const v1::LogitsRequest& req, absl::Time deadline);
  // copy_logits = false leaves a FULL_LOGITS answer's logits out of the response (the load tester
  // measures the transport, as its gRPC path skips the logits bytes without copying them).
  absl::StatusOr<v1::LogitsResponse> Finish(const Pending& call, absl::Time deadline, bool copy_logits = true);

  uint64_t lane_id() const { return lane_id_; }
  const lane::LaneRing& ring() const { return *ring_; }

 private:
  LaneClient() = default;
  v1::DraftHead::Stub* stub_ = nullptr;
  std::unique_ptr<lane::LaneRing> ring_;
  uint64_t lane_id_ = 0;
  uint32_t hidden_size_ = 0;
  uint32_t vocab_size_ = 0;
};

}  // namespace drafthead::client
