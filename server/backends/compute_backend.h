// A compute backend holds one rank's shard (the fp8 twin, optionally the bf16 head) and turns a
// batch of hidden rows into this rank's payload (server/group/wire_format.h): its slice of the
// full logits for FULL_LOGITS rows, k candidates and a softmax partial for reduction rows.
// Implementations: cpu_backend.cc, cuda_backend.cc (CUDA builds).
//
// Threads: one caller at a time (whoever drives the rank's engine; the CUDA backend sets its
// device on every call). Failure: statuses, never exceptions or aborts.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/head_gemv.h"
#include "server/group/memory_space.h"
#include "server/group/shard_geometry.h"
#include "server/group/stage_times.h"
#include "server/group/wire_format.h"

namespace drafthead {

struct BackendOptions {
  int threads = 0;       // CPU: worker threads (0: all hardware threads)
  int device = -1;       // CUDA: device ordinal, required (the server decides it once: ChooseDevice)
  bool keep_bf16 = false;
  int max_rows = kMaxRowsLimit;  // CUDA: work buffers for this many rows are allocated at Load
  bool cuda_graphs = true;  // CUDA: replay one captured graph per step shape (--cuda-graphs)
  // CUDA step details, measured against each other by drafthead-bench-step (docs/NOTES.md,
  // session 12); the server keeps the defaults.
  bool cuda_upload_by_kernel = true;  // the step's rows go up by a kernel reading pinned memory, not the copy engine
  bool cuda_upload_aside = true;      // a step launched behind another uploads its rows on a second stream by the copy engine, during that one's GEMV (--cuda-upload-aside)
  bool cuda_timing_off_path = true;   // in graphs, the stage events hang off the chain (a side branch), not in it
  bool cuda_stage_events = true;      // time the step's stages with CUDA events (stage_times); off: only the events Finish waits on
  uint32_t cuda_stage_events_every = 1;  // with them, time the first step of every N (the rest: StageTimes::step_untimed)
  bool cuda_overlap_steps = false;    // a step launched behind another runs on a second stream, with its own logits and scratch: its GEMV may start during that one's epilogue
  size_t cuda_direct_payload_max = 64 * 1024;  // host payloads up to this size written by the epilogue into pinned memory (no D2H copy)
  int cuda_smem_carveout = -1;  // the step's kernels' preferred shared-memory carveout (percent); -1: none given
  cpu::GemvIsa cpu_isa = cpu::GemvIsa::kAuto;  // CPU: the GEMV implementation (--isa)
};

struct LoadReport {
  double twin_seconds = 0;  // time spent building the twin (0 when loaded from --twin)
  size_t device_bytes = 0;  // weight bytes resident for this rank
};

// N buffers of one kind, handed out in turn (see Launch and ScratchBuffer).
template <typename Buffer, int N>
class BufferRing {
 public:
  Buffer& Next() {
    next_ = (next_ + 1) % N;
    return b_[next_];
  }
  Buffer& operator[](int i) { return b_[i]; }
  int last() const { return next_; }  // the one Next returned last

 private:
  Buffer b_[N];
  int next_ = N - 1;
};

// Host payloads a backend hands out in turn: the batch being answered, the one finishing and the
// one launched behind it (Launch / Finish).
inline constexpr int kHostPayloads = 3;

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // Whether Launch, ScratchBuffer and CopyToHost accept MemorySpace::kDevice.
  virtual bool has_device_memory() const = 0;

  // Takes ownership of the shard. Builds the twin when w.codes is empty; keeps the bf16 head
  // only when options.keep_bf16 (otherwise frees it). Refuses shapes it cannot serve.
  virtual absl::StatusOr<LoadReport> Load(ShardWeights w) = 0;
  virtual bool has_bf16() const = 0;

