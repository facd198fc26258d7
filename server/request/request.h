// The RPC edge's way in: a LogitsRequest validated into a PreparedRequest (row task and bf16
// rows), every malformed field refused by name. Pure functions, no threads. Its own library
// (drafthead_request) so that drafthead-fake-server validates with this very code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "drafthead/v1/drafthead.pb.h"
#include "server/regions/region_registry.h"
#include "server/sched/prepared_request.h"

namespace drafthead {

struct ServingLimits {
  int64_t hidden = 0;
  int64_t vocab_size = 0;
  uint32_t max_rows = 64;
  uint32_t max_top_k = 256;
  bool has_bf16 = false;
};

// INVALID_ARGUMENT naming the field for every malformed request. A request naming a region
// (hidden_region, logits_region) gets FAILED_PRECONDITION naming --shared-memory here.
absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits);

// Where a FULL_LOGITS request that named logits_region has its logits written: the region, pinned
// from validation to completion (pinning keeps the record, not the mapping: see RegionRef), and
// the slice, already checked against the region and against rows x vocab_size x dtype.
struct LogitsDestination {
  regions::RegionRef region;  // empty: the logits go in the response
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// As above, with regions served from `regions`: hidden rows are read (and validated) from
// hidden_region now, and a logits_region is checked and pinned into *logits_dest. The region
// errors: kind or flag off FAILED_PRECONDITION, unknown NOT_FOUND, bad slice INVALID_ARGUMENT
// naming the field (see server/regions/region_registry.h). Thread-safe.
absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits,
                                               const regions::RegionRegistry* regions,
                                               LogitsDestination* logits_dest);

// A RegisterRegionRequest as the registry takes it (INVALID_ARGUMENT for an unknown kind). The
// native RegisterRegion RPC and a lane's regions (OpenLaneRequest.regions) both go through it.
absl::StatusOr<regions::RegionSpec> RegionSpecFromProto(const v1::RegisterRegionRequest& req);

}  // namespace drafthead
