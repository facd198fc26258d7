// drafthead-bench-step: one rank's CUDA step as a caller at c = 1 pays it (Launch, then Finish:
// host in, host out, synchronised), for the backend's step variants side by side in one run, against
// the GEMV alone launched the same way (a one-kernel graph and a stream synchronisation). Prints
// markdown tables: host-observed p50 / p90 / p99 per step, the backend's stage p50s, and the
// step's cost beyond the GEMV (issue 22: compute <= GEMV + 20 us at c = 1); then steps pipelined two
// in flight as under load, their period against the GEMV's launched back to back (issue 22: c = 64).
// Usage: drafthead-bench-step [--iters=N] [--vocab=129280] [--hidden=5120]
// Synthetic weights (random e4m3 codes, one scale); tp = 1 (the whole vocabulary on one GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/head_gemv.cuh"
#include "kernels/numeric.h"
#include "server/backends/compute_backend.h"

namespace {

using namespace drafthead;
constexpr int kBackToBack = 200;
using Clock = std::chrono::steady_clock;

#define CK(expr)                                                                     \
  do {                                                                               \
    const cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Random e4m3 codes (never the NaN codes 0x7f / 0xff: & 0xf7), block exponents 2^-7.
ShardWeights SyntheticTwin(int64_t vocab, int64_t hidden) {
  ShardWeights w;
  w.geo = ShardGeometry::Make(1, 0, hidden, vocab, vocab);
  const int64_t S = w.geo.shard_rows, K = hidden;
  w.codes.resize(static_cast<size_t>(S) * K);
  w.exps.assign(static_cast<size_t>((S + 31) / 32) * (K / 32), 120);
  std::vector<std::thread> ts;
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  const size_t words = w.codes.size() / 8;
  for (int t = 0; t < nt; ++t)
    ts.emplace_back([&, t] {
      for (size_t i = t; i < words; i += nt) {
        const uint64_t v = Mix(i + 1) & 0xf7f7f7f7f7f7f7f7ull;
        std::memcpy(&w.codes[i * 8], &v, 8);
      }
    });
  for (auto& t : ts) t.join();
  return w;
}

struct Point {
  const char* label;
  int m;
  RowMode mode;
  uint32_t k;
  OutDType dtype;
};

struct Variant {
  const char* label;
  bool graphs, upload_kernel, timing_off_path;
  size_t direct_max;
  int carveout = -1;  // BackendOptions::cuda_smem_carveout
  bool stage_events = true, upload_aside = true, overlap_steps = false;
};

BatchControl Control(const Point& p) {
  BatchControl ctl{};
  ctl.rows = p.m;
  for (int i = 0; i < p.m; ++i) {
    RowTask t{};
    t.mode = p.mode;
    t.head = RowHead::kFp8Twin;
    t.dtype = p.dtype;
    t.want_probs = p.mode == RowMode::kTopK;
    t.k = p.mode == RowMode::kFullLogits ? 0 : p.k;
    t.temperature = 1.f;
    t.row_in_request = i;
    t.seed = 7;
    ctl.tasks[i] = t;
  }
  return ctl;
}

void FillRows(uint16_t* x, int m, int64_t k) {
  for (int64_t i = 0; i < m * k; ++i)
    x[i] = FloatToBf16(static_cast<float>(static_cast<int64_t>(Mix(i) % 2001) - 1000) / 1000.f);
}

// The variant's backend with the twin loaded; nullptr (after a message) on failure.
std::unique_ptr<ComputeBackend> MakeBackend(const Variant& v, const ShardWeights& twin) {
  BackendOptions o;
  o.device = 0;
  o.max_rows = 64;
  o.cuda_graphs = v.graphs;
  o.cuda_upload_by_kernel = v.upload_kernel;
  o.cuda_timing_off_path = v.timing_off_path;
  o.cuda_direct_payload_max = v.direct_max;
  o.cuda_smem_carveout = v.carveout;
  o.cuda_stage_events = v.stage_events;
  o.cuda_upload_aside = v.upload_aside;
  o.cuda_overlap_steps = v.overlap_steps;
  auto be = MakeCudaBackend(o, 0);
  if (!be.ok()) {
    std::fprintf(stderr, "backend: %s\n", std::string(be.status().message()).c_str());
    return nullptr;
  }
  ShardWeights w = twin;
  if (auto r = (*be)->Load(std::move(w)); !r.ok()) {
    std::fprintf(stderr, "load: %s\n", std::string(r.status().message()).c_str());
    return nullptr;
  }
  return std::move(*be);
}

// Every variant's backend, in order; empty when one fails (MakeBackend said why).
std::vector<std::unique_ptr<ComputeBackend>> MakeBackends(const std::vector<Variant>& vs,
                                                         const ShardWeights& twin) {
  std::vector<std::unique_ptr<ComputeBackend>> out;
  for (const Variant& v : vs) {
    out.push_back(MakeBackend(v, twin));
    if (out.back() == nullptr) return {};
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  int64_t vocab = 129280, hidden = 5120;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--iters=", 0) == 0) iters = std::atoi(a.c_str() + 8);
    else if (a.rfind("--vocab=", 0) == 0) vocab = std::atoll(a.c_str() + 8);
    else if (a.rfind("--hidden=", 0) == 0) hidden = std::atoll(a.c_str() + 9);
    else {
      std::fprintf(stderr, "usage: %s [--iters=N] [--vocab=V] [--hidden=K]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# drafthead-bench-step: %s, vocab %lld, hidden %lld, %d steps a cell (c = 1, synced)\n",
              prop.name, static_cast<long long>(vocab), static_cast<long long>(hidden), iters);
  const ShardWeights twin = SyntheticTwin(vocab, hidden);
  const std::vector<Point> points = {
      {"M=1 ARGMAX", 1, RowMode::kArgmax, 1, OutDType::kFp32},
      {"M=5 TOP_K k=8 probs", 5, RowMode::kTopK, 8, OutDType::kFp32},
      {"M=16 TOP_K k=8 probs", 16, RowMode::kTopK, 8, OutDType::kFp32},
      {"M=60 TOP_K k=8 probs", 60, RowMode::kTopK, 8, OutDType::kFp32},  // c = 64 M = 5's batches, whole requests
      {"M=64 TOP_K k=8 probs", 64, RowMode::kTopK, 8, OutDType::kFp32},
      {"M=5 FULL bf16", 5, RowMode::kFullLogits, 0, OutDType::kBf16},
  };

  // The GEMV alone, as an in-process caller at c = 1 runs it: a graph of the one kernel, launched,
  // then the stream synchronised (host-observed), and its device time from events around it.
  std::vector<double> gemv_alone(points.size());
  std::vector<double> gemv_b2b(points.size());  // device us a GEMV, its graph launched back to back
  {
    const int64_t S = twin.geo.shard_rows, K = hidden;
    uint8_t* packed = nullptr;
    uint8_t* codes = nullptr;
    uint8_t* exps = nullptr;
    uint16_t* x = nullptr;
    float* y = nullptr;
    CK(cudaMalloc(&codes, twin.codes.size()));
    CK(cudaMemcpy(codes, twin.codes.data(), twin.codes.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&packed, cuda::Fp8PackedCodesBytes(S, K)));
    CK(cuda::PackFp8Codes(codes, S, K, packed, nullptr));
    CK(cudaFree(codes));
    CK(cudaMalloc(&exps, twin.exps.size()));
    CK(cudaMemcpy(exps, twin.exps.data(), twin.exps.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&x, 64 * K * 2));
    std::vector<uint16_t> hx(64 * K);
    FillRows(hx.data(), 64, K);
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&y, 64 * S * 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::printf("\n| GEMV alone | host p50 us (graph launch + sync) | device p50 us (events) | device us a GEMV, %d back to back |\n"
                "| --- | --- | --- | --- |\n", kBackToBack);
    for (size_t pi = 0; pi < points.size(); ++pi) {
      const int m = points[pi].m;
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      CK(cuda::HeadGemvFp8(x, m, K, packed, exps, S, y, S, st));
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      std::vector<double> host, dev;
      for (int i = 0; i < iters + 50; ++i) {
        const auto t0 = Clock::now();
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 50) {
          host.push_back(us);
          dev.push_back(ms * 1e3);
        }
      }
      gemv_alone[pi] = Pct(host, 0.5);
      std::vector<double> b2b;  // the period of a GEMV with nothing between them but the graph launches
      for (int r = 0; r < 6; ++r) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < kBackToBack; ++i) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0) b2b.push_back(ms * 1e3 / kBackToBack);
      }
      gemv_b2b[pi] = Pct(b2b, 0.5);
      std::printf("| M=%d | %.1f | %.1f | %.1f |\n", m, gemv_alone[pi], Pct(dev, 0.5), gemv_b2b[pi]);
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
    }
    cudaFree(packed);
    cudaFree(exps);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(st);
  }

