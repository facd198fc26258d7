// Stream-ordered lane calls for a caller whose rows and answers are on a GPU (lane_c_api.h): the
// caller's stream writes the request slot's fence word after its rows (cuStreamWriteValue32), and
// waits on the completion's done_seq (cuStreamWaitValue32), both on the lane object mapped into
// the device's address space (cuMemHostRegister). The host never waits for the GPU, the GPU never
// waits for the host. With host IO (SetHostIo) the rows and token answers cross in host memory
// mapped for the device too. libcuda's entry points are looked up at run time, so this library
// builds and loads without CUDA.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "client/lane/lane_cuda.h"

#include "client/lane/lane_copy.h"
#include "common/lane/doorbell.h"

#ifdef DRAFTHEAD_LANE_COPY_PTX
extern const char dh_lane_copy_ptx[];  // lane_copy.cu as PTX (client/CMakeLists.txt)
#endif

namespace drafthead::lane {
namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
constexpr unsigned kHostRegisterPortable = 0x01, kHostRegisterDeviceMap = 0x02;
constexpr unsigned kWaitValueGeq = 0x0, kWaitValueEq = 0x1;

struct CudaApi {
  CUresult (*MemHostRegister)(void*, size_t, unsigned) = nullptr;
  CUresult (*MemHostUnregister)(void*) = nullptr;
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*StreamWriteValue32)(CUstream, CUdeviceptr, uint32_t, unsigned) = nullptr;
  CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned) = nullptr;
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;  // host IO without the kernel
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  // The copy kernel's (optional: without them the library makes libcuda copies).
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) = nullptr;
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
                    Find(lib, &a.MemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync"}) &&
                    Find(lib, &a.GetErrorString, {"cuGetErrorString"});
    if (!ok) a.error = "libcuda.so.1 lacks the stream memory operations (cuStreamWaitValue32)";
    Find(lib, &a.MemcpyAsync, {"cuMemcpyAsync"});  // not _ptsz: stream 0 is the legacy stream, as elsewhere here
    if (!(Find(lib, &a.CtxGetCurrent, {"cuCtxGetCurrent"}) && Find(lib, &a.ModuleLoadData, {"cuModuleLoadData"}) &&
          Find(lib, &a.ModuleGetFunction, {"cuModuleGetFunction"}) && Find(lib, &a.ModuleUnload, {"cuModuleUnload"}) &&
          Find(lib, &a.LaunchKernel, {"cuLaunchKernel"})))
      a.LaunchKernel = nullptr;
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
  if (ring_ != nullptr) {  // the ring may outlive this: nothing of it stays there
    ring_->SetSlotHolder(nullptr);
    for (uint32_t slot = 0; slot < ring_->depth(); ++slot) ring_->ExpectConsumed(slot, nullptr, 0);
  }
  stop_.store(true);
  if (watchdog_.joinable()) watchdog_.join();
  if (registered_ != nullptr) Api().MemHostUnregister(registered_);
  if (consumed_registered_) Api().MemHostUnregister(consumed_);
  if (arena_registered_ != nullptr) Api().MemHostUnregister(arena_registered_);
  std::free(consumed_);
  if (module_ != nullptr) Api().ModuleUnload(module_);
}

void LaneCuda::LoadCopyKernel() {
#ifdef DRAFTHEAD_LANE_COPY_PTX
  const CudaApi& api = Api();
  if (api.LaunchKernel == nullptr) {
    copy_kernel_error_ = "libcuda.so.1 lacks the module entry points (cuModuleLoadData, cuLaunchKernel)";
    return;
  }
  CUresult r = api.CtxGetCurrent(&context_);
  if (r != 0 || context_ == nullptr) {
    copy_kernel_error_ = "no current CUDA context at attach";
    return;
  }
  r = api.ModuleLoadData(&module_, dh_lane_copy_ptx);
  if (r == 0) r = api.ModuleGetFunction(&copy_fn_, module_, "dh_lane_copy");
  if (r != 0) {
    copy_kernel_error_ = CudaFailed("loading the copy kernel's PTX (cuModuleLoadData)", r).message;
    copy_fn_ = nullptr;
    return;
  }
  use_copy_kernel_ = true;  // ~10 us less host time a call (docs/NOTES.md, session 18)
#else
  copy_kernel_error_ = "the lane library was built without a CUDA compiler (no copy kernel in it)";
#endif
}

