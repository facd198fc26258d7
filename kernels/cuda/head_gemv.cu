#include "kernels/cuda/head_gemv.cuh"

#include "kernels/cuda/head_gemv_kernel.cuh"
#include "kernels/cuda/head_gemv_wgmma.cuh"

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

// One thread a 16-byte piece of the packed layout (head_gemv.cuh).
__global__ void PackFp8CodesKernel(const uint8_t* __restrict__ codes, int64_t n, int64_t k,
                                   uint4* __restrict__ packed, int64_t pieces) {
  const int64_t steps = PackedSteps(k);
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pieces;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int lane = static_cast<int>(p & 31), half = static_cast<int>((p >> 5) & 1);
    const int64_t step = (p >> 6) % steps, tile = (p >> 6) / steps;
    const int64_t row = tile * 16 + 8 * half + (lane >> 2), col = step * 64 + 16 * (lane & 3);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < n && col < k) v = *reinterpret_cast<const uint4*>(codes + row * k + col);
    packed[p] = v;
  }
}

}  // namespace

cudaError_t PackFp8Codes(const uint8_t* codes, int64_t n, int64_t k, uint8_t* packed,
                         cudaStream_t stream) {
  if (n < 1 || k < 32 || k % 32 != 0 || !codes || !packed || !Aligned16(codes) || !Aligned16(packed))
    return cudaErrorInvalidValue;
  const int64_t pieces = Fp8PackedCodesBytes(n, k) / 16;
  const int64_t blocks = std::min<int64_t>((pieces + 255) / 256, 65535);
  PackFp8CodesKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      codes, n, k, reinterpret_cast<uint4*>(packed), pieces);
  return cudaGetLastError();
}

bool Fp8TwinFitsFastPath(const uint8_t* exps_host, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (exps_host[i] > 134) return false;  // e <= 7: 2^(e+120) must be a finite bf16
  return true;
}

cudaError_t HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* packed,
                        const uint8_t* exps, int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  DH_CUDA_TRY(ValidateGemv(x, m, k, packed, exps, n, y, ldy));
  return ByPasses(x, m, k, y, ldy, [&](const uint16_t* xp, int mm, float* yp) {
    return DispatchProduction(xp, mm, k, packed, exps, n, yp, ldy, stream);
  });
}

cudaError_t HeadGemvFp8Exact(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                             const uint8_t* exps, int64_t n, float* y, int64_t ldy,
                             cudaStream_t stream) {
  DH_CUDA_TRY(ValidateGemv(x, m, k, codes, exps, n, y, ldy));
  return ByPasses(x, m, k, y, ldy, [&](const uint16_t* xp, int mm, float* yp) -> cudaError_t {
    const int64_t blocks = (n + 7) / 8;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    GemvFp8Fallback<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(xp, mm, k, codes, exps, n,
                                                                        yp, ldy);
    return cudaGetLastError();
  });
}

}  // namespace drafthead::cuda
