// The lane's copy kernel, for stream-ordered calls (lane_cuda.cc): one launch copies a call's rows
// into its arena slot and writes the slot's fence word, or copies its answer out and writes the
// consumed word, where the libcuda calls it replaces (a copy, then a stream write: ~4.4 + 1.9 us of
// host time each on the GPU host, NOTES.md session 15) cost twice a launch. One CTA (the sizes it
// takes are small: lane_cuda.cc kKernelCopyMax), so the word is written after every thread's
// copies without a grid-wide barrier. Built to PTX and embedded in the lane's library
// (client/CMakeLists.txt), loaded at attach; without it the library makes the libcuda calls.
#include <cstdint>

#include "client/lane/lane_copy.h"

extern "C" __global__ void __launch_bounds__(512) dh_lane_copy(drafthead::lane::LaneCopyArgs a) {
  const uint32_t t = threadIdx.x, nt = blockDim.x;
  for (uint32_t p = 0; p < a.n; ++p) {
    const uint64_t s = a.src[p], d = a.dst[p], b = a.bytes[p];
    if (((s | d | b) & 15) == 0) {
      const uint4* __restrict__ src = reinterpret_cast<const uint4*>(s);
      uint4* __restrict__ dst = reinterpret_cast<uint4*>(d);
#pragma unroll 4
      for (uint64_t i = t; i < b / 16; i += nt) dst[i] = a.fresh ? __ldcv(src + i) : src[i];
    } else if (((s | d | b) & 3) == 0) {
      const uint32_t* __restrict__ src = reinterpret_cast<const uint32_t*>(s);
      uint32_t* __restrict__ dst = reinterpret_cast<uint32_t*>(d);
#pragma unroll 4
      for (uint64_t i = t; i < b / 4; i += nt) dst[i] = a.fresh ? __ldcv(src + i) : src[i];
    } else {
      const uint8_t* src = reinterpret_cast<const uint8_t*>(s);
      uint8_t* dst = reinterpret_cast<uint8_t*>(d);
      for (uint64_t i = t; i < b; i += nt)
        dst[i] = a.fresh ? *reinterpret_cast<const volatile uint8_t*>(src + i) : src[i];
    }
  }
  if (a.word == 0) return;
  // Every thread's copies ordered before the word for every observer (the server's GPU stream in
  // another process, the host): a system fence a thread, the barrier, a system fence, the store.
  __threadfence_system();
  __syncthreads();
  if (t == 0) {
    __threadfence_system();
    *reinterpret_cast<volatile uint32_t*>(a.word) = a.value;
  }
}