bool LaneCuda::SetCopyKernel(int use, std::string* why) {
  std::lock_guard<std::mutex> l(mu_);
  if (use >= 0) use_copy_kernel_ = use > 0 && copy_fn_ != nullptr;
  if (why != nullptr) *why = copy_fn_ != nullptr ? std::string() : copy_kernel_error_;
  return use_copy_kernel_;
}

bool LaneCuda::SetHostIo(int use, std::string* why) {
  std::lock_guard<std::mutex> l(mu_);
  if (use >= 0) use_host_io_ = use > 0 && arena_device_ != 0;
  if (why != nullptr) *why = arena_device_ != 0 ? std::string() : host_io_error_;
  return use_host_io_;
}

void LaneCuda::RegisterHostArena() {
  const CudaApi& api = Api();
  if (api.MemcpyAsync == nullptr) {
    host_io_error_ = "libcuda.so.1 lacks cuMemcpyAsync";
    return;
  }
  const uint64_t hidden = uint64_t{ring_->depth()} * ring_->config().hidden_slot_bytes;
  if (ring_->arena_key().empty() || hidden == 0) {
    host_io_error_ = "the lane has no host arena";
    return;
  }
  // The hidden areas lead the arena (LaneRing::hidden_area_offset); whole pages of its mapping.
  const uint64_t bytes = std::min((hidden + 4095) / 4096 * 4096, (ring_->arena_bytes() + 4095) / 4096 * 4096);
  void* base = ring_->hidden_area(0);
  CUresult r = api.MemHostRegister(base, bytes, kHostRegisterPortable | kHostRegisterDeviceMap);
  if (r != 0) {
    host_io_error_ = CudaFailed("cuMemHostRegister of the host arena's hidden areas", r).message;
    return;
  }
  arena_registered_ = base;
  CUdeviceptr d = 0;
  r = api.MemHostGetDevicePointer(&d, base, 0);
  if (r != 0) {
    host_io_error_ = CudaFailed("cuMemHostGetDevicePointer (the host arena)", r).message;
    return;
  }
  arena_device_ = d;
  use_host_io_ = true;  // 0.65-0.92 of the CUDA arenas' synchronised call under MPS (docs/NOTES.md, session 19)
}

int LaneCuda::LaunchCopy(const LaneCopyArgs& args, void* stream) {
  LaneCopyArgs a = args;
  void* params[] = {&a};
  return Api().LaunchKernel(copy_fn_, 1, 1, 1, kCopyThreads, 1, 1, 0, stream, params, nullptr);
}

bool LaneCuda::CopyKernelUsable(uint64_t bytes) const {
  if (!use_copy_kernel_ || bytes > kKernelCopyMax) return false;
  CUcontext current = nullptr;  // the module is the attach context's: launches only from it
  return Api().CtxGetCurrent(&current) == 0 && current == context_;
}

