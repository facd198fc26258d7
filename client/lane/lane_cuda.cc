// Stream-ordered lane calls for a caller whose rows and answers are on a GPU (lane_c_api.h): the
// caller's stream writes the request slot's fence word after its rows (cuStreamWriteValue32), and
// waits on the completion's done_seq (cuStreamWaitValue32), both on the lane object mapped into
// the device's address space (cuMemHostRegister). The host never waits for the GPU, the GPU never
// waits for the host. libcuda's entry points are looked up at run time, so this library builds and
// loads without CUDA.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "client/lane/lane_cuda.h"

namespace drafthead::lane {
namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
constexpr unsigned kHostRegisterPortable = 0x01, kHostRegisterDeviceMap = 0x02;
constexpr unsigned kWaitValueEq = 0x1;

struct CudaApi {
  CUresult (*MemHostRegister)(void*, size_t, unsigned) = nullptr;
  CUresult (*MemHostUnregister)(void*) = nullptr;
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*StreamWriteValue32)(CUstream, CUdeviceptr, uint32_t, unsigned) = nullptr;
  CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  std::string error;
};

template <typename F>
bool Find(void* lib, F* f, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if ((*f = reinterpret_cast<F>(dlsym(lib, n))) != nullptr) return true;
  return false;
}

const CudaApi& Api() {
  static const CudaApi api = [] {
    CudaApi a;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      a.error = std::string("cannot load libcuda.so.1: ") + dlerror();
      return a;
    }
    const bool ok = Find(lib, &a.MemHostRegister, {"cuMemHostRegister_v2", "cuMemHostRegister"}) &&
                    Find(lib, &a.MemHostUnregister, {"cuMemHostUnregister"}) &&
                    Find(lib, &a.MemHostGetDevicePointer, {"cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"}) &&
                    Find(lib, &a.StreamWriteValue32, {"cuStreamWriteValue32_v2", "cuStreamWriteValue32"}) &&
                    Find(lib, &a.StreamWaitValue32, {"cuStreamWaitValue32_v2", "cuStreamWaitValue32"}) &&
                    Find(lib, &a.GetErrorString, {"cuGetErrorString"});
    if (!ok) a.error = "libcuda.so.1 lacks the stream memory operations (cuStreamWaitValue32)";
    return a;
  }();
  return api;
}

LaneError CudaFailed(const char* what, CUresult r) {
  const char* s = nullptr;
  if (Api().GetErrorString != nullptr) Api().GetErrorString(r, &s);
  return LaneError{13, std::string(what) + ": CUDA error " + std::to_string(r) + (s ? std::string(" (") + s + ")" : "")};
}

}  // namespace

LaneCuda::~LaneCuda() {
  stop_.store(true);
  if (watchdog_.joinable()) watchdog_.join();
  if (registered_ != nullptr) Api().MemHostUnregister(registered_);
}

LaneError LaneCuda::Attach(LaneRing* ring) {
  const CudaApi& api = Api();
  if (!api.error.empty()) return LaneError{9, api.error};
  ring_ = ring;
  CUresult r = api.MemHostRegister(ring->base(), ring->bytes(), kHostRegisterPortable | kHostRegisterDeviceMap);
  if (r != 0) return CudaFailed("cuMemHostRegister of the lane object (is a CUDA context current?)", r);
  registered_ = ring->base();
  CUdeviceptr d = 0;
  r = api.MemHostGetDevicePointer(&d, ring->base(), 0);
  if (r != 0) return CudaFailed("cuMemHostGetDevicePointer", r);
  device_base_ = d;
  // A stream waiting on an answer the server will never write would hang: once the server is
  // gone, answer what is outstanding here (UNAVAILABLE), which releases such streams.
  watchdog_ = std::thread([this] {
    while (!stop_.load()) {
      LaneError s = ring_->CheckServer();
      if (!s.ok()) {
        ring_->FailOutstanding(s);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  return {};
}

LaneError LaneCuda::Fence(uint64_t seq, void* stream) {
  const CUresult r = Api().StreamWriteValue32(stream, device_base_ + ring_->fence_offset(seq),
                                              static_cast<uint32_t>(seq + 1), 0);
  return r == 0 ? LaneError{} : CudaFailed("cuStreamWriteValue32 (the fence)", r);
}

LaneError LaneCuda::WaitOn(uint64_t seq, void* stream) {
  const CUresult r = Api().StreamWaitValue32(stream, device_base_ + ring_->done_offset(seq),
                                             static_cast<uint32_t>(seq + 1), kWaitValueEq);
  return r == 0 ? LaneError{} : CudaFailed("cuStreamWaitValue32 (the answer)", r);
}

}  // namespace drafthead::lane
