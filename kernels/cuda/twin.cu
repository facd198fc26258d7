#include "kernels/cuda/twin.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/numeric.h"

namespace drafthead::cuda {
namespace {

// 2^p as fp32 for p in [-149, 127], the value std::ldexp(1.0f, p) gives on the host.
__device__ __forceinline__ float Pow2(int p) {
  return p >= -126 ? __uint_as_float(static_cast<uint32_t>(p + 127) << 23)
                   : __uint_as_float(1u << (p + 149));
}

// One warp per 32x32 block: lane r owns row r of the block (64 contiguous bytes of bf16), so the
// block amax is one warp max and every lane converts its own 32 values. 8 warps cover 8 adjacent
// column blocks of one 32-row band.
__global__ void __launch_bounds__(256) TwinKernel(const uint16_t* __restrict__ w, int64_t n,
                                                  int64_t k, uint8_t* __restrict__ codes,
                                                  uint8_t* __restrict__ exps) {
  const int64_t band = blockIdx.x;
  const int64_t kb = static_cast<int64_t>(blockIdx.y) * 8 + (threadIdx.x >> 5);
  const int64_t kblocks = k / 32;
  if (kb >= kblocks) return;  // whole warp leaves together
  const int lane = threadIdx.x & 31;
  const int64_t row = band * 32 + lane;
  const bool present = row < n;
  uint4 v[4] = {};
  if (present) {
    const uint4* src = reinterpret_cast<const uint4*>(w + row * k + kb * 32);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __ldg(src + i);
  }
  const uint32_t* u = reinterpret_cast<const uint32_t*>(v);
  uint32_t m = 0;  // bf16 magnitude order is its bit order
#pragma unroll
  for (int i = 0; i < 16; ++i) m = max(m, max(u[i] & 0x7fffu, (u[i] >> 16) & 0x7fffu));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float a = fmaxf(Bf16ToFloat(static_cast<uint16_t>(m)), __uint_as_float(0x00800000u));
  const int e = TwinBlockExponent(a);
  if (lane == 0) exps[band * kblocks + kb] = static_cast<uint8_t>(e + 127);
  if (!present) return;
  const float inv = Pow2(-e);
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t o = 0;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t word = u[2 * i + j];
      const uint32_t lo = FloatToE4m3(Bf16ToFloat(static_cast<uint16_t>(word & 0xffffu)) * inv);
      const uint32_t hi = FloatToE4m3(Bf16ToFloat(static_cast<uint16_t>(word >> 16)) * inv);
      o |= (lo | (hi << 8)) << (16 * j);
    }
    out[i] = o;
  }
  uint4* dst = reinterpret_cast<uint4*>(codes + row * k + kb * 32);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace

cudaError_t MakeTwin(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, uint8_t* exps,
                     cudaStream_t stream) {
  if (n <= 0 || k <= 0 || k % 32 != 0) return cudaErrorInvalidValue;
  const int64_t bands = (n + 31) / 32;
  const int64_t groups = (k / 32 + 7) / 8;
  if (groups > 65535 || bands > 0x7fffffff) return cudaErrorInvalidValue;
  TwinKernel<<<dim3(static_cast<unsigned>(bands), static_cast<unsigned>(groups)), 256, 0, stream>>>(
      w, n, k, codes, exps);
  return cudaGetLastError();
}

}  // namespace drafthead::cuda