LaneError LaneCuda::Attach(LaneRing* ring, uint64_t hidden_arena, uint64_t output_arena) {
  const CudaApi& api = Api();
  if (!api.error.empty()) return LaneError{9, api.error};
  ring_ = ring;
  hidden_arena_ = hidden_arena;
  output_arena_ = output_arena;
  CUresult r = api.MemHostRegister(ring->base(), ring->bytes(), kHostRegisterPortable | kHostRegisterDeviceMap);
  if (r != 0) return CudaFailed("cuMemHostRegister of the lane object (is a CUDA context current?)", r);
  registered_ = ring->base();
  CUdeviceptr d = 0;
  r = api.MemHostGetDevicePointer(&d, ring->base(), 0);
  if (r != 0) return CudaFailed("cuMemHostGetDevicePointer", r);
  device_base_ = d;
  // The consumed words, one a slot, written by the caller's streams (page-aligned for the register).
  const size_t consumed_bytes = (ring->depth() * sizeof(uint32_t) + 4095) / 4096 * 4096;
  consumed_ = static_cast<uint32_t*>(std::aligned_alloc(4096, consumed_bytes));
  if (consumed_ == nullptr) return LaneError{8, "out of memory for the lane's consumed words"};
  std::memset(consumed_, 0, consumed_bytes);
  r = api.MemHostRegister(consumed_, consumed_bytes, kHostRegisterPortable | kHostRegisterDeviceMap);
  if (r != 0) return CudaFailed("cuMemHostRegister of the consumed words", r);
  consumed_registered_ = true;
  r = api.MemHostGetDevicePointer(&d, consumed_, 0);
  if (r != 0) return CudaFailed("cuMemHostGetDevicePointer (the consumed words)", r);
  consumed_device_ = d;
  slots_.assign(ring->depth(), SlotCall{});
  LoadCopyKernel();  // optional: without it, libcuda copies
  RegisterHostArena();  // optional: without it, no host IO
  ring_->SetSlotHolder([this](uint64_t seq, int64_t deadline_ns) { return Reclaim(seq, deadline_ns); });
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

LaneCuda::Plan LaneCuda::MakePlan(const LaneRequest& d, uint64_t hidden_bytes, bool copies_follow) const {
  Plan p;
  p.r = d;
  p.r.flags |= kFlagHiddenFence;
  // The slot's area of the host arena (region 0) with host IO, else of the CUDA hidden arena (1).
  p.host_rows = use_host_io_;
  p.r.hidden = LaneSlice{p.host_rows ? 0u : 1u, 0, 0, hidden_bytes};
  // A token answer the library copies out comes inline with host IO, where it fits.
  p.inline_answer = use_host_io_ && copies_follow && d.mode != kModeFullLogits && d.output.region != kNoRegion &&
                    d.output.offset == 0 && d.output.byte_size <= ring_->inline_bytes();
  if (p.inline_answer) p.r.output = LaneSlice{kNoRegion, 0, 0, 0};
  p.area = p.inline_answer ? d.output.byte_size : ring_->config().output_slot_bytes;
  return p;
}

LaneError LaneCuda::MergeCopies(const Plan& p, const CopyOut* copies, uint32_t n, CopyOut* merged,
                                uint32_t* n_merged) {
  // Adjacent pieces merged: a caller's tensors cut from one buffer are one copy.
  if (n > kMaxCopies) return LaneError{3, "copies: at most " + std::to_string(kMaxCopies) + " pieces"};
  *n_merged = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const CopyOut& c = copies[i];
    if (c.offset > p.area || c.bytes > p.area - c.offset)
      return LaneError{3, "copies: piece " + std::to_string(i) + " (" + std::to_string(c.bytes) + " bytes at " +
                              std::to_string(c.offset) + ") is outside the slot's " +
                              (p.inline_answer ? "answer of " : "output area of ") + std::to_string(p.area) + " bytes"};
    if (c.bytes == 0) continue;
    CopyOut* last = *n_merged > 0 ? &merged[*n_merged - 1] : nullptr;
    if (last != nullptr && last->dst + last->bytes == c.dst && last->offset + last->bytes == c.offset) {
      last->bytes += c.bytes;
    } else {
      merged[(*n_merged)++] = c;
    }
  }
  return {};
}

LaneError LaneCuda::Call(const LaneRequest& d, uint64_t hidden, uint64_t hidden_bytes, void* stream, bool wait,
                         int64_t deadline_ns, const CopyOut* copies, uint32_t n_copies, uint64_t* seq) {
  std::unique_lock<std::mutex> l(mu_);
  const Plan p = MakePlan(d, hidden_bytes, n_copies > 0);
  if (LaneError e = ring_->CheckSlotSlices(p.r); !e.ok()) return e;
  CopyOut merged[kMaxCopies];
  uint32_t n_merged = 0;
  if (LaneError e = MergeCopies(p, copies, n_copies, merged, &n_merged); !e.ok()) return e;  // nothing submitted
  if (LaneError e = SubmitLocked(l, p, hidden, hidden_bytes, stream, deadline_ns, seq); !e.ok()) return e;
  return FinishLocked(l, *seq, merged, n_merged, wait, deadline_ns);
}

