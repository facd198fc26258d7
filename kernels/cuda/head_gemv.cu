#include "kernels/cuda/head_gemv.cuh"

#include "kernels/cuda/head_gemv_kernel.cuh"

namespace drafthead::cuda {
namespace {

// ---- exact CUDA-core fallback (any exponent) ------------------------------------------------
// One warp per weight row; lanes stride over 4-column groups; fp32 dequant and fmaf accumulation.
__device__ __forceinline__ float Pow2(int p) {
  return p >= -126 ? __uint_as_float(static_cast<uint32_t>(p + 127) << 23)
                   : (p >= -149 ? __uint_as_float(1u << (p + 149)) : 0.f);
}

__global__ void __launch_bounds__(256) GemvFp8Fallback(const uint16_t* __restrict__ x, int m,
                                                       int64_t k, const uint8_t* __restrict__ codes,
                                                       const uint8_t* __restrict__ exps, int64_t n,
                                                       float* __restrict__ y, int64_t ldy) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  float acc[kGemvMaxRowsPerPass];
#pragma unroll
  for (int i = 0; i < kGemvMaxRowsPerPass; ++i) acc[i] = 0.f;
  const uint8_t* wr = codes + row * k;
  const uint8_t* er = exps + (row / 32) * (k / 32);
  for (int64_t c = lane * 4; c < k; c += 128) {
    const float sc = Pow2(static_cast<int>(er[c / 32]) - 127);
    float wv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) wv[j] = E4m3ToFloat(wr[c + j]) * sc;
#pragma unroll
    for (int i = 0; i < kGemvMaxRowsPerPass; ++i) {
      if (i < m) {
        const uint16_t* xr = x + i * k + c;
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i] = __fmaf_rn(Bf16ToFloat(xr[j]), wv[j], acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kGemvMaxRowsPerPass; ++i) {
    if (i < m) {
      float v = acc[i];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) y[i * ldy + row] = v;
    }
  }
}

}  // namespace

bool Fp8TwinFitsFastPath(const uint8_t* exps_host, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (exps_host[i] > 134) return false;  // e <= 7: 2^(e+120) must be a finite bf16
  return true;
}

cudaError_t HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                        const uint8_t* exps, int64_t n, float* y, int64_t ldy, bool fast_path,
                        cudaStream_t stream) {
  DH_CUDA_TRY(ValidateGemv(x, m, k, codes, exps, n, y, ldy));
  return ByPasses(x, m, k, y, ldy, [&](const uint16_t* xp, int mm, float* yp) -> cudaError_t {
    if (!fast_path) {
      const int64_t blocks = (n + 7) / 8;
      if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
      GemvFp8Fallback<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(xp, mm, k, codes, exps,
                                                                          n, yp, ldy);
      return cudaGetLastError();
    }
    return DispatchByBucket<kDefaultDepth>(xp, mm, k, codes, exps, n, yp, ldy, stream);
  });
}

}  // namespace drafthead::cuda
