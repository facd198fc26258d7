// The RPC edge's way out: every rank's gathered payload combined into one request's
// LogitsResponse (full logits concatenated and cropped, candidates merged, probs normalized).
// Pure functions, no threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "drafthead/v1/drafthead.pb.h"
#include "server/request/request.h"
#include "server/group/shard_geometry.h"
#include "server/group/wire_format.h"
#include "server/sched/prepared_request.h"

namespace drafthead {

// Fills `resp` for the request whose rows are [row0, row0 + rows) of the batch, from every rank's
// payload (`gathered`: world blocks of `per_rank_bytes`, rows at `layout`'s offsets). `geo` is any
// rank's geometry (the group's S, tp and crop). `logits_out` non-null: FULL_LOGITS rows go there
// (rows x vocab_size x dtype bytes, host memory) and resp->logits stays empty.
void CombineResponse(const PreparedRequest& req, uint32_t row0, const PayloadLayout& layout,
                     const uint8_t* gathered, size_t per_rank_bytes, const ShardGeometry& geo,
                     v1::LogitsResponse* resp, uint8_t* logits_out = nullptr);

// CombineResponse from a batch result, plus the response's Timing (the batch's stages; the
// request's own validate / combine / server times are the caller's).
void BuildResponse(const PreparedRequest& req, const BatchRowsResult& result,
                   v1::LogitsResponse* resp);

// BuildResponse for a request whose FULL_LOGITS go into a region (`dest`, pinned at validation):
// straight into a host region; into a CUDA region by one strided host -> device copy a rank from
// the gathered payload (RegionAccess::WriteRows); not at all when the backend copied them there
// from the device (result.logits_on_device). NOT_FOUND when the region was unregistered while the
// request waited: nothing is written then.
absl::Status BuildResponse(const PreparedRequest& req, const BatchRowsResult& result,
                           const LogitsDestination& dest, v1::LogitsResponse* resp);

}  // namespace drafthead
