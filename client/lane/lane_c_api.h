/* The lane's caller side with a C ABI: libdrafthead_lane.so, loaded by the Python client with
 * ctypes (client/python/drafthead_client/lane.py). A thin shell over LaneRing (lane_ring.h): the
 * same contract. OpenLane / CloseLane are the caller's to send over gRPC. Errors: a gRPC status
 * code returned (0 OK) and the message written to msg (NUL-terminated, truncated to msg_len). */
#ifndef DRAFTHEAD_LANE_C_API_H_
#define DRAFTHEAD_LANE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_lane dh_lane;

uint32_t dh_lane_layout_version(void);
/* NULL on failure (*code and msg say why). */
dh_lane* dh_lane_create(uint32_t depth, uint32_t inline_bytes, uint64_t hidden_slot_bytes,
                        uint64_t output_slot_bytes, int64_t spin_ns, int* code, char* msg, size_t msg_len);
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
/* timeout_ns < 0: none. */
int dh_lane_reserve(dh_lane* lane, int64_t timeout_ns, uint64_t* seq, char* msg, size_t msg_len);
/* request: a LaneRequest (128 bytes, common/lane/lane_layout.h); its seq is set here. */
void dh_lane_publish(dh_lane* lane, uint64_t seq, const void* request);
/* On 0, *completion points at the LaneCompletion (512-byte header, then the inline answer) until
 * dh_lane_release(seq). */
int dh_lane_wait(dh_lane* lane, uint64_t seq, int64_t timeout_ns, const void** completion, char* msg,
                 size_t msg_len);
void dh_lane_release(dh_lane* lane, uint64_t seq);
/* 1 once seq's answer is there (no waiting); then dh_lane_completion(seq) is it. */
int dh_lane_done(const dh_lane* lane, uint64_t seq);
const void* dh_lane_completion(const dh_lane* lane, uint64_t seq);

/* Stream-ordered calls (lane_cuda.h): register the lane with the current CUDA context, then per call
 * dh_lane_stream_fence after the rows are written on `stream` (publish with kFlagHiddenFence) and
 * dh_lane_stream_wait before reading the answer on `stream`. `stream` is a CUstream. */
int dh_lane_cuda_attach(dh_lane* lane, char* msg, size_t msg_len);
int dh_lane_stream_fence(dh_lane* lane, uint64_t seq, void* stream, char* msg, size_t msg_len);
int dh_lane_stream_wait(dh_lane* lane, uint64_t seq, void* stream, char* msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
