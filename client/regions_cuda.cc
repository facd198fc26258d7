// CudaRegion::Register (CUDA builds): the allocation's IPC handle, the pointer's offset in it and
// the PCI bus id of its GPU, registered as a CUDA_IPC region.
#include <cuda.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "client/regions.h"

namespace drafthead::client {
namespace {

absl::Status CudaFailed(const char* what, cudaError_t e) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaRegion>> CudaRegion::Register(DraftHeadClient& client,
                                                                 const std::string& name,
                                                                 void* device_ptr, uint64_t bytes) {
  cudaPointerAttributes attr{};
  if (cudaError_t e = cudaPointerGetAttributes(&attr, device_ptr); e != cudaSuccess)
    return CudaFailed("cudaPointerGetAttributes", e);
  if (attr.type != cudaMemoryTypeDevice)
    return absl::InvalidArgumentError("CudaRegion: the pointer is not device memory (cudaMalloc)");
  // The handle names the whole allocation; the region starts at the pointer's offset in it.
  CUdeviceptr base = 0;
  size_t alloc_bytes = 0;
  if (cuMemGetAddressRange(&base, &alloc_bytes, reinterpret_cast<CUdeviceptr>(device_ptr)) != CUDA_SUCCESS)
    return absl::FailedPreconditionError("cuMemGetAddressRange failed on the pointer");
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, device_ptr); e != cudaSuccess)
    return CudaFailed("cudaIpcGetMemHandle", e);
  char bus_id[32] = {};
  if (cudaError_t e = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), attr.device); e != cudaSuccess)
    return CudaFailed("cudaDeviceGetPCIBusId", e);
  std::unique_ptr<CudaRegion> r(new CudaRegion(client, name, bytes, device_ptr));
  v1::RegisterRegionRequest req;
  req.set_name(name);
  req.set_kind(v1::CUDA_IPC);
  req.set_cuda_ipc_handle(reinterpret_cast<const char*>(&handle), sizeof(handle));
  req.set_cuda_device(bus_id);
  req.set_offset(reinterpret_cast<CUdeviceptr>(device_ptr) - base);
  req.set_byte_size(bytes);
  if (absl::Status s = r->RegisteredRegion::Register(req); !s.ok()) return s;
  return r;
}

}  // namespace drafthead::client
