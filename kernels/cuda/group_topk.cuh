// Epilogue family "group": TOP_K rows with k <= kGroupTopK where n_valid <= kGroupMaxCols and the
// split path is on (shard_reduce.cu's dispatch; session 16, docs/cuda.md round 6), in two kernels
// that keep the keys exact, the softmax partial within the tests' tolerance and the rows
// batch-invariant. Internal to the epilogue (shard_reduce.cu validates the arguments).
//   GroupScan: one warp a group of 128 columns (a float4 a lane), no barrier and no shared memory:
//     the group's largest TopKKey, its max of v / T (first of equals) and its sum of exponentials
//     relative to that max (fp32, one fixed pairwise tree: < 7 x 2^-24 of the group's sum), 24
//     bytes to scratch; the max and key by redux.sync.
//   GroupMerge: one CTA a row over its group records: the row's max and sum (a fixed order), the
//     exact k-th largest group key t (a lower bound for the row's k-th largest key: k groups hold
//     a key >= t), then only the k groups with keys >= t are read again for their candidates.
// Against the split family (split_reduce.cuh) at 64 rows: one read of the logits with warp-local
// work instead of per-CTA sorts and five barriers, and a merge that reads k x 128 logits a row.
// Results depend on n_valid alone (groups are fixed columns): bit-identical keys to the CPU, the
// sum within the tests' tolerance, batch-invariant.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda::epilogue {

inline constexpr uint32_t kGroupTopK = 16;   // the largest k the group path serves
inline constexpr int64_t kGroupMaxCols = 262144;  // n_valid it serves (<= 8 group records a thread)

// Scratch bytes for nrows rows of n_valid columns (the group records).
size_t GroupTopKScratchBytes(int64_t n_valid, int nrows);

// TOP_K rows with 1 <= k <= kGroupTopK; other rows' CTAs return at once. cudaErrorInvalidValue
// when n_valid > kGroupMaxCols or scratch_bytes is short. Both kernels are programmatic dependents.
cudaError_t LaunchGroupTopK(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                            const ReduceRow* rows, int nrows, uint8_t* payload, void* scratch,
                            size_t scratch_bytes, cudaStream_t stream);

}  // namespace drafthead::cuda::epilogue
