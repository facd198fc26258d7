#include "kernels/cuda/host_copy.cuh"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"

namespace drafthead::cuda {
namespace {

constexpr int kCopyThreads = 256;

// One 16-byte piece a thread (grid-stride beyond the grid), the last bytes of a count that is not
// a multiple of 16 by thread 0 of CTA 0.
__global__ void __launch_bounds__(kCopyThreads) CopyKernel(uint4* __restrict__ dst,
                                                           const uint4* __restrict__ src,
                                                           size_t pieces, size_t bytes) {
  LetDependentsLaunch();
  for (size_t i = static_cast<size_t>(blockIdx.x) * kCopyThreads + threadIdx.x; i < pieces;
       i += static_cast<size_t>(gridDim.x) * kCopyThreads)
    dst[i] = src[i];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    auto* d = reinterpret_cast<uint8_t*>(dst);
    const auto* s = reinterpret_cast<const uint8_t*>(src);
    for (size_t b = pieces * 16; b < bytes; ++b) d[b] = s[b];
  }
}

}  // namespace

cudaError_t CopyFromPinnedHost(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src || (reinterpret_cast<uintptr_t>(dst) & 15u) || (reinterpret_cast<uintptr_t>(src) & 15u))
    return cudaErrorInvalidValue;
  const size_t pieces = bytes / 16;
  // Enough threads that each reads a piece or two: the copy is latency-bound (a PCIe round trip
  // a load), so parallel loads, not bandwidth, set its time.
  const size_t blocks = std::clamp<size_t>((pieces + kCopyThreads - 1) / kCopyThreads, 1, 1024);
  return LaunchKernel(CopyKernel, dim3(static_cast<unsigned>(blocks)), dim3(kCopyThreads), 0, stream,
                      false, static_cast<uint4*>(dst), static_cast<const uint4*>(src), pieces, bytes);
}

}  // namespace drafthead::cuda
