// CUDA_IPC regions (CUDA builds): another process's cudaMalloc allocation, opened on rank 0's GPU
// with cudaIpcOpenMemHandle (peer access enabled lazily when the memory is on another GPU).
//
// Callers register several regions in one allocation (a caching allocator puts the hidden-state
// and logits tensors in one block): the runtime counts the opens of one handle in one context and
// returns the same pointer, so each region opens and closes the handle on its own.
//
// Copies run on the calling thread's per-thread default stream (cudaStreamPerThread), which does
// not serialize with the backend's streams, and are waited for before returning.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "server/regions/region_registry.h"

namespace drafthead::regions {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why, cudaError_t e) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", why, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

class CudaIpcMapping final : public RegionMapping {
 public:
  CudaIpcMapping(void* opened, int serving, int owner, uint8_t* data)
      : opened_(opened), serving_(serving), owner_(owner), data_(data) {}
  ~CudaIpcMapping() override {
    cudaSetDevice(serving_);
    cudaIpcCloseMemHandle(opened_);
  }

  uint8_t* host_data() override { return nullptr; }
  void* device_data() override { return data_; }
  int device_id() const override { return owner_; }

  absl::Status Read(uint64_t offset, void* host_dst, size_t n) override {
    return Copy(host_dst, data_ + offset, n, cudaMemcpyDeviceToHost);
  }
  absl::Status Write(uint64_t offset, const void* host_src, size_t n) override {
    return Copy(data_ + offset, host_src, n, cudaMemcpyHostToDevice);
  }
  absl::Status WriteRows(uint64_t offset, uint64_t dst_pitch, const void* host_src, uint64_t src_pitch,
                         uint64_t width, uint64_t rows) override {
    DH_CUDA_RETURN_IF_ERROR(cudaSetDevice(serving_), 0);
    DH_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(data_ + offset, dst_pitch, host_src, src_pitch, width, rows,
                                              cudaMemcpyHostToDevice, cudaStreamPerThread), 0);
    DH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamPerThread), 0);
    return absl::OkStatus();
  }

 private:
  absl::Status Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    DH_CUDA_RETURN_IF_ERROR(cudaSetDevice(serving_), 0);
    DH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, cudaStreamPerThread), 0);
    DH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamPerThread), 0);
    return absl::OkStatus();
  }

  void* const opened_;  // what cudaIpcOpenMemHandle returned: the allocation's start
  const int serving_, owner_;
  uint8_t* const data_;  // the region's first byte in this process's address space
};

}  // namespace

absl::StatusOr<std::unique_ptr<RegionMapping>> MapCudaIpcRegion(const RegionSpec& spec,
                                                                int serving_device) {
  if (spec.cuda_ipc_handle.size() != sizeof(cudaIpcMemHandle_t))
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc_handle: got ",
                                                   spec.cuda_ipc_handle.size(), " bytes, want ",
                                                   sizeof(cudaIpcMemHandle_t)));
  if (spec.byte_size == 0) return absl::InvalidArgumentError("byte_size: must be > 0");
  if (spec.offset > UINT64_MAX - spec.byte_size)
    return absl::InvalidArgumentError("offset: offset + byte_size overflows");
  int owner = serving_device;
  if (!spec.cuda_device.empty()) {
    const cudaError_t e = cudaDeviceGetByPCIBusId(&owner, spec.cuda_device.c_str());
    if (e != cudaSuccess)
      return Invalid("cuda_device", absl::StrCat("no GPU '", spec.cuda_device, "' on this host"), e);
  }
  if (owner != serving_device) {
    int can = 0;
    const cudaError_t e = cudaDeviceCanAccessPeer(&can, serving_device, owner);
    if (e != cudaSuccess || !can)
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_device: GPU ", owner, " (", spec.cuda_device,
          ") is not reachable by peer access from rank 0's GPU ", serving_device));
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, spec.cuda_ipc_handle.data(), sizeof(handle));
  void* base = nullptr;
  DH_CUDA_RETURN_IF_ERROR(cudaSetDevice(serving_device), 0);
  cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) return Invalid("cuda_ipc_handle", "cannot open the handle", e);
  cudaPointerAttributes attr{};
  e = cudaPointerGetAttributes(&attr, base);
  if (e == cudaSuccess && spec.cuda_device.empty()) owner = attr.device;  // where it really is
  auto mapping = std::make_unique<CudaIpcMapping>(base, serving_device, owner,
                                                  static_cast<uint8_t*>(base) + spec.offset);
  // From here the mapping closes the handle on every return.
  if (e != cudaSuccess) return Invalid("cuda_ipc_handle", "cannot query the memory", e);
  if (attr.device != owner)
    return absl::InvalidArgumentError(absl::StrCat("cuda_device: the handle's memory is on GPU ",
                                                   attr.device, ", not on ", spec.cuda_device));
  // The opened pointer is the allocation's start; the region must end inside it.
  CUdeviceptr alloc = 0;
  size_t alloc_bytes = 0;
  const CUresult r = cuMemGetAddressRange(&alloc, &alloc_bytes, reinterpret_cast<CUdeviceptr>(base));
  if (r != CUDA_SUCCESS)
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc_handle: cannot size the allocation (CUresult ", r, ")"));
  const uint64_t avail = alloc_bytes - (reinterpret_cast<CUdeviceptr>(base) - alloc);
  if (spec.offset + spec.byte_size > avail)
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size: offset ", spec.offset, " + byte_size ", spec.byte_size,
        " exceeds the allocation (", avail, " bytes)"));
  return mapping;
}

}  // namespace drafthead::regions
