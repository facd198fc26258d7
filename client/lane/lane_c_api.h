/* The lane's caller side with a C ABI: libdrafthead_lane.so, loaded by the Python client with
 * ctypes (client/python/drafthead_client/lane.py). A thin shell over LaneRing (lane_ring.h) and
 * LaneCuda (lane_cuda.h): the same contract. OpenLane / CloseLane are the caller's to send over gRPC.
 * Errors: a gRPC status code returned (0 OK; the one-call entries return minus the code) and the
 * message written to msg (NUL-terminated, truncated to msg_len). docs/lane.md lists the entries.
 * DH_LANE_ABI_VERSION changes whenever an entry's meaning or signature does (dh_lane_abi_version
 * says the library's; the layout version is the shared-memory protocol's, a different thing). */
#ifndef DRAFTHEAD_LANE_C_API_H_
#define DRAFTHEAD_LANE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DH_LANE_ABI_VERSION 6

typedef struct dh_lane dh_lane;

uint32_t dh_lane_abi_version(void);
uint32_t dh_lane_layout_version(void);
/* NULL on failure (*code and msg say why). */
dh_lane* dh_lane_create(uint32_t depth, uint32_t inline_bytes, uint64_t hidden_slot_bytes,
                        uint64_t output_slot_bytes, int64_t spin_ns, int* code, char* msg, size_t msg_len);
/* Closes the lane; safe while other threads are inside an entry or hold answers (docs/lane.md): their
 * waits end with UNAVAILABLE, later entries are refused, the memory goes with the last answer
 * released, and the handle's few bytes stay allocated so that a racing entry finds it closed. */
void dh_lane_destroy(dh_lane* lane);
const char* dh_lane_key(const dh_lane* lane);
uint64_t dh_lane_bytes(const dh_lane* lane);
uint64_t dh_lane_nonce(const dh_lane* lane);
const char* dh_lane_arena_key(const dh_lane* lane);
uint64_t dh_lane_arena_bytes(const dh_lane* lane);
uint32_t dh_lane_depth(const dh_lane* lane);
uint32_t dh_lane_inline_bytes(const dh_lane* lane);
/* After OpenLane: removes the objects' names (the mappings stay). */
void dh_lane_unlink(dh_lane* lane);
int dh_lane_attach(dh_lane* lane, int server_pid, char* msg, size_t msg_len);
void* dh_lane_hidden_area(const dh_lane* lane, uint32_t slot);
uint64_t dh_lane_hidden_offset(const dh_lane* lane, uint32_t slot);
void* dh_lane_output_area(const dh_lane* lane, uint32_t slot);
uint64_t dh_lane_output_offset(const dh_lane* lane, uint32_t slot);
/* One synchronous call (the common case, one C call): `request` is a LaneRequest (128 bytes) whose
 * hidden slice is set here to the slot's arena hidden area holding `hidden_bytes` of `hidden`
 * (copied) and whose output slice, when present, is slot-relative (LaneRing::PublishInSlot: region
 * 0's offset counts from the slot's output area). Reserves a slot, copies, publishes, waits (all
 * within timeout_ns; < 0: none). Returns the submission number seq (>= 0): the answer is
 * dh_lane_completion(seq) (and the slot's output area) until dh_lane_release(seq); or minus a gRPC
 * code (nothing left to release; INVALID_ARGUMENT before reserving when a slice exceeds a slot). */
int64_t dh_lane_call(dh_lane* lane, const void* request, const void* hidden, uint64_t hidden_bytes,
                     int64_t timeout_ns, char* msg, size_t msg_len);
void dh_lane_release(dh_lane* lane, uint64_t seq);
const void* dh_lane_completion(const dh_lane* lane, uint64_t seq);

/* The same in steps, for a caller with several calls in flight from one thread: reserve, fill the
 * slot's arena area, publish (absolute slices: dh_lane_hidden_offset / dh_lane_output_offset;
 * the request's seq is set here), then wait (or poll dh_lane_done) and release. */
int dh_lane_reserve(dh_lane* lane, int64_t timeout_ns, uint64_t* seq, char* msg, size_t msg_len);
void dh_lane_publish(dh_lane* lane, uint64_t seq, const void* request);
/* On 0, *completion points at the LaneCompletion (512-byte header, then the inline answer) until
 * dh_lane_release(seq). */
