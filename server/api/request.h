// The RPC edge's way in: a LogitsRequest validated into a PreparedRequest (row task and bf16
// rows), every malformed field refused by name. Pure functions, no threads. Its own library
// (drafthead_request) so that drafthead-fake-server validates with this very code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "drafthead/v1/drafthead.pb.h"
#include "server/sched/prepared_request.h"

namespace drafthead {

struct ServingLimits {
  int64_t hidden = 0;
  int64_t vocab_size = 0;
  uint32_t max_rows = 64;
  uint32_t max_top_k = 256;
  bool has_bf16 = false;
};

// INVALID_ARGUMENT naming the field for every malformed request.
absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits);

}  // namespace drafthead
