// Programmatic dependent launch (PDL, sm_90): a kernel launched with LaunchDependent may start
// while the kernel before it on the stream is still running; it must call
// WaitForPrerequisites() before it reads anything an earlier operation on the stream writes, or
// writes anything one reads (the wait returns once the previous kernel has finished and its writes
// are visible; at once where there is no programmatic dependency: after a copy, an event, or
// outside PDL). What it gains: the dependent's launch, and its work that needs no inputs (the
// GEMV's first weight loads), overlap the previous kernel's tail. Graph capture keeps the
// dependency as a programmatic edge when the two kernels are adjacent in the stream.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_carveout.h"

namespace drafthead::cuda {

__device__ __forceinline__ void WaitForPrerequisites() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Lets the next kernel on the stream (if launched with LaunchDependent) launch now.
__device__ __forceinline__ void LetDependentsLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// cudaLaunchKernelEx with programmatic stream serialization (PDL) when `programmatic`, and the
// thread's carveout when one is set.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, bool programmatic, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (programmatic) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (t_shared_carveout >= 0) {
    attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attr[n++].val.sharedMemCarveout = static_cast<unsigned>(t_shared_carveout);
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Per-device caches of launch set-up (a bit or a slot a device) cover devices 0 .. kMaxDevices - 1.
constexpr int kMaxDevices = 64;

// The opt-in to `bytes` of dynamic shared memory for `kernel` on the current device, made once a
// (kernel, device) rather than a driver call a launch. `prepared`: one bit a device (a static
// beside the kernel's launcher); devices from kMaxDevices on are refused.
template <typename... Params>
cudaError_t OptInSharedMemory(void (*kernel)(Params...), int bytes, std::atomic<uint64_t>& prepared) {
  static_assert(kMaxDevices <= 64, "one bit a device");
  int dev = 0;
  DH_CUDA_TRY(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  const uint64_t bit = uint64_t{1} << dev;
  if (!(prepared.load(std::memory_order_acquire) & bit)) {
    DH_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    prepared.fetch_or(bit, std::memory_order_release);
  }
  return cudaSuccess;
}

template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  return LaunchKernel(kernel, grid, block, smem, stream, true, std::forward<Args>(args)...);
}

}  // namespace drafthead::cuda
