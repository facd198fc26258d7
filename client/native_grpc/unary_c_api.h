// libdrafthead_grpc.so: gRPC unary calls on the caller's thread, with a C ABI for the Python client
// (ctypes), which otherwise pays grpcio's Python layers (80-180 us a call on an H100 host,
// docs/client.md). Bytes in, bytes out: the caller serializes the request and parses the answer
// (one large field may come apart into the caller's memory, found by the wire format alone), so
// the library knows no message type.
//
// A call: dh_grpc_start, then dh_grpc_wait in slices (the caller can react to signals between
// them, as grpcio's blocking calls do), dh_grpc_cancel to end it early, dh_grpc_finish for its
// status and answer (which also frees it).
// Ownership: dh_grpc_open returns a channel the caller frees with dh_grpc_close once none of its
// calls is left unfinished (dh_grpc_shutdown first ends the running ones: CANCELLED at once); a
// call is the caller's until dh_grpc_finish; an answer buffer is the caller's, freed with
// dh_grpc_free.
// Threads: a channel takes calls from any number of threads at once; each call's events come back
// on its own completion queue, to whichever thread waits on it, nothing is handed to a pool. One
// call is used by one thread at a time.
// Failure: dh_grpc_finish returns the gRPC status code (0: OK) with the status message in msg. A
// call never outlives its deadline (timeout_ns, at least 1 ms; gRPC enforces it).
// Insecure channels only (TLS stays with grpcio); links the system's gRPC C++ library, so the
// Python client loads it only where that exists and falls back to grpcio elsewhere.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int dh_grpc_abi_version(void);  // 3 (2: without the field split; 1: one blocking dh_grpc_unary)

// A channel to target (HOST:PORT, unix:PATH or any gRPC target) whose messages may be up to
// max_message_bytes each way. NULL on failure, the reason in msg.
void* dh_grpc_open(const char* target, int64_t max_message_bytes, char* msg, size_t msg_len);
// Cancels the calls running on channel and refuses new ones (CANCELLED); returns at once.
void dh_grpc_shutdown(void* channel);
void dh_grpc_close(void* channel);

// Starts a unary call of method ("/package.Service/Method") with request bytes req and one
// metadata pair (md_key NULL: none). Never NULL: a call refused at once (a null argument, the
// channel shut) finishes with its code.
void* dh_grpc_start(void* channel, const char* method, const void* req, size_t req_len, int64_t timeout_ns,
                    const char* md_key, const char* md_value);
// Waits up to wait_ns for the call to end: 1 when it has, 0 when it still runs.
int dh_grpc_wait(void* call, int64_t wait_ns);
void dh_grpc_cancel(void* call);
// Waits for the call to end, then frees it. OK: *resp and *resp_len hold the answer (free it with
// dh_grpc_free; an empty answer may be NULL). Else the code, with the status message in msg.
int dh_grpc_finish(void* call, void** resp, size_t* resp_len, char* msg, size_t msg_len);
void dh_grpc_free(void* p);

// One large field of the answer straight into the caller's memory (a 1.3 MB logits field was
// copied five times on its way into a numpy array): the answer read as protobuf wire format, no
// message type needed. dh_grpc_answer_field_bytes waits for the call to end, then gives the size of
// its top-level length-delimited field `field` (the last occurrence, as a parser keeps; 0 when
// absent), or -1 when the call failed or the answer is not wire format (then dh_grpc_finish_split,
// or dh_grpc_finish, says why). dh_grpc_finish_split (after it, same field; else it is
// dh_grpc_finish) copies that field's bytes into dst (dst_len: that size) and returns the rest of
// the answer, every other field as it came, like dh_grpc_finish; it frees the call.
int64_t dh_grpc_answer_field_bytes(void* call, int field);
int dh_grpc_finish_split(void* call, int field, void* dst, size_t dst_len, void** resp, size_t* resp_len, char* msg,
                         size_t msg_len);

#ifdef __cplusplus
}
#endif
