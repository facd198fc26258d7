// ComputeBackend on the CPU: the twin (and optionally the bf16 head) in host memory, the AVX2
// GEMV of kernels/cpu, per-row reductions spread over the thread pool.
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/head_gemv.h"
#include "kernels/cpu/shard_reduce.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "server/backends/compute_backend.h"

namespace drafthead {
namespace {

uint32_t MicrosBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::microseconds>(b - a).count());
}

class CpuBackend : public ComputeBackend {
 public:
  explicit CpuBackend(const BackendOptions& o) : opts_(o), pool_(o.threads) {}

  std::string name() const override { return "cpu"; }
  bool has_device_memory() const override { return false; }
  bool has_bf16() const override { return !w_.bf16.empty(); }

  absl::StatusOr<LoadReport> Load(ShardWeights w) override {
    const ShardGeometry& g = w.geo;
    if (g.hidden <= 0 || g.hidden % 32 != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend: hidden size ", g.hidden, " is not a positive multiple of 32"));
    const size_t elems = static_cast<size_t>(g.shard_rows) * g.hidden;
    const size_t exp_elems = static_cast<size_t>(cpu::TwinExpRows(g.shard_rows)) * (g.hidden / 32);
    LoadReport rep;
    if (w.codes.empty()) {
      if (w.bf16.size() != elems)
        return absl::InvalidArgumentError("cpu backend: neither a twin nor a full bf16 shard given");
      const auto t0 = std::chrono::steady_clock::now();
      w.codes.resize(elems);
      w.exps.resize(exp_elems);
      cpu::MakeTwin(w.bf16.data(), g.shard_rows, g.hidden, w.codes.data(), w.exps.data(), pool_);
      rep.twin_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else if (w.codes.size() != elems || w.exps.size() != exp_elems) {
      return absl::InvalidArgumentError("cpu backend: twin shape does not match the shard");
    }
    if (!opts_.keep_bf16) {
      w.bf16.clear();
      w.bf16.shrink_to_fit();
    } else if (w.bf16.size() != elems) {
      return absl::InvalidArgumentError("cpu backend: --keep-bf16 needs the bf16 shard");
    }
    w_ = std::move(w);
    rep.device_bytes = w_.codes.size() + w_.exps.size() + w_.bf16.size() * 2;
    return rep;
  }

  // No device to overlap with: Launch computes the batch, Finish hands it over.
  absl::Status Launch(const BatchControl& ctl, const uint16_t* x, MemorySpace space) override {
    if (space != MemorySpace::kHost)
      return absl::InvalidArgumentError("cpu backend: payloads live in host memory");
    if (ctl.device_outs != 0)
      return absl::InvalidArgumentError("cpu backend: no device memory to write rows to");
    if (launched_.size() >= 2)
      return absl::FailedPreconditionError("cpu backend: a third batch launched before one finished");
    const ShardGeometry& g = w_.geo;
    const int rows = static_cast<int>(ctl.rows);
    const int64_t S = g.shard_rows, K = g.hidden;
    const PayloadLayout layout = MakePayloadLayout(ctl.tasks, rows, S);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<uint8_t>& payload = payloads_.Next();
    payload.resize(layout.bytes());
    logits_.resize(static_cast<size_t>(rows) * S);

    // One GEMV per head over that head's rows (gathered so each weight is read once). The common
    // single-head batch runs straight on x and into logits_, with no gather or scatter.
    for (RowHead head : {RowHead::kFp8Twin, RowHead::kBf16Exact}) {
      std::vector<int> idx;
      for (int i = 0; i < rows; ++i)
        if (ctl.tasks[i].head == head) idx.push_back(i);
      if (idx.empty()) continue;
      if (head == RowHead::kBf16Exact && w_.bf16.empty())
        return absl::FailedPreconditionError("cpu backend: the bf16 head was not kept");
      const bool whole = static_cast<int>(idx.size()) == rows;
      const uint16_t* xs = x;
      float* ys = logits_.data();
      if (!whole) {
        xg_.resize(idx.size() * K);
        for (size_t j = 0; j < idx.size(); ++j)
          std::memcpy(&xg_[j * K], x + static_cast<size_t>(idx[j]) * K, K * 2);
        yg_.resize(idx.size() * S);
        xs = xg_.data();
        ys = yg_.data();
      }
      if (head == RowHead::kFp8Twin) {
        cpu::HeadGemvFp8With(opts_.cpu_isa, xs, static_cast<int>(idx.size()), K, w_.codes.data(),
                             w_.exps.data(), S, ys, S, pool_);
      } else {
        cpu::HeadGemvBf16With(opts_.cpu_isa, xs, static_cast<int>(idx.size()), K, w_.bf16.data(), S,
                              ys, S, pool_);
      }
      if (!whole) {
        for (size_t j = 0; j < idx.size(); ++j)
          std::memcpy(&logits_[static_cast<size_t>(idx[j]) * S], &yg_[j * S], S * 4);
      }
    }

    const auto t1 = std::chrono::steady_clock::now();
    const int64_t valid = g.valid_cols();
    const int32_t base = static_cast<int32_t>(g.row_begin());
    pool_.ParallelFor(rows, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const RowTask& t = ctl.tasks[i];
        const float* y = &logits_[static_cast<size_t>(i) * S];
        uint8_t* out = payload.data() + layout.row_offset[i];
        if (t.mode == RowMode::kFullLogits) {
          if (t.dtype == OutDType::kFp32) {
            std::memcpy(out, y, S * 4);
          } else {
            cpu::LogitsToBf16(y, S, reinterpret_cast<uint16_t*>(out));
          }
          continue;
        }
        auto* part = reinterpret_cast<SoftmaxPartial*>(out);
        auto* cand = reinterpret_cast<Candidate*>(out + sizeof(SoftmaxPartial));
        *part = SoftmaxPartial{0.f, 0.f};
        switch (t.mode) {
          case RowMode::kTopK:
            // The softmax partial (an exp per column) only for rows that return probs.
            cpu::ShardTopK(y, valid, base, t.k, t.temperature, cand, t.want_probs ? part : nullptr);
            break;
          case RowMode::kArgmax:
            cpu::ShardArgmax(y, valid, base, cand);
            break;
          case RowMode::kSample:
            cpu::ShardSample(y, valid, base, t.temperature, t.seed, t.row_in_request, cand);
            break;
          default:
            break;
        }
      }
    });
    Launched done;
    done.payload = payload.data();
    done.times.gemv_us = MicrosBetween(t0, t1);
    done.times.epilogue_us = MicrosBetween(t1, std::chrono::steady_clock::now());
    launched_.push_back(done);
    return absl::OkStatus();
  }

