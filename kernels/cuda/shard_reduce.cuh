// Per-shard epilogue on the GPU: turns a batch's fp32 logits into one rank's payload (the layout of
// server/batch.h, written by the caller's offsets): FULL_LOGITS rows copied or rounded to bf16 (RNE,
// kernels/numeric.h FloatToBf16), TOP_K / ARGMAX / SAMPLE rows reduced to a SoftmaxPartial and k
// Candidate records (kernels/candidate.h), exactly as kernels/cpu/shard_reduce.cc does: same order
// (larger key first, ties to the smaller id, NaN last), same SampleKey noise, same partials (max of
// logit / T in fp32; the sum of exp in double, summed in another order, so equal to ~1 ulp).
//
// TOP_K: an exact radix select over the unique 64-bit keys (ordered key, ~id), then a bitonic
// sort of the k winners; k <= kMaxTopK. A row of up to 40960 columns is staged in shared memory
// by one CTA; longer rows (the full vocabulary on one rank) are cut into up to 16 segments, each
// selected by its own CTA into `scratch`, then merged (so at most 655360 columns).
// TOP_K with k <= 64, ARGMAX and SAMPLE (round 2) are split over many CTAs per row: chunks of
// 512-4096 columns, one 256-thread CTA each, write per-chunk candidates + softmax partials to
// scratch; a merge kernel (one CTA per row) combines them (same results: the orders are total).
// All pointers are device memory; asynchronous on `stream`. Callers validate the row
// descriptors on the host with ValidateReduceRows (unknown mode, k outside 1..kMaxTopK, T <= 0
// -> cudaErrorInvalidValue) before uploading them; the kernels skip rows they cannot serve.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace drafthead::cuda {

inline constexpr uint32_t kMaxTopK = 1024;

// Mirrors server/batch.h RowMode / OutDType numbering (kernels do not depend on server/).
enum class ReduceMode : uint8_t { kFullLogits = 0, kTopK = 1, kArgmax = 2, kSample = 3 };

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
// rows; n_valid <= n_shard: columns reduced over; column j is token id_base + j. scratch: device
// memory of at least EpilogueScratchBytes(n_valid, nrows) bytes. rows_host (optional): a host
// copy of rows_dev, used only to skip the launches no row needs.
cudaError_t ShardEpilogue(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                          int32_t id_base, const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream);
cudaError_t ShardEpilogue(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                          int32_t id_base, const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          const ReduceRow* rows_host);

// Bench / test hook (not thread-safe; process-wide): 0 the default dispatch (split path, chunk
// chosen by shape), 1 the round-1 kernels (one CTA per row for everything), 2 / 4 / 3 / 5 the
// split path with 512 / 1024 / 2048 / 4096-column chunks.
void SetEpilogueVariant(int variant);

}  // namespace drafthead::cuda
