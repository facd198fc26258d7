// Epilogue family TOP_K of any k <= kMaxTopK: an exact radix select over the unique 64-bit keys
// (ordered logit, ~id), then a bitonic sort of the k winners, one 1024-thread CTA per row. A row
// of up to 40960 columns is staged in shared memory; longer rows (the full vocabulary on one
// rank) are cut into up to 16 segments, each selected by its own CTA into `scratch`, then merged
// by one CTA per row (so at most 655360 columns). Also writes the row's SoftmaxPartial.
// Serves only TOP_K rows with k >= min_k (the dispatch gives small k to split_reduce.cuh).
// Internal to the epilogue (shard_reduce.cu validates the arguments).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda::epilogue {

// Scratch LaunchTopKSelect needs (0 when rows fit one segment).
size_t TopKSelectScratchBytes(int64_t n_valid, int nrows);

// cudaErrorInvalidValue past 655360 columns; otherwise the first failing runtime call's error.
cudaError_t LaunchTopKSelect(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                             const ReduceRow* rows, int nrows, uint8_t* payload, void* scratch,
                             uint32_t min_k, cudaStream_t stream);

}  // namespace drafthead::cuda::epilogue
