#include "kernels/cuda/head_bf16.cuh"

#include <limits>

namespace drafthead::cuda {

cublasStatus_t HeadGemmBf16(cublasHandle_t handle, const uint16_t* x, int m, int64_t k,
                            const uint16_t* w, int64_t n, float* y, int64_t ldy,
                            cudaStream_t stream) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m < 1 || k < 1 || n < 1 || ldy < n || k > kMax || n > kMax || ldy > kMax)
    return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t st = cublasSetStream(handle, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // Column-major view: y^T (n x m, ld ldy) = W (k x n, ld k)^T * X^T (k x m, ld k).
  const float alpha = 1.f, beta = 0.f;
  return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), m, static_cast<int>(k),
                      &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
                      static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(ldy),
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace drafthead::cuda
