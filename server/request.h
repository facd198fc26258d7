// The RPC edge's data path: a LogitsRequest validated into row tasks and bf16 rows, and every
// rank's gathered payload combined back into a LogitsResponse. Pure functions, no threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "drafthead/v1/drafthead.pb.h"
#include "server/batch.h"
#include "server/shard.h"

namespace drafthead {

struct ServingLimits {
  int64_t hidden = 0;
  int64_t vocab_size = 0;
  uint32_t max_rows = 64;
  uint32_t max_top_k = 256;
  bool has_bf16 = false;
};

struct PreparedRequest {
  uint64_t request_id = 0;
  uint32_t rows = 0;
  RowTask task{};               // shared by the request's rows (row_in_request set per row)
  std::vector<uint16_t> x;      // bf16 bits [rows, hidden]
};

// INVALID_ARGUMENT naming the field for every malformed request.
absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits);

// Fills `resp` for the request whose rows are [row0, row0 + rows) of the batch, from every rank's
// payload (`gathered`: world blocks of `per_rank_bytes`, rows at `layout`'s offsets). `geo` is any
// rank's geometry (the group's S, tp and crop).
void CombineResponse(const PreparedRequest& req, uint32_t row0, const PayloadLayout& layout,
                     const uint8_t* gathered, size_t per_rank_bytes, const ShardGeometry& geo,
                     v1::LogitsResponse* resp);

}  // namespace drafthead
