// The epilogue's dispatch alternatives (kernels/cuda/shard_reduce.cuh), for drafthead-bench-cuda
// and cuda_kernels_test only (drafthead_kernels_cuda_experimental). Every variant computes the same
// payload; they differ in which kernels serve which rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda {

// ShardEpilogue with variant: 0 the default dispatch (ShardEpilogue: TOP_K k <= 16 on the group
// family, group_topk.cuh; the rest on the split path, chunk chosen by shape); 1 the round-1 kernels
// (one CTA per row for everything); 2 / 4 / 3 / 5 the split path with 512 / 1024 / 2048 /
// 4096-column chunks and 6 with the chunk chosen by shape (the default before the group family,
// session 16), all three serving TOP_K k <= 16 on the split path. Other variants (7, the group
// family's merge fused into its scan, was slower and removed: docs/cuda.md round 6, run 4):
// cudaErrorInvalidValue. scratch_bytes: at least EpilogueScratchBytes.

cudaError_t ShardEpilogueVariant(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                                 int32_t id_base, const ReduceRow* rows_dev, int nrows,
                                 uint8_t* payload, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream, const ReduceRow* rows_host, int variant);

}  // namespace drafthead::cuda