LaneError LaneCuda::Submit(const LaneRequest& d, uint64_t hidden, uint64_t hidden_bytes, void* stream,
                           bool copies_follow, int64_t deadline_ns, uint64_t* seq) {
  std::unique_lock<std::mutex> l(mu_);
  const Plan p = MakePlan(d, hidden_bytes, copies_follow);
  if (LaneError e = ring_->CheckSlotSlices(p.r); !e.ok()) return e;
  return SubmitLocked(l, p, hidden, hidden_bytes, stream, deadline_ns, seq);
}

LaneError LaneCuda::Finish(uint64_t seq, const CopyOut* copies, uint32_t n_copies, bool wait, int64_t deadline_ns) {
  std::unique_lock<std::mutex> l(mu_);
  SlotCall& s = slots_[seq % slots_.size()];
  if (s.open != seq + 1)
    return LaneError{3, "seq " + std::to_string(seq) + " is not a submitted stream-ordered call awaiting its finish"};
  CopyOut merged[kMaxCopies];
  uint32_t n_merged = 0;
  LaneError bad = MergeCopies(s.plan, copies, n_copies, merged, &n_merged);
  if (!bad.ok()) n_merged = 0;  // still finished (the stream waits for the answer), but nothing copied
  if (LaneError e = FinishLocked(l, seq, merged, n_merged, wait && bad.ok(), deadline_ns); !e.ok()) return e;
  return bad;
}

LaneError LaneCuda::SubmitLocked(std::unique_lock<std::mutex>& l, const Plan& p, uint64_t hidden,
                                 uint64_t hidden_bytes, void* stream, int64_t deadline_ns, uint64_t* seq) {
  if (LaneError e = Settle(l, UINT64_MAX, deadline_ns); !e.ok()) return e;
  if (LaneError e = TakeDeferred(); !e.ok()) return e;
  uint64_t n = 0;
  // The next slot may be held by a call of this lane's: its release needs mu_, which this thread
  // holds, so settle that call (or wait for its Finish) here rather than wait in Reserve.
  for (;;) {
    const uint64_t next = ring_->NextSeq();
    const auto held = std::find_if(pending_.begin(), pending_.end(),
                                   [&](uint64_t p) { return p % ring_->depth() == next % ring_->depth(); });
    if (held == pending_.end()) {
      // Free, or a host call's (or an abandoned slot, answered soon): the ring waits; bounded
      // slices, as another thread's host call may take `next` and leave the one after it to us.
      const int64_t slice = std::min(deadline_ns, MonotonicNanos() + 1'000'000);
      LaneError e = ring_->Reserve(slice, &n, /*host=*/false);
      if (e.ok()) break;
      if (e.code != 8 || slice == deadline_ns) return e;  // 8: RESOURCE_EXHAUSTED (the slice ran out)
      continue;
    }
    if (LaneError e = Settle(l, *held, deadline_ns); !e.ok()) return e;  // waits for a Finish too
    if (LaneError e = TakeDeferred(); !e.ok()) return e;  // an earlier call's failure: before submitting
  }
  const CudaApi& api = Api();
  const uint32_t slot = static_cast<uint32_t>(n % ring_->depth());
  SlotCall& s = slots_[slot];
  CUresult cr = 0;
  // The slot's previous answer may still be waiting for its copy-out on another stream: the server
  // must not overwrite it (it writes this call's answer once it sees this call's fence), so this
  // stream waits for that copy-out's consumed word first. On the same stream, stream order does.
  const uint32_t word = static_cast<uint32_t>(s.consumed);  // seq + 1 of the slot's previous call with copies
  if (s.consumed != 0 && s.stream != stream && __atomic_load_n(&consumed_[slot], __ATOMIC_ACQUIRE) != word) {
    cr = api.StreamWaitValue32(stream, consumed_device_ + slot * sizeof(uint32_t), word, kWaitValueGeq);
    if (cr != 0) {
      ring_->Cancel(n);
      return CudaFailed("cuStreamWaitValue32 (the slot's previous copy-out)", cr);
    }
  }
  const uint64_t hidden_dst = p.host_rows ? arena_device_ + ring_->hidden_area_offset(slot)
                                          : hidden_arena_ + slot * ring_->config().hidden_slot_bytes;
  const uint64_t fence = device_base_ + ring_->fence_offset(n);
  if (CopyKernelUsable(hidden_bytes)) {
    // One launch: the rows, then the fence word after them.
    LaneCopyArgs a{};
    a.src[0] = hidden, a.dst[0] = hidden_dst, a.bytes[0] = hidden_bytes, a.n = 1;
    a.word = fence, a.value = static_cast<uint32_t>(n + 1);
    cr = LaunchCopy(a, stream);
    if (cr != 0) {
      ring_->Cancel(n);
      return CudaFailed("cuLaunchKernel (the rows into the lane's arena and the fence)", cr);
    }
  } else {
    cr = p.host_rows ? api.MemcpyAsync(hidden_dst, hidden, hidden_bytes, stream)
                     : api.MemcpyDtoDAsync(hidden_dst, hidden, hidden_bytes, stream);
    if (cr != 0) {
      ring_->Cancel(n);
      return CudaFailed("cuMemcpyAsync (the rows into the lane's arena)", cr);
    }
    // The fence after the copy, on the same stream: the server reads the rows once it sees it.
    cr = api.StreamWriteValue32(stream, fence, static_cast<uint32_t>(n + 1), 0);
    if (cr != 0) {
      ring_->Cancel(n);
      return CudaFailed("cuStreamWriteValue32 (the fence)", cr);
    }
  }
  ring_->PublishInSlot(n, p.r);
  pending_.push_back(n);  // published: its answer is released by a later Settle, whatever happens now
  s.stream = stream;
  s.consumed = 0;  // unknown until Finish enqueues the copies (none: the caller's own)
  s.open = n + 1;  // no Settle releases the slot before its Finish
  s.plan = p;
  *seq = n;
  return {};
}

