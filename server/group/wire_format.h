// What rank 0 broadcasts for one step (one message: header, row tasks, hidden rows), the row
// tasks as the backends take them, and the fixed layout of what each rank sends back. All plain
// bytes on the wire between ranks of one build (no versioning across builds: a group always runs
// one binary), so they are trivially copyable PODs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/candidate.h"
#include "kernels/reduce_mode.h"

namespace drafthead {

inline constexpr int kMaxRowsLimit = 256;   // hard cap on --max-rows
inline constexpr int kMaxTopKLimit = static_cast<int>(kMaxTopK);  // hard cap on --max-top-k

enum class RowMode : uint8_t { kFullLogits = 0, kTopK = 1, kArgmax = 2, kSample = 3 };
// The backends hand a RowMode to the kernels as a ReduceMode by value (kernels/reduce_mode.h).
static_assert(static_cast<int>(RowMode::kFullLogits) == static_cast<int>(ReduceMode::kFullLogits) &&
              static_cast<int>(RowMode::kTopK) == static_cast<int>(ReduceMode::kTopK) &&
              static_cast<int>(RowMode::kArgmax) == static_cast<int>(ReduceMode::kArgmax) &&
              static_cast<int>(RowMode::kSample) == static_cast<int>(ReduceMode::kSample));
enum class RowHead : uint8_t { kFp8Twin = 0, kBf16Exact = 1 };
enum class OutDType : uint8_t { kBf16 = 0, kFp32 = 1 };
inline size_t OutDTypeBytes(OutDType t) { return t == OutDType::kBf16 ? 2 : 4; }

// One row of the batch. Rows of one request are consecutive and share everything but
// row_in_request.
struct RowTask {
  RowMode mode;
  RowHead head;
  OutDType dtype;         // kFullLogits
  uint8_t want_probs;     // kTopK
  uint32_t k;             // kTopK: top_k; kArgmax / kSample: 1; kFullLogits: 0
  float temperature;      // kTopK probs and kSample; 1 where unused
  uint32_t row_in_request;
  uint64_t seed;          // kSample
};
static_assert(std::is_trivially_copyable_v<RowTask> && sizeof(RowTask) == 24);

enum class BatchOp : uint32_t { kRun = 1, kHeartbeat = 2, kShutdown = 3 };

// FULL_LOGITS rows [row0, row0 + rows) of a batch whose logits rank 0's backend copies from its
// device payload straight into device memory (a caller's CUDA region), so that they never cross to
// the host: row i of the block goes to dst + i x dst_pitch, vocab_size values of the row's dtype.
// Alone only (tp = 1, a backend with device memory: RankEngine::writes_device_rows).
struct DeviceRowsOut {
  uint32_t row0 = 0, rows = 0;
  uint64_t dst_pitch = 0;
  void* dst = nullptr;  // device memory the backend's GPU may write (its own, or a peer's)
};

// One batch's rows as the backends take them (host memory; not sent as such: the workers get the
// tasks alone, and never device_out).
struct BatchControl {
  uint32_t rows = 0;
  RowTask tasks[kMaxRowsLimit];
  uint32_t device_outs = 0;  // entries of device_out in use, in row order, not overlapping
  DeviceRowsOut device_out[kMaxRowsLimit];
};
static_assert(std::is_trivially_copyable_v<BatchControl>);

// One step's message, sent by one broadcast: [BatchHeader][RowTask x rows][pad to 16][bf16 hidden
// rows x K]. A broadcast's size must be known to every rank beforehand, so each header names the
// size of the next step's broadcast (`next_frame_bytes`: the power of two that held this batch);
// a message larger than the agreed frame sends its tail in a second broadcast (the step after a
// jump in batch size, never in a steady state). Heartbeats keep the frame.
// Rows apart (a group whose collective and backends work in device memory: NCCL): the message
// ends after the tasks, and the hidden rows follow in a broadcast of their own, from rank 0's
// device buffer into each worker's (ComputeBackend::DeviceRows), never through host memory.
struct BatchHeader {
  static constexpr uint32_t kMagic = 0x44484233;  // "DHB3"
  uint32_t magic = kMagic;
  BatchOp op = BatchOp::kHeartbeat;
  uint64_t seq = 0;
  uint32_t rows = 0;
  uint32_t next_frame_bytes = 0;
  uint64_t message_bytes = 0;  // this whole message
  uint32_t rows_apart = 0;     // 1: the hidden rows follow in a device broadcast (kRun only)
  uint32_t reserved = 0;
};
static_assert(std::is_trivially_copyable_v<BatchHeader> && sizeof(BatchHeader) == 40);

inline constexpr size_t kMinFrameBytes = 256;  // a header and a few tasks

inline size_t BatchHiddenOffset(uint32_t rows) {
  return (sizeof(BatchHeader) + rows * sizeof(RowTask) + 15) & ~size_t{15};
}
inline size_t BatchRowsBytes(uint32_t rows, int64_t hidden) {
  return static_cast<size_t>(rows) * hidden * 2;
}
// The whole message: with the rows, or (rows apart) without them.
inline size_t BatchMessageBytes(uint32_t rows, int64_t hidden, bool rows_apart = false) {
  return BatchHiddenOffset(rows) + (rows_apart ? 0 : BatchRowsBytes(rows, hidden));
}
// The frame that holds a message of `bytes`: a power of two in [kMinFrameBytes, max_bytes], so
// batches of similar size share one frame.
inline size_t FrameBytesFor(size_t bytes, size_t max_bytes) {
  size_t f = kMinFrameBytes;
  while (f < bytes && f < max_bytes) f *= 2;
  return f < max_bytes ? f : max_bytes;
}

// Byte offsets of each row's block inside one rank's payload.
struct PayloadLayout {
  std::vector<size_t> row_offset;  // rows + 1 entries
  size_t bytes() const { return row_offset.empty() ? 0 : row_offset.back(); }
};

// Bytes one row takes in a rank's payload: full logits are the whole shard (shard_rows values in
// the requested dtype), reductions a SoftmaxPartial and k candidates. Rounded up to 16 bytes so
// every block is aligned for vector stores and DMA.
inline size_t RowPayloadBytes(const RowTask& t, int64_t shard_rows) {
  size_t b;
  if (t.mode == RowMode::kFullLogits) {
    b = static_cast<size_t>(shard_rows) * OutDTypeBytes(t.dtype);
  } else {
    b = sizeof(SoftmaxPartial) + static_cast<size_t>(t.k) * sizeof(Candidate);
  }
  return (b + 15) & ~static_cast<size_t>(15);
}

inline PayloadLayout MakePayloadLayout(const RowTask* tasks, int rows, int64_t shard_rows) {
  PayloadLayout l;
  l.row_offset.resize(rows + 1);
  size_t off = 0;
  for (int i = 0; i < rows; ++i) {
    l.row_offset[i] = off;
    off += RowPayloadBytes(tasks[i], shard_rows);
  }
  l.row_offset[rows] = off;
  return l;
}

}  // namespace drafthead
