// The same-host lane's shared-memory layout (docs/lane.md is the prose version, for third-party
// clients). One POSIX shared-memory object per lane, created by the caller (mode 0600), mapped by
// both processes:
//
//   [0, 4096)                      LaneHeader
//   [requests_offset, +depth*128)   LaneRequest slots    (caller writes, server reads)
//   [completions_offset, ...)      depth completion slots of completion_bytes each: a
//                                  LaneCompletion header, then inline_bytes of inline answer
//                                  (server writes, caller reads)
//
// Submission n (n = 0, 1, ...) uses slot n % depth of both arrays. Memory order (C++ / C11 atomics,
// all on naturally aligned 32/64-bit words, which are lock-free and address-free on x86-64):
// - caller: fill requests[n % depth] (seq = n), then sq_tail.store(n + 1, release); then a seq_cst
//   fence, and if server_sleeping != 0, FUTEX_WAKE on &sq_tail (a shared, not private, futex).
// - server: reads sq_tail (acquire), copies the slot once (the caller could change it: it is
//   untrusted), answers; then fills completions[n % depth] and stores done_seq = n + 1 (release),
//   cq_count += 1 (release), a seq_cst fence, and if client_sleeping != 0, FUTEX_WAKE on &cq_count.
// - a sleeper (either side) first announces itself (x_sleeping, seq_cst), re-checks its condition,
//   then FUTEX_WAITs on the word with the value it last saw and a timeout: a wake-up is never lost.
// - the caller reuses slot n % depth for submission n + depth only after it has read done_seq ==
//   n + 1 there (a caller that does not wait fills only its own lane; the server stops taking
//   descriptors whose slot is still being answered).
// Header only, no dependencies beyond the C++ standard library: the server, the C++ client and the
// C ABI library (the Python client's native part) all include it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace drafthead::lane {

inline constexpr uint64_t kLaneMagic = 0x314e414c44484431ULL;  // "1DHDLAN1" little-endian
inline constexpr uint32_t kLaneLayoutVersion = 1;
inline constexpr uint32_t kHeaderBytes = 4096;
inline constexpr uint32_t kMaxDepth = 1024;
inline constexpr uint32_t kMaxInlineBytes = 1u << 20;
inline constexpr uint32_t kCompletionHeaderBytes = 512;
inline constexpr uint32_t kMessageBytes = 384;
inline constexpr uint32_t kNoRegion = 0xffffffffu;  // LaneSlice::region of an absent slice
inline constexpr uint8_t kModeFullLogits = 0;  // LaneRequest::mode of FULL_LOGITS (the proto's Mode numbers)

// LaneHeader::server_state.
enum LaneServerState : uint32_t {
  kServerNotAttached = 0,
  kServerServing = 1,
  kServerClosed = 2,  // the server closed the lane (shutdown, CloseLane, a fatal protocol error)
};

// LaneRequest::flags.
enum LaneRequestFlags : uint32_t {
  kFlagReturnProbs = 1u << 0,  // TOP_K: probs
  // The hidden rows are complete only once the slot's `fence` word equals (seq + 1) mod 2^32: the
  // caller's GPU stream writes it after the rows (cuStreamWriteValue32), so the caller need not
  // wait on its host before submitting. The server waits for it (bounded by timeout_us, else
  // kFenceWaitLimit) before reading the rows.
  kFlagHiddenFence = 1u << 1,
  // Token answers carry int64 token ids (int64 ids[n], then values and probs as always): what a
  // torch caller's output tensors hold, so that its answer is one copy, no conversion kernel.
  kFlagIds64 = 1u << 2,
};
inline constexpr uint32_t kKnownRequestFlags = kFlagReturnProbs | kFlagHiddenFence | kFlagIds64;
inline constexpr uint64_t kFenceWaitLimitUs = 10'000'000;

// LaneCompletion::flags.
enum LaneCompletionFlags : uint32_t {
  kDoneProbs = 1u << 0,      // probs were written
  kDoneInOutput = 1u << 1,   // token answers went to the request's output slice, not inline
  kDoneIds64 = 1u << 2,      // the token ids are int64 (the request's kFlagIds64)
  kDoneStepUntimed = 1u << 3,  // Timing's step_untimed: the batch's h2d .. d2h not measured (0)
};

// Bytes of a token answer of n = rows x k entries: ids (4 bytes, or 8 with kFlagIds64), values and
// (with probs) probs, 4 bytes each.
inline uint64_t TokenAnswerBytes(uint64_t rows, uint64_t k, bool probs, bool ids64 = false) {
  return rows * k * ((ids64 ? 8 : 4) + (probs ? 8 : 4));
}

struct LaneSlice {
  uint32_t region;    // index into OpenLaneRequest.regions; kNoRegion: absent
  uint32_t reserved;
  uint64_t offset;    // into the region
  uint64_t byte_size;
};
static_assert(sizeof(LaneSlice) == 24);

// One request: the LogitsRequest fields (enum values are the proto's numbers).
struct LaneRequest {
  uint64_t seq;           // 0: the submission number n; the server answers n whatever is written here
  uint64_t request_id;    // 8: echoed
  uint32_t rows;          // 16
  uint8_t hidden_dtype;   // 20: DType
  uint8_t mode;           // 21: Mode
  uint8_t logits_dtype;   // 22: DType (FULL_LOGITS)
  uint8_t head;           // 23: Head
  uint32_t top_k;         // 24
  uint32_t flags;         // 28: LaneRequestFlags
  float temperature;      // 32
  uint32_t timeout_us;    // 36: queue deadline from arrival; 0: none
  uint64_t seed;          // 40
  LaneSlice hidden;       // 48: rows x hidden_size x dtype, in a registered region
  LaneSlice output;       // 72: FULL_LOGITS: the logits (required); others: token answers (optional)
  uint32_t fence;         // 96: kFlagHiddenFence: (seq + 1) mod 2^32 once the rows are written (atomic)
  uint8_t reserved[28];   // 100: zero
};
static_assert(sizeof(LaneRequest) == 128);
// The fence word is written by the caller's device while the server polls it: read it atomically.
inline uint32_t LoadFence(const LaneRequest* slot) { return __atomic_load_n(&slot->fence, __ATOMIC_ACQUIRE); }
static_assert(offsetof(LaneRequest, hidden) == 48 && offsetof(LaneRequest, output) == 72 &&
              offsetof(LaneRequest, fence) == 96);