  // Computes this rank's payload for ctl.rows rows of x (bf16 bits [rows, K], host memory) in the
  // layout MakePayloadLayout(ctl.tasks, rows, S) gives, in two calls: Launch starts the batch (a
  // device backend enqueues its step and returns; one without a device computes it), Finish waits
  // for the oldest batch launched and returns its payload. At most two batches are launched and
  // not finished: a second Launch (from the first's while_running) queues a batch behind the first
  // on the device, so that the device goes on to it without waiting for the host.
  // The result lives in a backend-owned buffer in `space` (kDevice only for backends with device
  // memory): a device one is valid until the next Launch; host ones are kHostPayloads used in turn,
  // each valid until kHostPayloads more batches were launched in host space, so that a finished
  // batch's payload can be answered from while the next ones run (no copy).
  // `while_running` (may be empty) is the caller's work to overlap with the device's: Finish calls
  // it once, on the calling thread, after the batch stopped reading x and the InputRows buffer (the
  // next batch's rows may be written there and that batch launched meanwhile) and before it waits
  // for the device; a backend without a device calls it with the payload computed. Not called when
  // the batch failed first. A failed Launch leaves nothing launched; after a failed Finish the
  // backend may only be destroyed (the group fails).
  // ctl.device_out (backends with device memory alone; others refuse a batch naming any): those
  // rows' logits are copied from the device payload to their destinations before Finish returns
  // (CheckDeviceRowsOut's rules); a host payload then holds the first HostPayloadBytes bytes, and
  // those rows' blocks in it are unspecified.
  virtual absl::Status Launch(const BatchControl& ctl, const uint16_t* x, MemorySpace space) = 0;
  virtual absl::StatusOr<const void*> Finish(const std::function<void()>& while_running) = 0;
  // Launch, then Finish.
  absl::StatusOr<const void*> Run(const BatchControl& ctl, const uint16_t* x, MemorySpace space,
                                  const std::function<void()>& while_running = nullptr) {
    if (absl::Status s = Launch(ctl, x, space); !s.ok()) return s;
    return Finish(while_running);
  }
  // Where the next Launch's x (bf16 [rows, K]) may be written so that Launch, given this pointer,
  // need not copy it again (the CUDA backend's pinned upload buffer); valid until the next Launch
  // or InputRows. While a batch is launched and not finished it never moves the buffers in use:
  // nullptr when the rows do not fit them. nullptr: no such buffer (Launch copies or reads x).
  virtual uint16_t* InputRows(uint32_t rows) { (void)rows; return nullptr; }
  // Backends with device memory: the device buffer the step reads x from, as it lays rows out
  // there (bf16 [rows, K]: fp8-twin rows first, then bf16-exact rows, each group in batch order),
  // so that a group's rows cross from GPU to GPU (RankEngine, rows apart): rank 0 fills it from
  // host rows with UploadRows, the others receive the same bytes into it, and a Launch given it as
  // x reads the rows there (nothing uploaded but the row descriptors). Only with no batch launched
  // (a step in flight reads it); nullptr then, and without a device. Valid until the next Launch,
  // InputRows, DeviceRows or UploadRows call.
  virtual void* DeviceRows(uint32_t rows) { (void)rows; return nullptr; }
  // Copies the batch's host rows x (bf16 [ctl.rows, K], in batch order) into DeviceRows' buffer,
  // laid out as it says, and returns it once they are there (a collective on another stream may
  // read them). Only with no batch launched. UNIMPLEMENTED without a device.
  virtual absl::StatusOr<const uint16_t*> UploadRows(const BatchControl& ctl, const uint16_t* x) {
    (void)ctl, (void)x;
    return absl::UnimplementedError(name() + " backend: no device memory");
  }
  // The last successful Finish's stages (broadcast and gather left 0).
  virtual StageTimes stage_times() const = 0;

  // A backend-owned scratch buffer of `bytes` in `space` (rank 0's gather target; in host memory,
  // where a device gather is copied back: pinned on the GPU), and a copy from it to host memory. A
  // device one is valid until the next call for kDevice; host ones are two used in turn, each
  // valid until the second-next call for kHost.
  virtual absl::StatusOr<void*> ScratchBuffer(size_t bytes, MemorySpace space) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes, MemorySpace space) = 0;
};

// ctl.device_out against the batch and this rank's geometry: entries in row order, inside the
// batch, not overlapping, FULL_LOGITS rows of one dtype per entry, each with a destination and a
// pitch that holds a row of valid_cols values. INVALID_ARGUMENT saying which rule an entry breaks.
absl::Status CheckDeviceRowsOut(const BatchControl& ctl, const ShardGeometry& geo);
// The bytes of a host payload the answers read: up to the end of the last row not copied to device
// memory (0 when every row is).
size_t HostPayloadBytes(const BatchControl& ctl, const PayloadLayout& layout);

std::unique_ptr<ComputeBackend> MakeCpuBackend(const BackendOptions& options);
// The CUDA devices this process sees (cudaGetDeviceCount). UNIMPLEMENTED in builds without CUDA.
absl::StatusOr<int> CudaDeviceCount();

// Returns an error in builds without CUDA, and INVALID_ARGUMENT without options.device.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeCudaBackend(const BackendOptions& options,
                                                                int local_rank);

}  // namespace drafthead
