// ComputeBackend on one CUDA GPU (CUDA builds only; compute_backend.cc answers the non-CUDA case).
// Device memory holds the fp8 twin (built on the GPU from the bf16 shard, or uploaded from
// --twin), optionally the bf16 shard (--keep-bf16), and work buffers sized at Load for
// --max-rows rows of the largest payload (so Run allocates nothing): x, the fp32 logits of the
// batch, the payload (with cuda_overlap_steps two sets of logits and payload: a step launched
// behind another runs on a second stream with the other, its GEMV free to start during the first
// one's epilogue). Host traffic goes through pinned staging buffers: one upload of (x rows
// grouped by head + the per-row epilogue descriptors; only the descriptors when a group's rows
// arrived on the device: DeviceRows), by a kernel reading the pinned buffer (or the copy engine;
// for a step launched behind another, the copy engine on a second stream into the other of two
// device buffers, overlapping that step's GEMV), and, for kHost, the payload: written by the
// epilogue into pinned memory when small, else one download; one stream synchronization per Run.
// FULL_LOGITS rows bound for device memory (BatchControl::device_out: a caller's CUDA region) are
// copied there from the device payload after the step, and left out of the download.
// Events between the stages time them (stage_times), in one step of every cuda_stage_events_every
// (the rest, and all with cuda_stage_events off, read 0 and step_untimed: ~5 us a step). The step's
// launches are captured once per shape (rows, epilogue kernels, bytes back) into a CUDA graph and
// replayed (--cuda-graphs; cuBLAS rows run eagerly); the kernels are programmatic dependents of
// the one before (kernels/cuda/dependent_launch.cuh).
//
// Threads: one caller at a time (whoever drives the rank's engine); every entry point makes the
// device current first, so the caller need not. Failure: absl::Status naming the failing
// statement, file:line and rank; a failed CUDA call may leave the device unusable (sticky
// errors), so the engine should treat a non-OK Run as fatal for the rank.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/head_bf16.cuh"
#include "kernels/cuda/head_gemv.cuh"
#include "kernels/cuda/host_copy.cuh"
#include "kernels/cuda/launch_carveout.h"
#include "kernels/cuda/shard_reduce.cuh"
#include "kernels/cuda/twin.cuh"
#include "server/backends/compute_backend.h"
#include "common/cuda_status.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace drafthead {
namespace {

#define DH_CUDA_CHECK(expr) DH_CUDA_RETURN_IF_ERROR(expr, rank_)
#define DH_CUBLAS_CHECK(expr) DH_CUBLAS_RETURN_IF_ERROR(expr, rank_)

cudaError_t AllocDevice(void** p, size_t n) { return cudaMalloc(p, n); }
cudaError_t AllocPinned(void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocDefault); }

// Grow-only allocations (never shrink: batches vary from step to step). kHeadroom: a quarter more
// than asked, for fewer re-allocations of pinned host memory (slow to allocate).
template <cudaError_t (*kAlloc)(void**, size_t), cudaError_t (*kFree)(void*), size_t kMinBytes, bool kHeadroom>
struct GrowOnlyMem {
  void* p = nullptr;
  size_t bytes = 0;
  ~GrowOnlyMem() { Free(); }
  void Free() {
    if (p) kFree(p);
    p = nullptr;
    bytes = 0;
  }
  cudaError_t Reserve(size_t n) {
    if (n <= bytes) return cudaSuccess;
    Free();
    const size_t want = std::max<size_t>(kHeadroom ? n + n / 4 : n, kMinBytes);
    const cudaError_t e = kAlloc(&p, want);
    if (e == cudaSuccess) bytes = want;
    return e;
  }
};
using DeviceMem = GrowOnlyMem<AllocDevice, cudaFree, 256, false>;
using PinnedMem = GrowOnlyMem<AllocPinned, cudaFreeHost, 4096, true>;

size_t Align16(size_t n) { return (n + 15) & ~size_t{15}; }

class CudaBackend : public ComputeBackend {
 public:
  CudaBackend(const BackendOptions& o, int local_rank) : opts_(o), rank_(local_rank) {}