LaneError LaneCuda::FinishLocked(std::unique_lock<std::mutex>& l, uint64_t n, const CopyOut* merged,
                                 uint32_t n_merged, bool wait, int64_t deadline_ns) {
  const CudaApi& api = Api();
  const uint32_t slot = static_cast<uint32_t>(n % ring_->depth());
  SlotCall& s = slots_[slot];
  const Plan& p = s.plan;
  void* stream = s.stream;
  s.open = 0;  // the lock is held until the copies are enqueued: no Settle comes between
  finished_.notify_all();
  CUresult cr = api.StreamWaitValue32(stream, device_base_ + ring_->done_offset(n), static_cast<uint32_t>(n + 1),
                                      kWaitValueEq);
  if (cr != 0) return CudaFailed("cuStreamWaitValue32 (the answer)", cr);
  uint64_t out_bytes = 0;
  for (uint32_t i = 0; i < n_merged; ++i) out_bytes += merged[i].bytes;
  static_assert(kMaxCopies <= kLaneCopyPieces, "the copy kernel takes every merged piece");
  // The answer: inline in the slot's completion (host memory, mapped), or in its CUDA output area.
  const uint64_t answer = p.inline_answer ? device_base_ + ring_->done_offset(n) + kCompletionHeaderBytes
                                          : output_arena_ + slot * ring_->config().output_slot_bytes;
  const CUdeviceptr consumed = consumed_device_ + slot * sizeof(uint32_t);
  if (n_merged > 0 && CopyKernelUsable(out_bytes)) {
    // One launch: the pieces, then the consumed word after them.
    LaneCopyArgs a{};
    for (uint32_t i = 0; i < n_merged; ++i)
      a.src[i] = answer + merged[i].offset, a.dst[i] = merged[i].dst, a.bytes[i] = merged[i].bytes;
    a.n = n_merged, a.word = consumed, a.value = static_cast<uint32_t>(n + 1);
    a.fresh = p.inline_answer ? 1 : 0;  // the server wrote it from the host after this slot's last call
    cr = LaunchCopy(a, stream);
    if (cr != 0) return CudaFailed("cuLaunchKernel (the answer out of the lane's arena and the consumed word)", cr);
    s.consumed = n + 1;
    ring_->ExpectConsumed(slot, &consumed_[slot], static_cast<uint32_t>(n + 1));
  } else {
    // With no pieces too: the consumed word then marks the stream past its wait on the answer,
    // its last touch of the lane's memory (what Drain waits for).
    for (uint32_t i = 0; i < n_merged; ++i) {
      cr = p.inline_answer ? api.MemcpyAsync(merged[i].dst, answer + merged[i].offset, merged[i].bytes, stream)
                           : api.MemcpyDtoDAsync(merged[i].dst, answer + merged[i].offset, merged[i].bytes, stream);
      if (cr != 0) return CudaFailed("cuMemcpyAsync (the answer out of the lane)", cr);
    }
    cr = api.StreamWriteValue32(stream, consumed, static_cast<uint32_t>(n + 1), 0);
    if (cr != 0) return CudaFailed("cuStreamWriteValue32 (the answer's consumed word)", cr);
    s.consumed = n + 1;
    ring_->ExpectConsumed(slot, &consumed_[slot], static_cast<uint32_t>(n + 1));
  }
  if (!wait) return {};
  if (LaneError e = Settle(l, n, deadline_ns); !e.ok()) return e;
  return TakeDeferred();
}

