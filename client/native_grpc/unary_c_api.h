// libdrafthead_grpc.so: one gRPC unary call on the caller's thread, with a C ABI for the Python
// client (ctypes), which otherwise pays grpcio's Python layers (~0.5-0.8 ms a call on the GPU host,
// against 0.2-0.5 ms for the C++ client). Bytes in, bytes out: the caller serializes the request
// and parses the answer, so the library knows no message type.
//
// Ownership: dh_grpc_open returns a channel the caller frees with dh_grpc_close once no call on it
// is running (dh_grpc_shutdown first ends the running ones: they return CANCELLED at once); an
// answer buffer is the caller's, freed with dh_grpc_free.
// Threads: a channel takes calls from any number of threads at once; each call runs on its
// caller's thread (its own completion queue), nothing is handed to a pool.
// Failure: dh_grpc_unary returns the gRPC status code (0: OK) with the status message in msg;
// it never waits past its deadline (timeout_ns, at least 1 ms; gRPC enforces it).
// Insecure channels only (TLS stays with grpcio); links the system's gRPC C++ library, so the
// Python client loads it only where that exists and falls back to grpcio elsewhere.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int dh_grpc_abi_version(void);  // 1

// A channel to target (HOST:PORT, unix:PATH or any gRPC target) whose messages may be up to
// max_message_bytes each way. NULL on failure, the reason in msg.
void* dh_grpc_open(const char* target, int64_t max_message_bytes, char* msg, size_t msg_len);
// Cancels the calls running on channel and refuses new ones (CANCELLED); returns at once.
void dh_grpc_shutdown(void* channel);
void dh_grpc_close(void* channel);

// One unary call of method ("/package.Service/Method") with request bytes req, and one metadata
// pair (md_key NULL: none). On OK, *resp and *resp_len hold the answer (free it with dh_grpc_free;
// an empty answer may be NULL).
int dh_grpc_unary(void* channel, const char* method, const void* req, size_t req_len, int64_t timeout_ns,
                  const char* md_key, const char* md_value, void** resp, size_t* resp_len, char* msg,
                  size_t msg_len);
void dh_grpc_free(void* p);

#ifdef __cplusplus
}
#endif