  absl::StatusOr<const void*> Finish(const std::function<void()>& while_running) override {
    if (launched_.empty()) return absl::FailedPreconditionError("cpu backend: Finish without a Launch");
    const Launched done = launched_.front();
    launched_.pop_front();
    times_ = done.times;
    // The caller's work runs after the batch, as the contract allows.
    if (while_running) while_running();
    return static_cast<const void*>(done.payload);
  }

  StageTimes stage_times() const override { return times_; }

  absl::StatusOr<void*> ScratchBuffer(size_t bytes, MemorySpace space) override {
    if (space != MemorySpace::kHost)
      return absl::InvalidArgumentError("cpu backend: no device memory");
    std::vector<uint8_t>& scratch = scratches_.Next();
    scratch.resize(bytes);
    return static_cast<void*>(scratch.data());
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, MemorySpace space) override {
    if (space != MemorySpace::kHost)
      return absl::InvalidArgumentError("cpu backend: no device memory");
    if (dst != src) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

 private:
  BackendOptions opts_;
  cpu::ThreadPool pool_;
  ShardWeights w_;
  BufferRing<std::vector<uint8_t>, kHostPayloads> payloads_;  // host results in turn
  BufferRing<std::vector<uint8_t>, 2> scratches_;
  struct Launched {
    const uint8_t* payload = nullptr;
    StageTimes times;
  };
  std::deque<Launched> launched_;  // computed, not yet finished (at most two)
  std::vector<float> logits_, yg_;
  std::vector<uint16_t> xg_;
  StageTimes times_;
};

}  // namespace

std::unique_ptr<ComputeBackend> MakeCpuBackend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace drafthead