LaneError LaneCuda::Synchronize(int64_t deadline_ns) {
  std::unique_lock<std::mutex> l(mu_);
  if (!pending_.empty()) {
    if (LaneError e = Settle(l, pending_.back(), deadline_ns); !e.ok()) return e;
  }
  return TakeDeferred();
}

bool LaneCuda::Open(uint64_t seq) {
  std::lock_guard<std::mutex> l(mu_);
  return !slots_.empty() && slots_[seq % slots_.size()].open == seq + 1;
}

bool LaneCuda::Drain(int64_t deadline_ns) {
  ring_->FailOutstanding(LaneError{14 /* UNAVAILABLE */, "the lane was closed before this call's answer came"});
  return ring_->AwaitCopiedOut(deadline_ns);
}

bool LaneCuda::Reclaim(uint64_t seq, int64_t deadline_ns) {
  // try_lock: a stream-ordered call in progress settles the answers itself (and may hold the lock
  // while it waits for a slot the asking host call holds).
  std::unique_lock<std::mutex> l(mu_, std::try_to_lock);
  if (!l.owns_lock() || slots_[seq % slots_.size()].open != 0 ||
      std::find(pending_.begin(), pending_.end(), seq) == pending_.end())
    return false;
  (void)Settle(l, seq, deadline_ns);  // a failed answer stays deferred for the stream-ordered caller
  return true;
}

LaneError LaneCuda::Settle(std::unique_lock<std::mutex>& l, uint64_t through, int64_t deadline_ns) {
  while (!pending_.empty()) {
    const uint64_t n = pending_.front();
    if (slots_[n % slots_.size()].open == n + 1) {  // submitted, not finished: its copies are to come
      if (through == UINT64_MAX || n > through) return {};
      const int64_t left = deadline_ns - MonotonicNanos();
      if (left <= 0)
        return LaneError{4, "deadline exceeded waiting for another thread's stream-ordered call to finish"};
      // Bounded slices: a deadline of INT64_MAX (none) must not overflow the clock's arithmetic.
      finished_.wait_for(l, std::chrono::nanoseconds(std::min<int64_t>(left, 100'000'000)));
      continue;  // pending_ may have changed meanwhile
    }
    if (!ring_->Done(n)) {
      if (through == UINT64_MAX || n > through) return {};
      const LaneCompletion* c = nullptr;
      if (LaneError e = ring_->Wait(n, deadline_ns, &c); !e.ok()) {
        pending_.pop_front();  // Wait abandoned the slot: reclaimed once answered
        return e;
      }
    }
    const LaneCompletion* c = ring_->completion(n);
    if (c->code != 0 && deferred_.ok())
      deferred_ = LaneError{c->code, std::string(c->message, std::min<uint32_t>(c->message_len, kMessageBytes))};
    ring_->Release(n);
    pending_.pop_front();
  }
  return {};
}

LaneError LaneCuda::TakeDeferred() {
  LaneError e;
  std::swap(e, deferred_);
  return e;
}

}  // namespace drafthead::lane
