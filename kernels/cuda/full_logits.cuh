// Epilogue family FULL_LOGITS: each such row's n_shard logits copied to the payload as fp32, or
// rounded to bf16 (RNE). One 256-thread CTA per 1024 columns of a row (grid y: the rows); other
// rows' CTAs return at once. Internal to the epilogue (shard_reduce.cu validates the arguments).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda::epilogue {

// cudaErrorInvalidValue when n_shard needs more than 2^31 - 1 CTAs; otherwise the launch's error.
cudaError_t LaunchFullLogits(const float* y, int64_t ldy, int64_t n_shard, const ReduceRow* rows,
                             int nrows, uint8_t* payload, cudaStream_t stream);

}  // namespace drafthead::cuda::epilogue
