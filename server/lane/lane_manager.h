// Same-host lanes (docs/lane.md): a caller on this host hands requests to the server through a
// shared-memory ring it created (common/lane/lane_layout.h) instead of one gRPC call each. Opened
// and closed over gRPC (OpenLane / CloseLane, server/api/service.cc); every request a lane carries
// goes through the same validation, batcher and response building as ComputeLogits, by being
// submitted as the LogitsRequest it describes (hidden rows and outputs as slices of the lane's
// regions), so its answer is the gRPC answer bit for bit.
//
// Contract
// - Ownership: the manager owns each lane's mapping, its server thread, its regions (registered in
//   the RegionRegistry at open under the caller's names, unregistered at close) and a pidfd on the
//   caller. A lane's mapping outlives every request it carries (requests in flight hold it).
// - Threads: one server thread per open lane, spinning up to `spin` after its last work, then
//   sleeping on the lane's doorbell futex (woken by the caller, or every kLaneTick to check that
//   the caller lives). Open / Close / stats are thread-safe (gRPC threads). Completions are written
//   by whichever thread completes the request (lane thread inline, batch loop, completer).
// - Failure: every descriptor is untrusted input: a bad one is answered INVALID_ARGUMENT in its
//   completion slot, never read twice, never followed outside the lane's own regions. The caller's
//   death (pidfd readable) closes its lane within kLaneTick (+ the requests in flight, which are
//   cancelled if still queued). Open errors: lanes off FAILED_PRECONDITION naming --lanes; all
//   --lanes in use RESOURCE_EXHAUSTED; a bad object (missing, not 0600, not this uid, wrong size,
//   magic, version, nonce, geometry) or pid INVALID_ARGUMENT with the reason; region errors as the
//   registry gives them. Close of an unknown id NOT_FOUND.
// - Bounds: at most max_lanes lanes; per lane at most `depth` requests in flight (a slot still
//   being answered is not taken again).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "drafthead/v1/drafthead.pb.h"
#include "common/lane/lane_layout.h"
#include "server/lane/lane_descriptor.h"
#include "server/regions/region_registry.h"
#include "server/sched/batcher.h"

namespace drafthead {

inline constexpr std::chrono::milliseconds kLaneTick{100};

// How the lane hands a request on (DraftHeadService::Submit in the server): `done` exactly once.
using LaneSubmitFn = std::function<void(const v1::LogitsRequest& req, CallControl call,
                                        std::function<void(const absl::Status&, v1::LogitsResponse*)> done)>;

struct LaneOptions {
  uint32_t max_lanes = 0;  // --lanes (0: off)
  uint32_t max_rows = 64;  // the serving limits (ParseDescriptor sizes answers within them)
  uint32_t max_top_k = 256;
  std::chrono::microseconds spin{50};  // --lane-spin-us: busy-poll this long after the last work
};

struct LaneStats {
  uint64_t open = 0, opened = 0, closed_by_caller_exit = 0;
  uint64_t requests = 0, bad_descriptors = 0;
  uint64_t spin_hits = 0;  // descriptors found while spinning (no sleep needed)
  uint64_t wakeups = 0;    // sleeps ended by the caller's doorbell
  uint64_t doorbells = 0;  // completions that rang the caller's doorbell (it slept)
};

class LaneManager {
 public:
  LaneManager(LaneOptions options, regions::RegionRegistry* regions, LaneSubmitFn submit);
  ~LaneManager();  // closes every lane
  LaneManager(const LaneManager&) = delete;
  LaneManager& operator=(const LaneManager&) = delete;

  bool enabled() const { return options_.max_lanes > 0; }
  uint32_t max_lanes() const { return options_.max_lanes; }
  const LaneOptions& options() const { return options_; }

  absl::StatusOr<v1::OpenLaneResponse> Open(const v1::OpenLaneRequest& req);
  absl::Status Close(uint64_t lane_id);
  // Closes every lane (shutdown): their callers see server_state = closed.
  void CloseAll();

  LaneStats stats() const;
  // Prometheus text for the lane families (appended to /metrics).
  void RenderMetrics(std::string* out) const;

  class Lane;  // lane_manager.cc

 private:
  void Handle(std::shared_ptr<Lane> lane, uint64_t n, const lane::LaneRequest& d, bool last,
              const absl::Status& fence);
  absl::Status AwaitFence(Lane& lane, uint64_t n, const lane::LaneRequest& d);
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnLaneExit(uint64_t id);

  const LaneOptions options_;
  regions::RegionRegistry* const regions_;
  const LaneSubmitFn submit_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Lane>> exited_ ABSL_GUARDED_BY(mu_);  // threads still to join
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  struct Counters {
    std::atomic<uint64_t> opened{0}, caller_exits{0}, requests{0}, bad{0}, spin_hits{0},
        wakeups{0}, doorbells{0};
  };
  std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();
};

}  // namespace drafthead
