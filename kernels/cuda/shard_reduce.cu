// The epilogue's entry point: validation, scratch layout, and which kernel family serves which
// rows (the families are in full_logits, group_topk, split_reduce, topk_select and best_row).
#include "kernels/cuda/shard_reduce.cuh"

#include <algorithm>

#include "kernels/cuda/best_row.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/full_logits.cuh"
#include "kernels/cuda/group_topk.cuh"
#include "kernels/cuda/shard_reduce_internal.cuh"
#include "kernels/cuda/split_reduce.cuh"
#include "kernels/cuda/topk_select.cuh"

namespace drafthead::cuda {

using epilogue::kGroupTopK;
using epilogue::kSmallTopK;

namespace {

// Scratch: the TOP_K segments' records, the split path's chunk records, then (16-byte aligned)
// the group family's records where it may serve (n_valid <= kGroupMaxCols).
size_t SegmentAndSplitBytes(int64_t n_valid, int nrows) {
  return epilogue::TopKSelectScratchBytes(n_valid, nrows) + epilogue::SplitReduceScratchBytes(nrows);
}
size_t GroupScratchOffset(int64_t n_valid, int nrows) {
  return (SegmentAndSplitBytes(n_valid, nrows) + 15) / 16 * 16;
}

}  // namespace

size_t EpilogueScratchBytes(int64_t n_valid, int nrows) {
  if (n_valid > epilogue::kGroupMaxCols) return SegmentAndSplitBytes(n_valid, nrows);
  return GroupScratchOffset(n_valid, nrows) + epilogue::GroupTopKScratchBytes(n_valid, nrows);
}

cudaError_t ValidateReduceRows(const ReduceRow* rows, int nrows) {
  for (int i = 0; i < nrows; ++i) {
    const ReduceRow& r = rows[i];
    if (r.out_offset % 16 != 0 || r.y_row < 0) return cudaErrorInvalidValue;
    switch (static_cast<ReduceMode>(r.mode)) {
      case ReduceMode::kFullLogits:
        break;
      case ReduceMode::kTopK:
        if (r.k < 1 || r.k > kMaxTopK || !(r.temperature > 0)) return cudaErrorInvalidValue;
        break;
      case ReduceMode::kArgmax:
        if (r.k != 1) return cudaErrorInvalidValue;
        break;
      case ReduceMode::kSample:
        if (r.k != 1 || !(r.temperature > 0)) return cudaErrorInvalidValue;
        break;
      default:
        return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

namespace {

enum : uint32_t {
  kLaunchFull = 1, kLaunchSplit = 2, kLaunchBestPerRow = 4, kLaunchTopKSelect = 8, kLaunchGroup = 16
};

// Whether the group family serves TOP_K k <= kGroupTopK at this split chunk: only beside the split
// path (chunk 0 is variant 1's round-1 kernels for every row), as it was measured and tested.
bool GroupServes(int64_t n_valid, int chunk, bool group_topk) {
  return group_topk && chunk > 0 && n_valid <= epilogue::kGroupMaxCols;
}

// The kernel families the rows need at this split chunk; every family when the host copy of the
// descriptors is not given.
uint32_t Launches(int chunk, bool group, const ReduceRow* rows_host, int nrows) {
  if (rows_host == nullptr)
    return kLaunchFull | kLaunchTopKSelect | (chunk > 0 ? kLaunchSplit : kLaunchBestPerRow) |
           (group ? kLaunchGroup : 0);
  uint32_t m = 0;
  for (int i = 0; i < nrows; ++i) {
    const ReduceRow& r = rows_host[i];
    const auto mode = static_cast<ReduceMode>(r.mode);
    if (group && mode == ReduceMode::kTopK && r.k >= 1 && r.k <= kGroupTopK) {
      m |= kLaunchGroup;
      continue;
    }
    if (mode == ReduceMode::kFullLogits) m |= kLaunchFull;
    const bool best = mode == ReduceMode::kArgmax || mode == ReduceMode::kSample;
    const bool small = mode == ReduceMode::kTopK && r.k >= 1 && r.k <= kSmallTopK;
    if (chunk > 0 && (best || small)) m |= kLaunchSplit;
    if (chunk == 0 && best) m |= kLaunchBestPerRow;
    if (mode == ReduceMode::kTopK && (chunk == 0 || !small)) m |= kLaunchTopKSelect;
  }
  return m;
}

}  // namespace

uint32_t EpilogueLaunches(int64_t n_valid, const ReduceRow* rows_host, int nrows) {
  const int chunk = epilogue::SplitChunk(n_valid, 0);
  return Launches(chunk, GroupServes(n_valid, chunk, true), rows_host, nrows);
}

cudaError_t ShardEpilogue(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                          int32_t id_base, const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          const ReduceRow* rows_host) {
  return detail::ShardEpilogueWithSplitChunk(y, ldy, n_shard, n_valid, id_base, rows_dev, nrows,
                                             payload, scratch, scratch_bytes, stream, rows_host, 0,
                                             detail::GroupTopK::kOn);
}

namespace detail {

cudaError_t ShardEpilogueWithSplitChunk(const float* y, int64_t ldy, int64_t n_shard,
                                        int64_t n_valid, int32_t id_base,
                                        const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                                        void* scratch, size_t scratch_bytes, cudaStream_t stream,
                                        const ReduceRow* rows_host, int split_chunk,
                                        GroupTopK group_topk) {
  if (nrows <= 0) return cudaSuccess;
  if (ldy % 4 != 0 || n_valid > n_shard || n_valid < 0 || n_shard < 1 || ldy < n_shard ||
      (reinterpret_cast<uintptr_t>(y) & 15u) != 0 || nrows > 65535)
    return cudaErrorInvalidValue;
  if (scratch == nullptr || scratch_bytes < EpilogueScratchBytes(n_valid, nrows))
    return cudaErrorInvalidValue;
  const int chunk = split_chunk < 0 ? 0 : epilogue::SplitChunk(n_valid, split_chunk);
  const bool group = GroupServes(n_valid, chunk, group_topk != GroupTopK::kOff);
  const uint32_t launches = Launches(chunk, group, rows_host, nrows);
  const bool any_full = launches & kLaunchFull, any_split = launches & kLaunchSplit,
             any_best_old = launches & kLaunchBestPerRow, any_large = launches & kLaunchTopKSelect,
             any_group = launches & kLaunchGroup;
  if (any_full)
    DH_CUDA_TRY(epilogue::LaunchFullLogits(y, ldy, n_shard, rows_dev, nrows, payload, stream));
  uint8_t* seg_scratch = static_cast<uint8_t*>(scratch);
  uint8_t* split_scratch = seg_scratch + epilogue::TopKSelectScratchBytes(n_valid, nrows);
  // The split path leaves the group family's rows (k below its min_k).
  if (any_split)
    DH_CUDA_TRY(epilogue::LaunchSplitReduce(y, ldy, n_valid, id_base, rows_dev, nrows, payload,
                                            chunk, group ? kGroupTopK + 1 : 1, split_scratch, stream));
  if (any_best_old)
    DH_CUDA_TRY(epilogue::LaunchBestPerRow(y, ldy, n_valid, id_base, rows_dev, nrows, payload,
                                           stream));
  if (any_large)
    DH_CUDA_TRY(epilogue::LaunchTopKSelect(y, ldy, n_valid, id_base, rows_dev, nrows, payload,
                                           seg_scratch, chunk > 0 ? kSmallTopK + 1 : 1, stream));
  // Last, as measured and tested as experimental variant 6 (session 15-16).
  if (!any_group) return cudaSuccess;
  const size_t off = GroupScratchOffset(n_valid, nrows);
  return epilogue::LaunchGroupTopK(y, ldy, n_valid, id_base, rows_dev, nrows, payload,
                                   seg_scratch + off, scratch_bytes - off, stream);
}

}  // namespace detail
}  // namespace drafthead::cuda
