// A lane descriptor (common/lane/lane_layout.h LaneRequest, copied out of shared memory once) read
// into the LogitsRequest it describes. Pure functions, no threads; fuzzed (tests/fuzz_lane.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/lane/lane_layout.h"
#include "drafthead/v1/drafthead.pb.h"

namespace drafthead {

struct LaneLimits {
  uint32_t max_rows = 64;
  uint32_t max_top_k = 256;
  uint32_t inline_bytes = 0;  // the lane's inline answer area per completion slot
};

struct ParsedDescriptor {
  v1::LogitsRequest req;  // hidden_region (and FULL_LOGITS' logits_region) name the lane's regions
  // Token answers (TOP_K, ARGMAX, SAMPLE): into this slice of a region (tokens_region non-empty),
  // else inline. Sizes checked: the slice or the inline area holds token_bytes.
  std::string tokens_region;
  uint64_t tokens_offset = 0;
  uint64_t token_bytes = 0;
  bool ids64 = false;       // token ids as int64 (kFlagIds64)
  uint32_t timeout_us = 0;  // 0: none
};

// INVALID_ARGUMENT naming the descriptor's field (hidden, output, rows, top_k, ...) for a region
// index outside `region_names`, a missing or too small output, or an inline answer that does not
// fit; everything else (modes, dtypes, k, temperature, slice bounds) is left to PrepareRequest so
// that a lane refuses exactly what ComputeLogits refuses.
absl::StatusOr<ParsedDescriptor> ParseDescriptor(const lane::LaneRequest& d,
                                                 const std::vector<std::string>& region_names,
                                                 const LaneLimits& limits);

// The caller-written constant part of a lane header (copied out once) against what OpenLane said:
// magic, version, nonce, pid, depth, inline size and the geometry they imply, which must also be
// the object's size. INVALID_ARGUMENT naming the OpenLaneRequest field.
absl::Status CheckLaneHeader(const lane::LaneHeader& h, uint64_t byte_size, uint64_t nonce, int32_t pid);

}  // namespace drafthead