int dh_lane_wait(dh_lane* lane, uint64_t seq, int64_t timeout_ns, const void** completion, char* msg,
                 size_t msg_len);
/* 1 once seq's answer is there (no waiting); then dh_lane_completion(seq) is it. */
int dh_lane_done(const dh_lane* lane, uint64_t seq);

/* Stream-ordered calls (lane_cuda.h), for rows and answers on a GPU: register the lane with the
 * current CUDA context and name the caller's CUDA arenas (their device addresses; the hidden arena
 * region 1 at OpenLane, the output arena region 2, both laid out per slot like the host arena).
 * Then one C call a call: dh_lane_call_stream copies `hidden_bytes` at device address `hidden` into
 * the slot's hidden area, fences, publishes `request` (its output slice slot-relative) and makes
 * `stream` (a CUstream) wait for the answer, then copies `n_copies` pieces of the answer out of the
 * slot's output area (`copies`: n_copies triples of destination device address, byte offset in the
 * slot's output area, bytes; adjacent pieces as one copy), all ordered on the stream; wait != 0
 * also waits on the host. Returns seq (>= 0: the answer is in the slot seq % depth of the output
 * arena, ordered on the stream; the library releases the slot itself) or minus a gRPC code: this
 * call's failure (a piece outside the slot's output area: INVALID_ARGUMENT, before anything is
 * submitted), or an earlier stream-ordered call's (answered since; reported once, before this call
 * submits anything). dh_lane_stream_synchronize waits on the host for every such call and returns
 * the first failure. */
int dh_lane_cuda_attach(dh_lane* lane, uint64_t hidden_arena, uint64_t output_arena, char* msg, size_t msg_len);
int64_t dh_lane_call_stream(dh_lane* lane, const void* request, uint64_t hidden, uint64_t hidden_bytes, void* stream,
                            int wait, int64_t timeout_ns, const uint64_t* copies, uint32_t n_copies, char* msg,
                            size_t msg_len);
int dh_lane_stream_synchronize(dh_lane* lane, int64_t timeout_ns, char* msg, size_t msg_len);
/* The same call in two steps (LaneCuda::Submit / Finish), so that the caller's work between them
 * (allocating the tensors the answer goes into) runs while the server computes:
 * dh_lane_submit_stream copies the rows, fences and publishes (copies_follow: whether the finish
 * will copy pieces out) and returns seq or minus a code; dh_lane_finish_stream(seq) makes the
 * stream wait for the answer and copies the pieces out, returning a code. Every submitted seq must
 * be finished once (with no pieces when the caller gave up in between), from the same thread and
 * before its next call on this lane; a finish whose pieces are bad (INVALID_ARGUMENT) still
 * finishes the call, copying nothing. */
int64_t dh_lane_submit_stream(dh_lane* lane, const void* request, uint64_t hidden, uint64_t hidden_bytes,
                              void* stream, int copies_follow, int64_t timeout_ns, char* msg, size_t msg_len);
int dh_lane_finish_stream(dh_lane* lane, uint64_t seq, const uint64_t* copies, uint32_t n_copies, int wait,
                          int64_t timeout_ns, char* msg, size_t msg_len);
/* The copy kernel of stream-ordered calls (lane_cuda.h SetCopyKernel: a call's rows and fence in
 * one launch, its answer and consumed word in another, instead of two libcuda calls each; loaded
 * at dh_lane_cuda_attach, and on from then): use > 0 turns it on where it loaded, 0 off, < 0
 * asks. Returns 1 while in use, else 0; msg: why it is not loaded (empty when it is). */
int dh_lane_cuda_copy_kernel(dh_lane* lane, int use, char* msg, size_t msg_len);
/* Host IO of stream-ordered calls (lane_cuda.h SetHostIo: the rows go into the slot's host arena
 * area, mapped for the device, and a token answer with copies comes inline in the completion, so
 * the server's side of the call is host memory only; FULL_LOGITS keeps the CUDA output arena):
 * on from dh_lane_cuda_attach where the host arena registered there; use > 0 turns it on where it
 * did, 0 off, < 0 asks.
 * Returns 1 while in use, else 0; msg: why it is not available (empty when it is). */
int dh_lane_cuda_host_io(dh_lane* lane, int use, char* msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
