// Epilogue family ARGMAX / SAMPLE, one 512-thread CTA per row (the round-1 kernel): the best
// candidate of the row's n_valid columns (the logit, or SampleKey's Gumbel key for SAMPLE) written
// as the row's record with a zero SoftmaxPartial. Serves the rows the split path cannot cut
// (split_reduce.cuh); other rows' CTAs return at once. Internal to the epilogue.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda::epilogue {

cudaError_t LaunchBestPerRow(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                             const ReduceRow* rows, int nrows, uint8_t* payload,
                             cudaStream_t stream);

}  // namespace drafthead::cuda::epilogue
