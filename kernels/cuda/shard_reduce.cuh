// Per-shard epilogue on the GPU: turns a batch's fp32 logits into one rank's payload (the layout of
// server/group/wire_format.h, written at the caller's offsets): FULL_LOGITS rows copied or rounded
// to bf16 (RNE, kernels/numeric.h FloatToBf16), TOP_K / ARGMAX / SAMPLE rows reduced to a
// SoftmaxPartial and k Candidate records (kernels/candidate.h), exactly as
// kernels/cpu/shard_reduce.cc does: same order (larger key first, ties to the smaller id, NaN
// last), same SampleKey noise, same partials (max of logit / T in fp32, bit for bit; the sum of
// exp, fp32 terms added in double here and double terms on the CPU, summed in another order, so
// equal to well within 1e-6 relative; reduce_common.cuh's SumTerm).
//
// This file is the entry point and the dispatch (shard_reduce.cu); the kernel families are
//   full_logits.cuh   FULL_LOGITS rows;
//   split_reduce.cuh  TOP_K k <= kSmallTopK (64), ARGMAX, SAMPLE split over many CTAs a row;
//   topk_select.cuh   TOP_K of any k <= kMaxTopK: radix select, one CTA a row (or row segment);
//   best_row.cuh      ARGMAX / SAMPLE with one CTA a row (rows the split path cannot cut).
// All pointers are device memory (the payload may be mapped pinned host memory); asynchronous on
// `stream`; the kernels are programmatic dependents of the kernel before them (they may launch
// while it finishes; dependent_launch.cuh). Callers validate the row
// descriptors on the host with ValidateReduceRows (unknown mode, k outside 1..kMaxTopK, T <= 0
// -> cudaErrorInvalidValue) before uploading them; the kernels skip rows they cannot serve.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/reduce_mode.h"

namespace drafthead::cuda {

using ::drafthead::kMaxTopK;
using ::drafthead::ReduceMode;

// One batch row's epilogue work.
struct ReduceRow {
  int32_t y_row;            // row of y holding this row's logits
  uint8_t mode;             // ReduceMode
  uint8_t out_bf16;         // kFullLogits: 1 bf16, 0 fp32
  uint8_t pad0, pad1;
  uint32_t k;               // kTopK: k; kArgmax / kSample: 1
  float temperature;        // kTopK partials, kSample
  uint32_t row_in_request;  // kSample
  uint32_t pad2;
  uint64_t seed;            // kSample
  uint64_t out_offset;      // byte offset of the row's block in the payload (16-byte aligned)
};
static_assert(sizeof(ReduceRow) == 40);

// Host check: modes known, 1 <= k <= kMaxTopK for reductions, temperature > 0 where used,
// offsets 16-byte aligned.
cudaError_t ValidateReduceRows(const ReduceRow* rows_host, int nrows);

// Device scratch ShardEpilogue needs for nrows rows over n_valid columns (never 0).
size_t EpilogueScratchBytes(int64_t n_valid, int nrows);

// y: fp32 [*, ldy] (ldy a multiple of 4, y 16-byte aligned); n_shard: columns written for full
// rows; n_valid <= n_shard: columns reduced over (at most 655360); column j is token id_base + j.
// scratch: device memory of at least EpilogueScratchBytes(n_valid, nrows) bytes. rows_host
// (optional): a host copy of rows_dev, used only to skip the launches no row needs.
cudaError_t ShardEpilogue(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                          int32_t id_base, const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          const ReduceRow* rows_host = nullptr);

// Which kernels ShardEpilogue launches for these rows (a bit per kernel family). Two calls with
// equal n_valid, nrows and launch sets launch the same grids from the same arguments (the rows'
// values are read from rows_dev), so one captured CUDA graph serves both.
uint32_t EpilogueLaunches(int64_t n_valid, const ReduceRow* rows_host, int nrows);

}  // namespace drafthead::cuda
