// Internal to kernels/cuda, for the experimental epilogue variants
// (kernels/cuda/experimental/epilogue_variants.cu); not part of the API (shard_reduce.cuh is).
// Defined in shard_reduce.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda::detail {

// Who serves TOP_K k <= kGroupTopK where the split path is on (ShardEpilogueWithSplitChunk).
enum class GroupTopK {
  kOff,  // the split path
  kOn,   // the group family (ShardEpilogue)
};

// ShardEpilogue with the split path's columns per CTA forced, for the comparisons in
// kernels/cuda/experimental/ (bench and tests): 0 picks by shape (ShardEpilogue), -1 turns the
// split path off (every row on the one-CTA-a-row kernels), 512..4096 a fixed chunk (raised where
// the row would need more than the split path's chunk limit; off past 4096); group: GroupTopK.
cudaError_t ShardEpilogueWithSplitChunk(const float* y, int64_t ldy, int64_t n_shard,
                                        int64_t n_valid, int32_t id_base,
                                        const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                                        void* scratch, size_t scratch_bytes, cudaStream_t stream,
                                        const ReduceRow* rows_host, int split_chunk,
                                        GroupTopK group);

}  // namespace drafthead::cuda::detail
