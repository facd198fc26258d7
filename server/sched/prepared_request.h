// The unit of work the scheduler queues: a request already validated at the API edge, reduced to
// its row task and bf16 rows; and what the batch loop hands back when the request's rows are done.
// Free of the API's proto types, so the scheduler knows nothing of how requests arrive or leave.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "server/group/shard_geometry.h"
#include "server/group/stage_times.h"
#include "server/group/wire_format.h"

namespace drafthead {

// An allocator whose resize leaves new elements uninitialized: the request's rows are decoded
// into their buffer right after it is sized, so zeroing it first would write every byte twice
// (drafthead-bench-request: ~30 % of the edge's time at 5..64 rows).
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using HiddenRows = std::vector<uint16_t, UninitializedAllocator<uint16_t>>;

struct PreparedRequest {
  uint64_t request_id = 0;
  uint32_t rows = 0;
  RowTask task{};               // shared by the request's rows (row_in_request set per row)
  HiddenRows x;                 // bf16 bits [rows, hidden]
};

// One request's share of a finished batch. Every pointer is valid only during the completion
// callback that receives it (the gathered buffer is reused by a later batch).
struct BatchRowsResult {
  const PayloadLayout* layout = nullptr;  // the batch's per-rank payload layout
  const uint8_t* gathered = nullptr;      // world blocks of per_rank_bytes
  size_t per_rank_bytes = 0;
  const ShardGeometry* geometry = nullptr;  // any rank's geometry (the group's S, tp and crop)
  uint32_t row0 = 0;        // this request's first row in the batch
  uint32_t batch_rows = 0;  // rows in the whole batch
  uint32_t queue_us = 0;    // enqueue -> batch start
  uint32_t compute_us = 0;  // the batch across the group
  StageTimes stages;        // where the batch's compute_us went
  bool logits_on_device = false;  // the backend wrote this request's logits to its device destination
};

}  // namespace drafthead