// Token answers (TOP_K, ARGMAX, SAMPLE) with n = rows x k entries, inline after the completion
// header or at the output slice's start: int32 token_ids[n] (int64 with kDoneIds64), float
// values[n], float probs[n] (probs only with kDoneProbs). FULL_LOGITS: rows x vocab_size of logits_dtype in the output slice.
struct LaneCompletion {
  std::atomic<uint64_t> done_seq;  // 0: n + 1 once this slot holds submission n's answer (release)
  uint64_t request_id;             // 8
  int32_t code;                    // 16: gRPC status code (0 OK)
  uint32_t rows;                   // 20
  uint32_t vocab_size;             // 24
  uint32_t k;                      // 28: entries per row of a token answer (1 for ARGMAX, SAMPLE)
  uint32_t flags;                  // 32: LaneCompletionFlags
  uint32_t logits_dtype;           // 36
  uint32_t timing[12];             // 40: Timing fields 1..12 in field order (queue_us .. server_us)
  uint32_t message_len;            // 88: bytes of message (a status message, truncated)
  char message[kMessageBytes];     // 92
  uint8_t reserved[kCompletionHeaderBytes - 92 - kMessageBytes];
};
static_assert(sizeof(LaneCompletion) == kCompletionHeaderBytes);
static_assert(offsetof(LaneCompletion, timing) == 40 && offsetof(LaneCompletion, message) == 92);

struct LaneHeader {
  // Written by the caller before OpenLane; constant afterwards (the server copies and checks them).
  uint64_t magic;               // 0: kLaneMagic
  uint32_t version;             // 8: kLaneLayoutVersion
  uint32_t header_bytes;        // 12: kHeaderBytes
  uint64_t nonce;               // 16: OpenLaneRequest.nonce
  uint64_t total_bytes;         // 24: the object's size
  uint32_t depth;               // 32: slots, a power of two in [1, kMaxDepth]
  uint32_t inline_bytes;        // 36: inline answer bytes per completion slot, a multiple of 64
  uint32_t request_bytes;       // 40: sizeof(LaneRequest)
  uint32_t completion_bytes;    // 44: kCompletionHeaderBytes + inline_bytes
  uint64_t requests_offset;     // 48: kHeaderBytes
  uint64_t completions_offset;  // 56: requests_offset + depth * request_bytes, rounded up to 4096
  int32_t client_pid;           // 64
  uint8_t pad0[64 - 4];
  // The server's line.
  alignas(64) std::atomic<uint32_t> server_state;  // 128: LaneServerState
  std::atomic<uint32_t> server_sleeping;           // 132: nonzero while the server may sleep on sq_tail
  std::atomic<uint32_t> sq_head;                   // 136: descriptors the server has taken (info)
  uint8_t pad1[64 - 12];
  // The caller's doorbell word: the server's futex.
  alignas(64) std::atomic<uint32_t> sq_tail;       // 192: descriptors published (wraps)
  std::atomic<uint32_t> client_sleeping;           // 196: callers that may sleep on cq_count
  uint8_t pad2[64 - 8];
  // The server's doorbell word: the caller's futex.
  alignas(64) std::atomic<uint32_t> cq_count;      // 256: completions published (wraps)
  uint8_t pad3[64 - 4];
  uint8_t reserved[kHeaderBytes - 320];
};
static_assert(sizeof(LaneHeader) == kHeaderBytes);
static_assert(offsetof(LaneHeader, server_state) == 128 && offsetof(LaneHeader, sq_tail) == 192 &&
              offsetof(LaneHeader, cq_count) == 256);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

// The geometry a caller writes for `depth` slots and `inline_bytes` of inline answer each; the
// server recomputes it from depth and inline_bytes and refuses a header that disagrees.
struct LaneGeometry {
  uint64_t requests_offset = 0, completions_offset = 0, completion_bytes = 0, total_bytes = 0;
};
inline constexpr uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }
inline constexpr LaneGeometry GeometryFor(uint32_t depth, uint32_t inline_bytes) {
  LaneGeometry g;
  g.requests_offset = kHeaderBytes;
  g.completions_offset = RoundUp(g.requests_offset + uint64_t{depth} * sizeof(LaneRequest), 4096);
  g.completion_bytes = kCompletionHeaderBytes + uint64_t{inline_bytes};
  g.total_bytes = RoundUp(g.completions_offset + uint64_t{depth} * g.completion_bytes, 4096);
  return g;
}

inline LaneRequest* RequestSlot(void* base, const LaneGeometry& g, uint32_t depth, uint64_t n) {
  return reinterpret_cast<LaneRequest*>(static_cast<uint8_t*>(base) + g.requests_offset +
                                        (n % depth) * sizeof(LaneRequest));
}
inline LaneCompletion* CompletionSlot(void* base, const LaneGeometry& g, uint32_t depth, uint64_t n) {
  return reinterpret_cast<LaneCompletion*>(static_cast<uint8_t*>(base) + g.completions_offset +
                                           (n % depth) * g.completion_bytes);
}

}  // namespace drafthead::lane