  const std::vector<Variant> variants = {
      {"copy engine, events in chain, D2H", true, false, false, 0},
      {"upload kernel, events in chain, D2H", true, true, false, 0},
      {"upload kernel, events off chain, D2H", true, true, true, 0},
      {"upload kernel, events off chain, direct (default)", true, true, true, 64 * 1024},
      {"default, no graphs", false, true, true, 64 * 1024},
      {"default, carveout max shared", true, true, true, 64 * 1024, 100},
  };
  // Every variant's backend loaded at once; each point alternates them in rounds (so drift in
  // the machine's speed falls on all alike).
  std::vector<std::unique_ptr<ComputeBackend>> backends = MakeBackends(variants, twin);
  if (backends.empty()) return 1;
  std::printf("\n| step variant | point | p50 us | p90 | p99 | p50 - GEMV alone | h2d | gemv | epilogue | d2h | graph |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  constexpr int kRound = 100;
  for (size_t pi = 0; pi < points.size(); ++pi) {
    const Point& p = points[pi];
    const BatchControl ctl = Control(p);
    struct Samples {
      std::vector<double> host, h2d, gemv, epi, d2h;
      bool graphed = true;
    };
    std::vector<Samples> acc(variants.size());
    for (size_t vi = 0; vi < variants.size(); ++vi) {  // rows in place, shapes captured
      uint16_t* in = backends[vi]->InputRows(p.m);
      if (in == nullptr) {
        std::fprintf(stderr, "InputRows failed\n");
        return 1;
      }
      FillRows(in, p.m, hidden);  // the rows stay there between steps
    }
    for (int done = -50; done < iters; done += kRound) {
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        ComputeBackend& be = *backends[vi];
        for (int i = 0; i < kRound; ++i) {
          const auto t0 = Clock::now();
          uint16_t* in = be.InputRows(p.m);  // where the server's batch loop writes the rows
          absl::Status s = in == nullptr ? absl::InternalError("InputRows failed")
                                         : be.Launch(ctl, in, MemorySpace::kHost);
          if (s.ok()) s = be.Finish(nullptr).status();
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          if (!s.ok()) {
            std::fprintf(stderr, "%s %s: %s\n", variants[vi].label, p.label,
                         std::string(s.message()).c_str());
            return 1;
          }
          if (done < 0) continue;  // warm-up round
          const StageTimes st = be.stage_times();
          Samples& a = acc[vi];
          a.host.push_back(us);
          a.h2d.push_back(st.h2d_us);
          a.gemv.push_back(st.gemv_us);
          a.epi.push_back(st.epilogue_us);
          a.d2h.push_back(st.d2h_us);
          a.graphed = a.graphed && st.graph;
        }
      }
    }
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const Samples& a = acc[vi];
      std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f | %s |\n",
                  variants[vi].label, p.label, Pct(a.host, 0.5), Pct(a.host, 0.9),
                  Pct(a.host, 0.99), Pct(a.host, 0.5) - gemv_alone[pi], Pct(a.h2d, 0.5),
                  Pct(a.gemv, 0.5), Pct(a.epi, 0.5), Pct(a.d2h, 0.5), a.graphed ? "yes" : "no");
    }
    std::fflush(stdout);
  }

  // Two steps in flight, as the server's batch loop keeps them under load (RankEngine::RunBatch):
  // each Finish launches the next step from its while_running. The period a step against the
  // GEMV and the epilogue alone says what lies between the steps on the GPU.
  const std::vector<Variant> piped = {
      {"default (upload aside, events off chain)", true, true, true, 64 * 1024},
      {"events in chain", true, true, false, 64 * 1024},
      {"no stage events", true, true, true, 64 * 1024, -1, false},
      {"upload in the step", true, true, true, 64 * 1024, -1, true, false},
      {"upload in the step, no stage events", true, true, true, 64 * 1024, -1, false, false},
      {"no graphs", false, true, true, 64 * 1024},
      {"no graphs, no stage events", false, true, true, 64 * 1024, -1, false},
      {"overlap steps", true, true, true, 64 * 1024, -1, true, true, true},
      {"overlap steps, no stage events", true, true, true, 64 * 1024, -1, false, true, true},
      {"overlap steps, no graphs, no stage events", false, true, true, 64 * 1024, -1, false, true, true},
  };
  backends.clear();  // the first table's, freed before the second's load
  backends = MakeBackends(piped, twin);
  if (backends.empty()) return 1;
  std::printf("\n| pipelined step variant | point | period p50 us | p90 | gemv + epilogue + d2h p50 | between steps | vs GEMV back to back | graph |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Point& p : points) {
    if (p.mode != RowMode::kTopK) continue;
    const BatchControl ctl = Control(p);
    const double floor = gemv_b2b[&p - points.data()];
    for (auto& be : backends) FillRows(be->InputRows(p.m), p.m, hidden);
    std::vector<std::vector<double>> period(piped.size()), busy(piped.size());
    std::vector<bool> graphed(piped.size(), true);
    for (int done = -kRound; done < iters; done += kRound) {
      for (size_t vi = 0; vi < piped.size(); ++vi) {
        ComputeBackend& be = *backends[vi];
        absl::Status launched;
        auto launch = [&] {
          uint16_t* in = be.InputRows(p.m);  // the rows stay there between steps
          launched = in == nullptr ? absl::InternalError("InputRows failed")
                                   : be.Launch(ctl, in, MemorySpace::kHost);
        };
        launch();
        const auto t0 = Clock::now();
        for (int i = 0; i < kRound && launched.ok(); ++i) {
          const absl::Status s = be.Finish(i + 1 < kRound ? std::function<void()>(launch) : nullptr).status();
          if (!s.ok()) launched = s;
          const StageTimes st = be.stage_times();
          if (done >= 0) busy[vi].push_back(st.gemv_us + st.epilogue_us + st.d2h_us);
          if (done >= 0 && !st.graph) graphed[vi] = false;
        }
        if (!launched.ok()) {
          std::fprintf(stderr, "%s %s: %s\n", piped[vi].label, p.label,
                       std::string(launched.message()).c_str());
          return 1;
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (done >= 0) period[vi].push_back(us / kRound);
      }
    }
    for (size_t vi = 0; vi < piped.size(); ++vi) {
      const double per = Pct(period[vi], 0.5), b = Pct(busy[vi], 0.5);
      char busy_s[32] = "-", gap_s[32] = "-";  // untimed variants have no stage times
      if (piped[vi].stage_events) {
        std::snprintf(busy_s, sizeof busy_s, "%.0f", b);
        std::snprintf(gap_s, sizeof gap_s, "%.1f", per - b);
      }
      std::printf("| %s | %s | %.1f | %.1f | %s | %s | %.3f | %s |\n", piped[vi].label, p.label, per,
                  Pct(period[vi], 0.9), busy_s, gap_s, per / floor, graphed[vi] ? "yes" : "no");
    }
    std::fflush(stdout);
  }
  return 0;
}
