// Epilogue family "split": TOP_K with k <= kSmallTopK, ARGMAX and SAMPLE rows spread over many
// CTAs a row. Each row is cut into chunks of 512..4096 columns, one 256-thread CTA each, which
// write per-chunk candidates and softmax partials to scratch; a merge kernel (one CTA per row)
// combines them into the row's record. The candidate orders are total, so the results equal the
// one-CTA-a-row kernels' (best_row.cuh, topk_select.cuh) bit for bit. Other rows' CTAs return at
// once. Internal to the epilogue (shard_reduce.cu validates the arguments).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/shard_reduce.cuh"

namespace drafthead::cuda::epilogue {

// The largest TOP_K k the split path serves (larger k go to topk_select.cuh).
inline constexpr uint32_t kSmallTopK = 64;

// Columns per CTA for rows of n_valid columns: fixed_chunk (512..4096) if given (> 0), else chosen
// from n_valid alone (never from the batch: a row's result must not depend on its batch mates);
// raised to what keeps a row within the chunk limit. 0: the split path cannot serve this shape.
int SplitChunk(int64_t n_valid, int fixed_chunk);

// Scratch LaunchSplitReduce needs for nrows rows (any chunk SplitChunk returns).
size_t SplitReduceScratchBytes(int nrows);

// chunk: from SplitChunk (cudaErrorInvalidValue for 0 or a chunk too small for n_valid). TOP_K
// rows with k < min_k are left to another family (group_topk.cuh where it serves; else 1). Both
// kernels are launched as programmatic dependents (dependent_launch.cuh).
cudaError_t LaunchSplitReduce(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                              const ReduceRow* rows, int nrows, uint8_t* payload, int chunk,
                              uint32_t min_k, void* scratch, cudaStream_t stream);

}  // namespace drafthead::cuda::epilogue
