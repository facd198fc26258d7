#include "kernels/cuda/full_logits.cuh"

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace drafthead::cuda::epilogue {
namespace {

__global__ void __launch_bounds__(256) FullLogitsKernel(const float* __restrict__ y, int64_t ldy,
                                                        int64_t n, const ReduceRow* __restrict__ rows,
                                                        uint8_t* __restrict__ payload) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.y];
  if (r.mode != static_cast<uint8_t>(ReduceMode::kFullLogits)) return;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (j >= n) return;
  if (r.out_bf16) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(payload + r.out_offset);
    if (j + 4 <= n) {
      const float4 v = *reinterpret_cast<const float4*>(src + j);
      uint2 o;
      o.x = FloatToBf16(v.x) | (static_cast<uint32_t>(FloatToBf16(v.y)) << 16);
      o.y = FloatToBf16(v.z) | (static_cast<uint32_t>(FloatToBf16(v.w)) << 16);
      if ((j & 3) == 0 && ((r.out_offset & 7) == 0)) {
        *reinterpret_cast<uint2*>(dst + j) = o;
        return;
      }
    }
    for (int64_t c = j; c < n && c < j + 4; ++c) dst[c] = FloatToBf16(src[c]);
  } else {
    float* dst = reinterpret_cast<float*>(payload + r.out_offset);
    if (j + 4 <= n) {
      *reinterpret_cast<float4*>(dst + j) = *reinterpret_cast<const float4*>(src + j);
      return;
    }
    for (int64_t c = j; c < n; ++c) dst[c] = src[c];
  }
}

}  // namespace

cudaError_t LaunchFullLogits(const float* y, int64_t ldy, int64_t n_shard, const ReduceRow* rows,
                             int nrows, uint8_t* payload, cudaStream_t stream) {
  const int64_t fx = (n_shard + 1023) / 1024;
  if (fx > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchDependent(FullLogitsKernel, dim3(static_cast<unsigned>(fx), nrows), dim3(256), 0,
                         stream, y, ldy, n_shard, rows, payload);
}

}  // namespace drafthead::cuda::epilogue
