// Host-to-device copy by a kernel: the device reads pinned host memory (cudaHostAlloc: mapped, one
// address on both sides) over PCIe. For the tens of KB of a step's rows and descriptors this ends
// sooner than a copy-engine transfer, whose set-up dominates at that size, and, unlike a memcpy,
// it lets the next kernel launch early (dependent_launch.cuh): the GEMV's first weight loads are
// in flight while the rows arrive.
// dst: device memory; src: pinned host memory; both 16-byte aligned; any byte count. Launched as
// an ordinary (not dependent) kernel: it waits for everything before it on the stream.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace drafthead::cuda {

cudaError_t CopyFromPinnedHost(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace drafthead::cuda