  ~CudaBackend() override {
    if (device_ >= 0) cudaSetDevice(device_);
    DropGraphs();
    if (cublas_) cublasDestroy(cublas_);
    for (auto& step_events : events_)
      for (cudaEvent_t e : step_events)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : forks_)
      if (e) cudaEventDestroy(e);
    if (side_) cudaStreamDestroy(side_);
    if (upload_) cudaStreamDestroy(upload_);
    if (stream1_) cudaStreamDestroy(stream1_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    int count = 0;
    DH_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (count < 1) return absl::FailedPreconditionError("cuda backend: no CUDA device visible");
    // The caller decides the device (the server: ChooseDevice, shared with NCCL and regions).
    const int dev = opts_.device;
    if (dev < 0) return absl::InvalidArgumentError("cuda backend: no device given (BackendOptions::device)");
    if (dev >= count)
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda backend (rank ", rank_, "): device ", dev, " requested but ", count,
          " visible (the server picks one per rank: --devices, else local rank % visible)"));
    device_ = dev;
    DH_CUDA_CHECK(cudaSetDevice(device_));
    DH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DH_CUBLAS_CHECK(cublasCreate(&cublas_));
    DH_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    for (auto& step_events : events_)
      for (cudaEvent_t& e : step_events) DH_CUDA_CHECK(cudaEventCreate(&e));
    DH_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    DH_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_, cudaStreamNonBlocking));
    if (opts_.cuda_overlap_steps) DH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream1_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : forks_) DH_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return absl::OkStatus();
  }

  std::string name() const override { return "cuda"; }
  bool has_device_memory() const override { return true; }
  bool has_bf16() const override { return bf16_.p != nullptr; }

  absl::StatusOr<LoadReport> Load(ShardWeights w) override {
    DH_CUDA_CHECK(cudaSetDevice(device_));
    const ShardGeometry& g = w.geo;
    if (g.hidden <= 0 || g.hidden % 32 != 0 || g.shard_rows <= 0)
      return absl::InvalidArgumentError(absl::StrCat("cuda backend (rank ", rank_,
                                                     "): hidden size ", g.hidden,
                                                     " must be a positive multiple of 32 and the "
                                                     "shard non-empty (rows ", g.shard_rows, ")"));
    const int64_t S = g.shard_rows, K = g.hidden;
    const size_t elems = static_cast<size_t>(S) * K;
    const size_t exp_elems = static_cast<size_t>((S + 31) / 32) * (K / 32);
    const bool have_bf16 = w.bf16.size() == elems;
    if (!w.bf16.empty() && !have_bf16)
      return absl::InvalidArgumentError("cuda backend: the bf16 shard has the wrong size");
    if (w.codes.empty() && !have_bf16)
      return absl::InvalidArgumentError("cuda backend: neither a twin nor a full bf16 shard given");
    if (opts_.keep_bf16 && !have_bf16)
      return absl::InvalidArgumentError("cuda backend: --keep-bf16 needs the bf16 shard");
    if (!w.codes.empty() && (w.codes.size() != elems || w.exps.size() != exp_elems))
      return absl::InvalidArgumentError("cuda backend: twin shape does not match the shard");

    LoadReport rep;
    DropGraphs();  // they name the old shard
    bf16_.Free();
    DH_CUDA_CHECK(codes_.Reserve(elems));
    DH_CUDA_CHECK(exps_.Reserve(exp_elems));
    std::vector<uint8_t> host_exps;
    if (have_bf16 && (w.codes.empty() || opts_.keep_bf16)) {
      DH_CUDA_CHECK(bf16_.Reserve(elems * 2));
      DH_CUDA_CHECK(cudaMemcpy(bf16_.p, w.bf16.data(), elems * 2, cudaMemcpyHostToDevice));
    }
    if (w.codes.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      DH_CUDA_CHECK(cuda::MakeTwin(static_cast<const uint16_t*>(bf16_.p), S, K,
                                   static_cast<uint8_t*>(codes_.p), static_cast<uint8_t*>(exps_.p),
                                   stream_));
      DH_CUDA_CHECK(cudaStreamSynchronize(stream_));
      rep.twin_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      host_exps.resize(exp_elems);
      DH_CUDA_CHECK(cudaMemcpy(host_exps.data(), exps_.p, exp_elems, cudaMemcpyDeviceToHost));
    } else {
      DH_CUDA_CHECK(cudaMemcpy(codes_.p, w.codes.data(), elems, cudaMemcpyHostToDevice));
      DH_CUDA_CHECK(cudaMemcpy(exps_.p, w.exps.data(), exp_elems, cudaMemcpyHostToDevice));
      host_exps = std::move(w.exps);
    }
    // Blocks with |w| >= 448 * 2^15 need the exact CUDA-core GEMV (kernels/cuda/head_gemv.cuh).
    fast_path_ = cuda::Fp8TwinFitsFastPath(host_exps.data(), static_cast<int64_t>(host_exps.size()));
    packed_.Free();
    if (fast_path_) {  // the fast GEMV reads the codes in its fragment order: rearranged once here
      DH_CUDA_CHECK(packed_.Reserve(static_cast<size_t>(cuda::Fp8PackedCodesBytes(S, K))));
      DH_CUDA_CHECK(cuda::PackFp8Codes(static_cast<const uint8_t*>(codes_.p), S, K,
                                       static_cast<uint8_t*>(packed_.p), stream_));
      DH_CUDA_CHECK(cudaStreamSynchronize(stream_));
      codes_.Free();
    }
    if (!opts_.keep_bf16) bf16_.Free();
    geo_ = g;
    DH_RETURN_IF_ERROR(ReserveWork(std::clamp(opts_.max_rows, 1, kMaxRowsLimit)));
    loaded_ = true;
    rep.device_bytes = elems + exp_elems + (bf16_.p ? elems * 2 : 0);
    return rep;
  }

  absl::Status Launch(const BatchControl& ctl, const uint16_t* x, MemorySpace space) override {
    if (!loaded_) return absl::FailedPreconditionError("cuda backend: Launch before Load");
    DH_CUDA_CHECK(cudaSetDevice(device_));
    const int rows = static_cast<int>(ctl.rows);
    if (rows < 1 || rows > kMaxRowsLimit)
      return absl::InvalidArgumentError(absl::StrCat("cuda backend: batch of ", rows, " rows"));
    DH_RETURN_IF_ERROR(CheckDeviceRowsOut(ctl, geo_));
    if (launched_.size() >= 2)
      return absl::FailedPreconditionError("cuda backend: a third batch launched before one finished");
    if (!launched_.empty() && rows > reserved_rows_)
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda backend: a batch of ", rows, " rows launched behind another needs larger buffers (",
          reserved_rows_, " rows reserved: --max-rows)"));
    const int64_t S = geo_.shard_rows, K = geo_.hidden;
    const PayloadLayout layout = MakePayloadLayout(ctl.tasks, rows, S);
    const size_t xbytes = static_cast<size_t>(rows) * K * 2;
    const size_t desc_off = Align16(xbytes);
    const size_t stage_bytes = desc_off + rows * sizeof(cuda::ReduceRow);

    // No-ops after Load's ReserveWork unless a batch exceeds --max-rows (tests).
    DH_RETURN_IF_ERROR(ReserveWork(rows));
    // The upload buffer is free once the steps in flight have read it (their H2D).
    DH_RETURN_IF_ERROR(UploadsDone());

    // The rows grouped by head (each head's weights read once; y rows follow that order) in the
    // upload buffer, or already on the device (DeviceRows, UploadRows): then only the row
    // descriptors go up.
    const bool x_on_device = x == dstages_[0].p;
    if (x_on_device && !launched_.empty())
      return absl::FailedPreconditionError(
          "cuda backend: rows on the device behind a batch in flight (its step reads that buffer)");
    if (!x_on_device) GroupRowsIntoStage(ctl, x);
    auto* desc = reinterpret_cast<cuda::ReduceRow*>(static_cast<uint8_t*>(stage_.p) + desc_off);
    int n_fp8 = 0, n_bf16 = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const RowHead head = pass == 0 ? RowHead::kFp8Twin : RowHead::kBf16Exact;
      for (int i = 0; i < rows; ++i) {
        const RowTask& t = ctl.tasks[i];
        if (t.head != head) continue;
        const int yr = n_fp8 + n_bf16;
        (pass == 0 ? n_fp8 : n_bf16)++;
        cuda::ReduceRow& d = desc[i];
        d = cuda::ReduceRow{};
        d.y_row = yr;
        d.mode = static_cast<uint8_t>(t.mode);
        d.out_bf16 = t.dtype == OutDType::kBf16;
        d.k = t.mode == RowMode::kFullLogits ? 0 : t.k;
        d.temperature = t.temperature;
        d.row_in_request = t.row_in_request;
        d.seed = t.seed;
        d.out_offset = layout.row_offset[i];
      }
    }
    if (n_fp8 + n_bf16 != rows)
      return absl::InvalidArgumentError("cuda backend: a row names an unknown head");
    if (n_bf16 > 0 && !bf16_.p)
      return absl::FailedPreconditionError(
          "cuda backend: BF16_EXACT rows but the bf16 head was not kept (--keep-bf16)");
    if (cuda::ValidateReduceRows(desc, rows) != cudaSuccess)
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda backend: a row has an unknown mode, k outside 1..", cuda::kMaxTopK,
          " (1 for ARGMAX / SAMPLE) or a temperature <= 0"));

    Step step;
    step.rows = rows;
    step.n_fp8 = n_fp8;
    step.n_bf16 = n_bf16;
    step.stage_bytes = stage_bytes;
    step.desc_off = desc_off;
    step.upload_from = x_on_device ? desc_off : 0;
    // Behind a step in flight, the rows go to the other device buffer by the copy engine on
    // upload_, overlapping that step's GEMV (on the one stream they would wait for its epilogue),
    // and with cuda_overlap_steps that buffer's logits, payload, scratch and stream. Every step before the one in flight has finished (Finish waited for it; at most two
    // launched), so the other buffer is free. A step alone uses buffer 0 (DeviceRows' and
    // UploadRows').
    if (!launched_.empty()) {
      step.buffer = 1 - launched_.back().buffer;
      step.upload_aside = opts_.cuda_upload_aside;
    }
    // A small host payload is written by the epilogue straight into the slot's pinned buffer
    // (mapped: one address on both sides), saving the D2H copy's node and its latency. Rows copied
    // to device memory are copied from the device payload, and need not come back.
    step.direct_payload = space == MemorySpace::kHost && ctl.device_outs == 0 &&
                          layout.bytes() <= opts_.cuda_direct_payload_max;
    step.d2h_bytes = space == MemorySpace::kHost && !step.direct_payload ? HostPayloadBytes(ctl, layout) : 0;
    step.timed = opts_.cuda_stage_events &&
                 steps_launched_++ % std::max<uint32_t>(opts_.cuda_stage_events_every, 1) == 0;
    // The step's events and host payload: neither the step in flight's nor the one being answered
    // from (kHostPayloads in turn).
    hpayloads_.Next();
    step.slot = hpayloads_.last();
    Launched launched;
    launched.slot = step.slot;
    launched.space = space;
    launched.buffer = step.buffer;
    launched.upload_aside = step.upload_aside;
    launched.timed = step.timed;
    DH_RETURN_IF_ERROR(LaunchStep(step, desc, &launched.graphed));
    if (ctl.device_outs > 0) {
      // After the step (its graph holds no caller's addresses), before its last event.
      absl::Status out = CopyRowsOut(ctl, layout, step.buffer);
      if (out.ok())
        out = DH_CUDA_STATUS(cudaEventRecord(events_[step.slot][kOutsDone], StepStream(step.buffer)), rank_);
      if (!out.ok()) {
        (void)cudaStreamSynchronize(StepStream(step.buffer));  // a failed Launch leaves nothing in flight
        return out;
      }
      launched.rows_out = true;
    }
    launched_.push_back(launched);
    return absl::OkStatus();
  }

  absl::StatusOr<const void*> Finish(const std::function<void()>& while_running) override {
    if (launched_.empty()) return absl::FailedPreconditionError("cuda backend: Finish without a Launch");
    DH_CUDA_CHECK(cudaSetDevice(device_));
    const Launched step = launched_.front();
    cudaEvent_t* ev = events_[step.slot];
    if (while_running) {
      // The upload buffer is free once the step's H2D is done (the GEMV reads its device copy):
      // the caller may write the next batch's rows there, and launch it, while this one computes.
      DH_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      while_running();
    }
    launched_.pop_front();
    // The step's one wait: its last event (a step launched behind it may follow on the stream). A
    // collective on another stream may read the payload next (collective.h: device buffers must be
    // complete before a collective call).
    const cudaEvent_t last = step.rows_out ? ev[kOutsDone] : ev[4];
    DH_CUDA_CHECK(cudaEventSynchronize(last));
    float ms[4] = {};
    for (int i = 0; i < (step.timed ? 4 : 0); ++i) {
      // An upload aside ends on upload_: the GEMV's time starts where stream_ took the step up.
      // The copy stage ends after the rows copied out, when there were any.
      cudaEvent_t from = i == 1 && step.upload_aside ? ev[kGemvStart] : ev[i];
      if (cudaEventElapsedTime(&ms[i], from, i == 3 ? last : ev[i + 1]) != cudaSuccess) {
        // Stage times are for the metrics only: a timing the driver refuses is not worth the batch.
        const cudaError_t e = cudaGetLastError();
        if (!timing_warned_)
          Log(LogLevel::kWarn, "stage_timing_unavailable", "rank", rank_, "graph", step.graphed,
              "error", std::string(cudaGetErrorString(e)));
        timing_warned_ = true;
        ms[i] = 0;
      }
    }
    auto us = [](float m) { return static_cast<uint32_t>(m * 1000.f + 0.5f); };
    times_ = StageTimes{};
    times_.h2d_us = us(ms[0]);
    times_.gemv_us = us(ms[1]);
    times_.epilogue_us = us(ms[2]);
    times_.d2h_us = us(ms[3]);
    times_.graph = step.graphed;
    times_.step_untimed = !step.timed;
    return static_cast<const void*>(step.space == MemorySpace::kHost ? hpayloads_[step.slot].p
                                                                      : payloads_[Work(step.buffer)].p);
  }

  void* DeviceRows(uint32_t rows) override {
    if (!loaded_ || !launched_.empty() || rows < 1 || rows > static_cast<uint32_t>(kMaxRowsLimit))
      return nullptr;
    if (cudaSetDevice(device_) != cudaSuccess || !ReserveWork(static_cast<int>(rows)).ok()) {
      (void)cudaGetLastError();
      return nullptr;  // the caller reports it
    }
    return dstages_[0].p;
  }

  absl::StatusOr<const uint16_t*> UploadRows(const BatchControl& ctl, const uint16_t* x) override {
    if (!loaded_) return absl::FailedPreconditionError("cuda backend: UploadRows before Load");
    if (!launched_.empty())
      return absl::FailedPreconditionError("cuda backend: UploadRows while a batch is in flight");
    const int rows = static_cast<int>(ctl.rows);
    if (rows < 1 || rows > kMaxRowsLimit)
      return absl::InvalidArgumentError(absl::StrCat("cuda backend: batch of ", rows, " rows"));
    DH_CUDA_CHECK(cudaSetDevice(device_));
    DH_RETURN_IF_ERROR(ReserveWork(rows));
    GroupRowsIntoStage(ctl, x);
    DH_CUDA_CHECK(cudaMemcpyAsync(dstages_[0].p, stage_.p, static_cast<size_t>(rows) * geo_.hidden * 2,
                                  cudaMemcpyHostToDevice, stream_));
    DH_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a collective on its own stream reads them next
    return static_cast<const uint16_t*>(dstages_[0].p);
  }

  uint16_t* InputRows(uint32_t rows) override {
    if (!loaded_ || rows < 1 || rows > static_cast<uint32_t>(kMaxRowsLimit)) return nullptr;
    if (!launched_.empty() && static_cast<int>(rows) > reserved_rows_) return nullptr;  // would move buffers in use
    if (cudaSetDevice(device_) != cudaSuccess || !ReserveWork(static_cast<int>(rows)).ok() ||
        !UploadsDone().ok()) {
      (void)cudaGetLastError();
      return nullptr;  // Run reports the failure
    }
    return static_cast<uint16_t*>(stage_.p);
  }

  StageTimes stage_times() const override { return times_; }

  absl::StatusOr<void*> ScratchBuffer(size_t bytes, MemorySpace space) override {
    DH_CUDA_CHECK(cudaSetDevice(device_));
    if (space == MemorySpace::kDevice) {
      DH_CUDA_CHECK(dscratch_.Reserve(std::max<size_t>(bytes, 16)));
      return dscratch_.p;
    }
    PinnedMem& h = hscratches_.Next();
    DH_CUDA_CHECK(h.Reserve(std::max<size_t>(bytes, 16)));
    return h.p;
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, MemorySpace space) override {
    if (bytes == 0) return absl::OkStatus();
    if (space == MemorySpace::kHost) {
      if (dst != src) std::memcpy(dst, src, bytes);
      return absl::OkStatus();
    }
    DH_CUDA_CHECK(cudaSetDevice(device_));
    DH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    DH_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  // One batch's device work, as Run laid it out in the staging buffers.
  struct Step {
    int rows = 0, n_fp8 = 0, n_bf16 = 0;
    size_t stage_bytes = 0, desc_off = 0;
    size_t upload_from = 0;  // desc_off when x is on the device already (DeviceRows)
    int buffer = 0;            // dstages_[buffer] holds its rows and descriptors
    bool upload_aside = false;  // uploaded on upload_ before the step (LaunchStep), not in it
    size_t d2h_bytes = 0;  // 0: the payload stays on the device, or is written to the host directly
    bool direct_payload = false;  // the epilogue writes the host payload (hpayloads_[slot])
    bool timed = true;     // its stages timed by events (cuda_stage_events_every)
    int slot = 0;          // its events_ and hpayloads_ (the D2H's target)
  };
  // A step launched and not yet finished.
  struct Launched {
    int slot = 0;
    MemorySpace space = MemorySpace::kHost;
    bool graphed = false;
    int buffer = 0;
    bool upload_aside = false;
    bool rows_out = false;  // rows copied to device memory after the step (its last event: kOutsDone)
    bool timed = true;
  };

  // ctl.device_out's rows from the device payload (laid out as `layout`) to their destinations, on
  // the step's stream after its epilogue: one strided copy each.
  absl::Status CopyRowsOut(const BatchControl& ctl, const PayloadLayout& layout, int buffer) {
    const auto* payload = static_cast<const uint8_t*>(payloads_[Work(buffer)].p);
    for (uint32_t i = 0; i < ctl.device_outs; ++i) {
      const DeviceRowsOut& o = ctl.device_out[i];
      const size_t from = layout.row_offset[o.row0];
      const size_t pitch = layout.row_offset[o.row0 + 1] - from;  // one dtype: equal blocks
      const size_t width =
          static_cast<size_t>(geo_.valid_cols()) * OutDTypeBytes(ctl.tasks[o.row0].dtype);
      DH_CUDA_CHECK(cudaMemcpy2DAsync(o.dst, o.dst_pitch, payload + from, pitch, width, o.rows,
                                      cudaMemcpyDeviceToDevice, StepStream(buffer)));
    }
    return absl::OkStatus();
  }

  // The batch's rows grouped by head into the upload buffer: fp8-twin rows first, then bf16-exact
  // ones, each in batch order (the layout DeviceRows documents). x may already lie there
  // (InputRows): fp8-only batches are then in place, mixed ones regrouped from a copy. Rows of an
  // unknown head are left out (Launch refuses the batch).
  void GroupRowsIntoStage(const BatchControl& ctl, const uint16_t* x) {
    const int rows = static_cast<int>(ctl.rows);
    const int64_t K = geo_.hidden;
    auto* sx = static_cast<uint16_t*>(stage_.p);
    bool all_fp8 = true;
    for (int i = 0; i < rows; ++i) all_fp8 = all_fp8 && ctl.tasks[i].head == RowHead::kFp8Twin;
    if (x == sx) {
      if (all_fp8) return;
      regroup_.assign(x, x + static_cast<size_t>(rows) * K);
      x = regroup_.data();
    }
    int yr = 0;
    for (const RowHead head : {RowHead::kFp8Twin, RowHead::kBf16Exact})
      for (int i = 0; i < rows; ++i)
        if (ctl.tasks[i].head == head)
          std::memcpy(sx + static_cast<size_t>(yr++) * K, x + static_cast<size_t>(i) * K, K * 2);
  }

  // Waits until every step in flight has read the upload buffer (its H2D done).
  absl::Status UploadsDone() {
    for (const Launched& l : launched_) DH_CUDA_CHECK(cudaEventSynchronize(events_[l.slot][1]));
    return absl::OkStatus();
  }

  // The step's stream work, launched one by one: the upload of the staging buffer (a kernel
  // reading pinned memory, which lets the GEMV launch early: dependent_launch.cuh; or the copy
  // engine), the GEMV(s), the epilogue, the D2H of the payload (none when the epilogue wrote it
  // to pinned memory itself), with the timing events between them. While capturing, the events
  // are external records, so that the graph keeps them as event nodes (outside a capture the
  // driver refuses that flag), and with cuda_timing_off_path they hang off the chain on a side
  // branch, so that adjacent kernels keep their programmatic edges.
  absl::Status EnqueueStep(const Step& s, const cuda::ReduceRow* desc) {
    const int64_t S = geo_.shard_rows, K = geo_.hidden, ldy = Ldy();
    const cudaStream_t stream = StepStream(s.buffer);
    const bool capturing = record_flags_ == cudaEventRecordExternal;
    const bool branch = capturing && opts_.cuda_timing_off_path;
    const cuda::ScopedSharedCarveout carveout(opts_.cuda_smem_carveout);
    bool forked = false;  // the side branch has events to join
    auto stamp = [&](int i) -> absl::Status {
      // Untimed, only the events Finish waits on: after the H2D (the upload buffer free) and last.
      if (!s.timed && i != 1 && i != 4) return absl::OkStatus();
      if (branch && i > 0 && i < 4) {
        DH_CUDA_CHECK(cudaEventRecord(forks_[i - 1], stream));
        DH_CUDA_CHECK(cudaStreamWaitEvent(side_, forks_[i - 1], 0));
        DH_CUDA_CHECK(cudaEventRecordWithFlags(events_[s.slot][i], side_, record_flags_));
        forked = true;
        return absl::OkStatus();
      }
      if (forked && i == 4) {  // the side branch joins the chain before the capture ends
        DH_CUDA_CHECK(cudaEventRecord(forks_[3], side_));
        DH_CUDA_CHECK(cudaStreamWaitEvent(stream, forks_[3], 0));
      }
      DH_CUDA_CHECK(cudaEventRecordWithFlags(events_[s.slot][i], stream, record_flags_));
      return absl::OkStatus();
    };
    const DeviceMem& dstage = dstages_[s.buffer];
    if (s.upload_aside) {
      // The upload went ahead on upload_ (LaunchStep); the chain starts at the GEMV.
      if (s.timed) DH_CUDA_CHECK(cudaEventRecordWithFlags(events_[s.slot][kGemvStart], stream, record_flags_));
    } else {
      DH_RETURN_IF_ERROR(stamp(0));
      auto* up_dst = static_cast<uint8_t*>(dstage.p) + s.upload_from;
      const auto* up_src = static_cast<const uint8_t*>(stage_.p) + s.upload_from;
      const size_t up_bytes = s.stage_bytes - s.upload_from;
      if (opts_.cuda_upload_by_kernel) {
        DH_CUDA_CHECK(cuda::CopyFromPinnedHost(up_dst, up_src, up_bytes, stream));
      } else {
        DH_CUDA_CHECK(cudaMemcpyAsync(up_dst, up_src, up_bytes, cudaMemcpyHostToDevice, stream));
      }
      DH_RETURN_IF_ERROR(stamp(1));
    }
    const auto* dx = static_cast<const uint16_t*>(dstage.p);
    auto* y = static_cast<float*>(ys_[Work(s.buffer)].p);
    if (s.n_fp8 > 0) {
      const auto* exps = static_cast<const uint8_t*>(exps_.p);
      DH_CUDA_CHECK(fast_path_ ? cuda::HeadGemvFp8(dx, s.n_fp8, K,
                                                   static_cast<const uint8_t*>(packed_.p), exps, S,
                                                   y, ldy, stream)
                               : cuda::HeadGemvFp8Exact(dx, s.n_fp8, K,
                                                        static_cast<const uint8_t*>(codes_.p), exps,
                                                        S, y, ldy, stream));
    }
    if (s.n_bf16 > 0) {
      DH_CUBLAS_CHECK(cublasSetStream(cublas_, stream));
      DH_CUBLAS_CHECK(cuda::HeadGemmBf16(cublas_, dx + static_cast<size_t>(s.n_fp8) * K, s.n_bf16,
                                         K, static_cast<const uint16_t*>(bf16_.p), S,
                                         y + static_cast<size_t>(s.n_fp8) * ldy, ldy, stream));
    }
    DH_RETURN_IF_ERROR(stamp(2));
    const auto* ddesc = reinterpret_cast<const cuda::ReduceRow*>(
        static_cast<const uint8_t*>(dstage.p) + s.desc_off);
    const DeviceMem& dpayload = payloads_[Work(s.buffer)];
    auto* payload = static_cast<uint8_t*>(s.direct_payload ? hpayloads_[s.slot].p : dpayload.p);
    const DeviceMem& escratch = escratches_[Work(s.buffer)];
    DH_CUDA_CHECK(cuda::ShardEpilogue(y, ldy, S, geo_.valid_cols(),
                                      static_cast<int32_t>(geo_.row_begin()), ddesc, s.rows,
                                      payload, escratch.p, escratch.bytes, stream, desc));
    DH_RETURN_IF_ERROR(stamp(3));
    if (s.d2h_bytes > 0) {
      DH_CUDA_CHECK(cudaMemcpyAsync(hpayloads_[s.slot].p, dpayload.p, s.d2h_bytes,
                                    cudaMemcpyDeviceToHost, stream));
    }
    return stamp(4);
  }

  // Launches the step: replays the graph captured for its shape (capturing it the first time), or
  // launches eagerly (graphs off, cuBLAS rows, a shape whose capture failed, the cache full).
  // Every value a step's kernels read that changes between steps of one shape (x, the row
  // descriptors) lies in its dstages_ buffer, uploaded by the graph's own H2D node (x there
  // already: from the descriptors on) or aside before it; the rest is fixed per shape: the row
  // count, the epilogue's kernels (EpilogueLaunches), the bytes copied back, whether x is
  // uploaded, the slot (its events and the D2H's or the epilogue's host target), whether the
  // epilogue writes to the host, the buffer, whether the upload went aside and whether the step
  // is timed (its stage events).
  absl::Status LaunchStep(const Step& s, const cuda::ReduceRow* desc, bool* graphed) {
    *graphed = false;
    const cudaStream_t stream = StepStream(s.buffer);
    if (s.upload_aside) {
      cudaEvent_t* ev = events_[s.slot];
      if (s.timed) DH_CUDA_CHECK(cudaEventRecord(ev[0], upload_));
      DH_CUDA_CHECK(cudaMemcpyAsync(dstages_[s.buffer].p, stage_.p, s.stage_bytes,
                                    cudaMemcpyHostToDevice, upload_));
      DH_CUDA_CHECK(cudaEventRecord(ev[1], upload_));
      DH_CUDA_CHECK(cudaStreamWaitEvent(stream, ev[1], 0));
    }
    if (!opts_.cuda_graphs || s.n_bf16 > 0) return EnqueueStep(s, desc);
    const GraphKey key{static_cast<uint64_t>(s.rows) |
                           static_cast<uint64_t>(cuda::EpilogueLaunches(geo_.valid_cols(), desc, s.rows)) << 16 |
                           static_cast<uint64_t>(s.slot) << 24 | static_cast<uint64_t>(s.buffer) << 26 |
                           static_cast<uint64_t>(s.direct_payload) << 27 |
                           static_cast<uint64_t>(s.upload_from != 0) << 28 |
                           static_cast<uint64_t>(s.upload_aside) << 29 |
                           static_cast<uint64_t>(s.timed) << 30,
                       s.d2h_bytes};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (graphs_.size() >= kMaxGraphs) return EnqueueStep(s, desc);
      it = graphs_.emplace(key, Capture(s, desc)).first;
    }
    if (it->second == nullptr) return EnqueueStep(s, desc);
    DH_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
    *graphed = true;
    return absl::OkStatus();
  }

  // The step captured into an executable graph; nullptr when capture or instantiation fails (the
  // shape then runs eagerly, which reports any real error).
  cudaGraphExec_t Capture(const Step& s, const cuda::ReduceRow* desc) {
    const cudaStream_t stream = StepStream(s.buffer);
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    record_flags_ = cudaEventRecordExternal;
    const absl::Status enqueued = EnqueueStep(s, desc);
    record_flags_ = cudaEventRecordDefault;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaError_t made = cudaErrorUnknown;
    if (enqueued.ok() && ended == cudaSuccess && graph != nullptr)
      made = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (made != cudaSuccess) {
      (void)cudaGetLastError();  // capture errors are not sticky; the eager launch reports real ones
      Log(LogLevel::kWarn, "cuda_graph_capture_failed", "rank", rank_, "rows", s.rows, "error",
          enqueued.ok() ? std::string(cudaGetErrorString(ended != cudaSuccess ? ended : made))
                        : std::string(enqueued.message()));
      return nullptr;
    }
    return exec;
  }

  // Graphs hold the work buffers' addresses: dropped whenever one is reallocated.
  void DropGraphs() {
    for (auto& [key, exec] : graphs_)
      if (exec) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  // Where a step on `buffer` runs, and the set of logits, payload and scratch buffers it uses: with
  // cuda_overlap_steps a step launched behind another has a stream and a set of its own, so that
  // its GEMV needs not wait for that one's epilogue; else one stream orders both on one set.
  cudaStream_t StepStream(int buffer) const { return buffer == 1 && stream1_ ? stream1_ : stream_; }
  int Work(int buffer) const { return stream1_ ? buffer : 0; }

  int64_t Ldy() const { return (geo_.shard_rows + 3) / 4 * 4; }  // 16-byte aligned logit rows

  // Work buffers for `rows` rows of any mode (the largest payload row is fp32 full logits).
  absl::Status ReserveWork(int rows) {
    const int64_t S = geo_.shard_rows, K = geo_.hidden;
    const size_t stage_bytes =
        Align16(static_cast<size_t>(rows) * K * 2) + rows * sizeof(cuda::ReduceRow);
    size_t payload_bytes = 16;
    for (const RowMode m : {RowMode::kFullLogits, RowMode::kTopK}) {
      RowTask t{};
      t.mode = m;
      t.dtype = OutDType::kFp32;
      t.k = kMaxTopKLimit;
      payload_bytes = std::max(payload_bytes, RowPayloadBytes(t, S) * rows);
    }
    auto addresses = [&] {
      return std::array<const void*, 12>{stage_.p,       dstages_[0].p,     dstages_[1].p,
                                         ys_[0].p,       ys_[1].p,          payloads_[0].p,
                                         payloads_[1].p, escratches_[0].p,  escratches_[1].p,
                                         hpayloads_[0].p, hpayloads_[1].p, hpayloads_[2].p};
    };
    const auto before = addresses();
    DH_CUDA_CHECK(stage_.Reserve(stage_bytes));
    for (DeviceMem& d : dstages_) DH_CUDA_CHECK(d.Reserve(stage_bytes));
    for (int b = 0; b <= Work(1); ++b) {  // the second set: cuda_overlap_steps only
      DH_CUDA_CHECK(ys_[b].Reserve(static_cast<size_t>(rows) * Ldy() * 4));
      DH_CUDA_CHECK(payloads_[b].Reserve(payload_bytes));
      DH_CUDA_CHECK(escratches_[b].Reserve(
          std::max<size_t>(cuda::EpilogueScratchBytes(geo_.valid_cols(), rows), 16)));
    }
    for (int i = 0; i < kHostPayloads; ++i) DH_CUDA_CHECK(hpayloads_[i].Reserve(payload_bytes));
    if (addresses() != before) DropGraphs();
    reserved_rows_ = std::max(reserved_rows_, rows);
    return absl::OkStatus();
  }

  BackendOptions opts_;
  int rank_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;   // everything but buffer 1's steps with cuda_overlap_steps
  cudaStream_t stream1_ = nullptr;  // those (cuda_overlap_steps), else none
  cudaStream_t side_ = nullptr;  // a captured step's timing branch (cuda_timing_off_path)
  cudaStream_t upload_ = nullptr;  // uploads of steps launched behind another (cuda_upload_aside)
  cudaEvent_t forks_[4] = {};    // that branch's three forks and its join
  cublasHandle_t cublas_ = nullptr;
  ShardGeometry geo_;
  bool loaded_ = false;
  bool fast_path_ = true;
  DeviceMem codes_, exps_, bf16_;        // the shard (codes_: row-major, kept off the fast path)
  DeviceMem packed_;                     // fast path: the codes in the GEMV's fragment order
  DeviceMem dstages_[2];  // a step's rows and descriptors on the device: one a step in flight, in turn
  // The logits, device payload and epilogue scratch: one set, or with cuda_overlap_steps one a
  // device buffer (Work).
  DeviceMem ys_[2], payloads_[2], escratches_[2];
  DeviceMem dscratch_;
  PinnedMem stage_;
  BufferRing<PinnedMem, kHostPayloads> hpayloads_;  // host results in turn (Launch)
  BufferRing<PinnedMem, 2> hscratches_;
  std::vector<uint16_t> regroup_;  // x of a mixed-head batch given in stage_ (InputRows)
  // Each slot's: before H2D, after H2D, GEMV, epilogue, D2H, the GEMV's start when the upload
  // went aside (on upload_, so that after H2D is not on stream_), and after the rows copied out to
  // device memory (CopyRowsOut).
  static constexpr int kGemvStart = 5;
  static constexpr int kOutsDone = 6;
  cudaEvent_t events_[kHostPayloads][7] = {};
  std::deque<Launched> launched_;  // in launch order; at most two
  // Executable graphs by step shape (LaunchStep); nullptr: that shape runs eagerly. Bounded: a
  // server sees few shapes (row counts x mode mixes, x 3 slots x 2 buffers x timed or not), and
  // beyond kMaxGraphs steps run eagerly.
  static constexpr size_t kMaxGraphs = 768;
  // (rows | epilogue launches << 16 | slot << 24 | buffer << 26 | direct payload << 27 | x on the
  // device << 28 | upload aside << 29 | timed << 30, bytes copied back)
  using GraphKey = std::pair<uint64_t, uint64_t>;
  struct GraphKeyHash {
    size_t operator()(const GraphKey& k) const {
      return std::hash<uint64_t>()(k.first) ^ (std::hash<uint64_t>()(k.second) * 0x9e3779b97f4a7c15ull);
    }
  };
  std::unordered_map<GraphKey, cudaGraphExec_t, GraphKeyHash> graphs_;
  bool timing_warned_ = false;
  int reserved_rows_ = 0;   // the rows every work buffer holds (ReserveWork)
  unsigned record_flags_ = cudaEventRecordDefault;  // cudaEventRecordExternal while capturing
  StageTimes times_;
  uint64_t steps_launched_ = 0;  // which steps are timed (cuda_stage_events_every)
};

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeCudaBackend(const BackendOptions& options,
                                                                int local_rank) {
  auto b = std::make_unique<CudaBackend>(options, local_rank);
  DH_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<ComputeBackend>(std::move(b));
}

}  // namespace drafthead
