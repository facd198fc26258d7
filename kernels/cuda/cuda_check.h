// Error plumbing for the CUDA kernels: kernels return cudaError_t (flashinfer style) and never
// throw or abort; DH_CUDA_TRY returns the first failing call's error from a cudaError_t function.
// The server turns them into absl::Status with common/cuda_status.h (one mapping for every caller).
#pragma once

#include <cuda_runtime.h>

#define DH_CUDA_TRY(expr)                    \
  do {                                       \
    const cudaError_t dh_err_ = (expr);      \
    if (dh_err_ != cudaSuccess) return dh_err_; \
  } while (0)
