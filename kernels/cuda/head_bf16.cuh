// The BF16_EXACT head: y[m, n] = sum_k x[m, k] * w[n, k] with bf16 x and w, fp32 accumulation and
// output, through cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F: tensor cores with fp32 accumulators).
// Returns cuBLAS's status (CUBLAS_STATUS_INVALID_VALUE for shapes it cannot express). The handle
// is the caller's (one per thread); this call sets its stream.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace drafthead::cuda {

// x bf16 [m, k]; w bf16 [n, k]; y fp32 [m, ldy].
cublasStatus_t HeadGemmBf16(cublasHandle_t handle, const uint16_t* x, int m, int64_t k,
                            const uint16_t* w, int64_t n, float* y, int64_t ldy,
                            cudaStream_t stream);

}  // namespace drafthead::cuda
