// drafthead-bench-cuda: times the CUDA head kernels on one GPU and prints markdown tables.
//   fp8 GEMV (default dispatch and register-depth variants) for N = 32320 and 129280, K = 5120,
//   M in {1,2,4,5,8,16,32,64}, against a streaming-read kernel measured in the same run and
//   cuBLAS bf16 on the same shapes; the twin build; the epilogue (bf16 full logits, top-k).
// Each launch reads a different copy of the weights than the one before (several copies, > 4x the
// L2), so no launch finds its weights in L2. Times are per launch, launched back to back.
// Usage: drafthead-bench-cuda [--iters=N] [--quick] [--ms=1,64] [--ns=32320] [--no-epilogue]
//                             [--variants=770,800] (the variant columns; default: all)
//                             [--epi=x64] (only the epilogue rows whose label contains it: ncu)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/experimental/epilogue_variants.cuh"
#include "kernels/cuda/experimental/head_gemv_variants.cuh"
#include "kernels/cuda/head_bf16.cuh"
#include "kernels/cuda/head_gemv.cuh"
#include "kernels/cuda/shard_reduce.cuh"
#include "kernels/cuda/twin.cuh"
#include "kernels/numeric.h"

namespace {

#define CK(expr)                                                                     \
  do {                                                                               \
    const cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), \
                   __FILE__, __LINE__);                                              \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void FillBf16(uint16_t* w, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint64_t h = drafthead::Mix64(seed ^ (i * 0x9e3779b97f4a7c15ull));
    // sum of 4 uniform bytes-ish -> roughly Gaussian
    const float u = static_cast<float>(h & 0xffff) + static_cast<float>((h >> 16) & 0xffff) +
                    static_cast<float>((h >> 32) & 0xffff) + static_cast<float>(h >> 48);
    w[i] = drafthead::FloatToBf16((u * (1.f / 65536.f) - 2.f) * 1.732f * scale);
  }
}

// Streaming read: 16-byte loads, 4 in flight per thread, a grid-stride loop; sums so the loads
// cannot be dropped.
__global__ void StreamRead(const uint4* __restrict__ p, size_t n16, unsigned* out) {
  unsigned acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
          d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x12345678u) *out = acc;
}

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Milliseconds per launch of fn(i): launches go back to back in groups of kGroup between two
// events (so the GPU never waits on the host's launch overhead, which per-launch events would
// count), and the median over `iters` groups is divided by kGroup. fn(i) rotates the inputs.
constexpr int kGroup = 10;
double TimeIt(int iters, const std::function<void(int)>& fn) {
  for (int i = 0; i < 3; ++i) fn(i);
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  int call = 0;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    for (int j = 0; j < kGroup; ++j) fn(call++);
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  return Median(ms) / kGroup;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 15;
  bool quick = false, epilogue = true;
  std::vector<int> ms = {1, 2, 4, 5, 8, 16, 32, 64};
  std::vector<int64_t> ns = {32320, 129280};
  std::vector<int64_t> variants;  // the variant columns to time (--variants=770,800; default: all)
  std::string epi_filter;          // the epilogue rows to time (--epi=x64: labels containing it)
  auto parse_list = [](const char* s) {
    std::vector<int64_t> v;
    for (char* e; *s; s = *e ? e + 1 : e) v.push_back(std::strtoll(s, &e, 10));
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--iters=", 8)) iters = std::atoi(argv[i] + 8);
    if (!std::strcmp(argv[i], "--quick")) quick = true;  // default dispatch and cuBLAS only
    if (!std::strcmp(argv[i], "--no-epilogue")) epilogue = false;
    if (!std::strncmp(argv[i], "--ms=", 5)) {
      ms.clear();
      for (int64_t v : parse_list(argv[i] + 5)) ms.push_back(static_cast<int>(v));
    }
    if (!std::strncmp(argv[i], "--ns=", 5)) ns = parse_list(argv[i] + 5);
    if (!std::strncmp(argv[i], "--variants=", 11)) variants = parse_list(argv[i] + 11);
    if (!std::strncmp(argv[i], "--epi=", 6)) epi_filter = argv[i] + 6;
  }
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("# device: %s, %d SMs, L2 %d MB, %.0f GB memory\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.totalGlobalMem / 1e9);
  const int64_t K = 5120;

  // Same-run streaming-read ceiling over 4 GB.
  const size_t sbytes = size_t{4} << 30;
  uint4* sbuf;
  unsigned* sink;
  CK(cudaMalloc(&sbuf, sbytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(sbuf, 0x3c, sbytes));
  const double stream_ms = TimeIt(20, [&](int) {
    StreamRead<<<prop.multiProcessorCount * 8, 512>>>(sbuf, sbytes / 16, sink);
  });
  const double stream_gbs = sbytes / stream_ms / 1e6;
  std::printf("# streaming read: %.1f GB/s (%.3f ms for %.1f GB)\n", stream_gbs, stream_ms,
              sbytes / 1e9);
  CK(cudaFree(sbuf));

  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  uint16_t* x;
  CK(cudaMalloc(&x, 64 * K * 2));
  FillBf16<<<64, 256>>>(x, 64 * K, 77, 1.f);
  float* y;
  CK(cudaMalloc(&y, size_t{64} * 129280 * 4));

  // Columns: the row-major kernel of rounds 1-3 (production until issue 23) and it with PDL;
  // on codes in fragment order (head_gemv_variants.cuh lists the variants): 16 warps a CTA at
  // depth 4 (no K split), the mma.sync dispatch (770; production up to 16 rows, and above until
  // wgmma), it with PDL, with balanced contiguous unit ranges on every SM (780, M <= 16), at
  // depth 4 above M = 16.
  struct Col {
    const char* name;
    int variant;
    int max_m;
  };
  // Issue 23's wgmma kernels (M > 16, then every M): 800 (depth 2), 801 (+PDL), 804 (depth 4),
  // 805 (depth 4, each step waits for its wgmmas), 810 / 814 / 815 (every M on wgmma), 820-822
  // (production with an L2 prefetch 8 / 16 / 32 steps ahead), 830-837 (round 7: 16 or 12 warps of
  // one tile).
  std::vector<Col> cols;
  for (const Col& c : std::vector<Col>{
           {"row-major d4", 4, 64}, {"row-major d4+pdl", 604, 64}, {"pk 16w d4", 700, 64},
           {"mma.sync", 770, 64},   {"mma.sync+pdl", 771, 64},          {"fp8 balanced", 780, 16},
           {"fp8 dl4", 774, 64},    {"wgmma", 800, 64},            {"wgmma+pdl", 801, 64},
           {"wgmma d4", 804, 64},   {"wgmma d4 wait0", 805, 64},   {"wgmma all", 810, 64},
           {"wgmma all d4", 814, 64}, {"wgmma all d4 wait0", 815, 64}, {"wgmma pf8", 820, 64},
           {"wgmma pf16", 821, 64},   {"wgmma pf32", 822, 64}, {"16w x1", 830, 64},
           {"16w x1 d4", 831, 64},   {"16w x1 d4 wait0", 832, 64}, {"16w all d4", 833, 64},
           {"16w all", 834, 64},     {"16w x1 wait0", 835, 64},  {"12w x1 d4", 836, 64},
           {"12w x1", 837, 64}})
    if (variants.empty() || std::find(variants.begin(), variants.end(), c.variant) != variants.end())
      cols.push_back(c);
  // A variant without a column would be silently left out.
  for (int64_t v : variants)
    if (std::none_of(cols.begin(), cols.end(), [v](const Col& c) { return c.variant == v; }))
      std::fprintf(stderr, "drafthead-bench-cuda: --variants: %lld has no column (ignored)\n",
                   static_cast<long long>(v));
  for (int64_t N : ns) {
    const size_t wbytes = size_t(N) * K;
    const size_t ebytes = (N + 31) / 32 * (K / 32);
    const double fp8_mb = (wbytes + ebytes) / 1e6;
    const int copies = std::max<int>(2, static_cast<int>((600e6 + wbytes - 1) / wbytes));
    std::vector<uint16_t*> wb(copies);
    std::vector<uint8_t*> codes(copies), exps(copies), packed(copies);
    const size_t pbytes = drafthead::cuda::Fp8PackedCodesBytes(N, K);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&wb[c], wbytes * 2));
      CK(cudaMalloc(&codes[c], wbytes));
      CK(cudaMalloc(&exps[c], ebytes));
      CK(cudaMalloc(&packed[c], pbytes));
      FillBf16<<<1024, 256>>>(wb[c], wbytes, 1000 + c, 0.02f);
      CK(drafthead::cuda::MakeTwin(wb[c], N, K, codes[c], exps[c], nullptr));
      CK(drafthead::cuda::PackFp8Codes(codes[c], N, K, packed[c], nullptr));
    }
    CK(cudaDeviceSynchronize());
    const double twin_ms = TimeIt(5, [&](int i) {
      CK(drafthead::cuda::MakeTwin(wb[i % copies], N, K, codes[i % copies], exps[i % copies],
                                   nullptr));
    });
    std::printf("\n## N=%lld K=%lld: fp8 twin %.1f MB, %d weight copies; floor %.1f us at %.0f GB/s\n",
                static_cast<long long>(N), static_cast<long long>(K), fp8_mb, copies,
                fp8_mb / stream_gbs * 1e3, stream_gbs);
    const double pack_ms = TimeIt(5, [&](int i) {
      CK(drafthead::cuda::PackFp8Codes(codes[i % copies], N, K, packed[i % copies], nullptr));
    });
    std::printf("twin build: %.3f ms (reads %.0f MB, writes %.0f MB); fragment-order packing %.3f ms\n\n",
                twin_ms, wbytes * 2 / 1e6, fp8_mb, pack_ms);
    std::printf("| M | fp8 us | GB/s | %% of stream |");
    for (const Col& c : cols) std::printf(" %s us |", c.name);
    std::printf(" best variant %% of stream | cuBLAS bf16 us | bf16/fp8 |\n|");
    for (size_t i = 0; i < cols.size() + 7; ++i) std::printf(" --- |");
    std::printf("\n");
    for (int m : ms) {
      auto fp8 = [&](int variant) {
        return TimeIt(iters, [&, variant](int i) {
          const int c = i % copies;
          cudaError_t e = variant == 0 ? drafthead::cuda::HeadGemvFp8(x, m, K, packed[c], exps[c], N,
                                                                      y, N, nullptr)
                                       : drafthead::cuda::HeadGemvFp8Variant(
                                             x, m, K, drafthead::cuda::HeadGemvFp8VariantTakesPackedCodes(variant) ? packed[c] : codes[c],
                                             exps[c], N, y, N, variant, nullptr);
          CK(e);
        });
      };
      const double t = fp8(0) * 1e3;
      std::vector<double> tv(cols.size(), 0);
      double best_variant = 0;
      for (size_t ci = 0; ci < cols.size() && !quick; ++ci) {
        if (m > cols[ci].max_m) continue;
        tv[ci] = fp8(cols[ci].variant) * 1e3;
        if (best_variant == 0 || tv[ci] < best_variant) best_variant = tv[ci];
      }
      const double tb = TimeIt(iters, [&](int i) {
        if (drafthead::cuda::HeadGemmBf16(h, x, m, K, wb[i % copies], N, y, N, nullptr) !=
            CUBLAS_STATUS_SUCCESS)
          std::exit(1);
      }) * 1e3;
      const double gbs = fp8_mb * 1e6 / (t * 1e-6) / 1e9;
      std::printf("| %d | %.1f | %.0f | %.1f |", m, t, gbs, 100.0 * gbs / stream_gbs);
      for (double v : tv) v > 0 ? std::printf(" %.1f |", v) : std::printf(" - |");
      if (best_variant > 0)
        std::printf(" %.1f |", 100.0 * fp8_mb * 1e6 / (best_variant * 1e-6) / 1e9 / stream_gbs);
      else
        std::printf(" - |");
      std::printf(" %.1f | %.2f |\n", tb, tb / t);
    }
    // Epilogue: the payload kernels for M rows (bf16 full logits; top-k 8; argmax).
    // Columns: round-1 kernels (variant 1, as before); the default dispatch given the host rows
    // (as the backend calls it; TOP_K k <= 16 on the group family); the same without them (every
    // kernel launched); the split path with 512- to 4096-column chunks; the split path with the
    // default chunk for every row (variant 6: the default before the group family).
    if (epilogue)
      std::printf("\n| epilogue (M rows) | old us | new us | new, no host rows us | c512 us | c1024 us | c2048 us | c4096 us | old/new | old GPU us | new GPU us | split us | split GPU us |\n"
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    uint8_t* pay;
    CK(cudaMalloc(&pay, size_t{64} * N * 4 + 4096));
    drafthead::cuda::ReduceRow* drows;
    CK(cudaMalloc(&drows, 64 * sizeof(drafthead::cuda::ReduceRow)));
    struct Case {
      const char* label;
      drafthead::cuda::ReduceMode mode;
      uint32_t k;
      int rows;
    };
    for (const Case& cs : std::vector<Case>{
             {"full bf16 x5", drafthead::cuda::ReduceMode::kFullLogits, 0, 5},
             {"top-8 x1", drafthead::cuda::ReduceMode::kTopK, 8, 1},
             {"top-8 x5", drafthead::cuda::ReduceMode::kTopK, 8, 5},
             {"top-8 x16", drafthead::cuda::ReduceMode::kTopK, 8, 16},
             {"top-8 x64", drafthead::cuda::ReduceMode::kTopK, 8, 64},
             {"top-64 x5", drafthead::cuda::ReduceMode::kTopK, 64, 5},
             {"top-64 x64", drafthead::cuda::ReduceMode::kTopK, 64, 64},
             {"top-1024 x5", drafthead::cuda::ReduceMode::kTopK, 1024, 5},
             {"argmax x5", drafthead::cuda::ReduceMode::kArgmax, 1, 5},
             {"argmax x64", drafthead::cuda::ReduceMode::kArgmax, 1, 64},
             {"sample x5", drafthead::cuda::ReduceMode::kSample, 1, 5},
             {"sample x64", drafthead::cuda::ReduceMode::kSample, 1, 64}}) {
      if (!epilogue) break;
      if (std::string(cs.label).find(epi_filter) == std::string::npos) continue;
      const auto mode = cs.mode;
      const uint32_t k = cs.k;
      const int rows = cs.rows;
      const char* label = cs.label;
      std::vector<drafthead::cuda::ReduceRow> rr(rows);
      size_t off = 0;
      for (int r = 0; r < rows; ++r) {
        rr[r] = {};
        rr[r].y_row = r;
        rr[r].mode = static_cast<uint8_t>(mode);
        rr[r].out_bf16 = 1;
        rr[r].k = k;
        rr[r].temperature = 1.f;
        rr[r].seed = 5;
        rr[r].out_offset = off;
        off += mode == drafthead::cuda::ReduceMode::kFullLogits ? ((N * 2 + 15) & ~15) : ((8 + 12 * k + 15) & ~15);
      }
      CK(cudaMemcpy(drows, rr.data(), rows * sizeof(rr[0]), cudaMemcpyHostToDevice));
      const size_t escr_bytes = drafthead::cuda::EpilogueScratchBytes(N, rows);
      void* escr = nullptr;
      CK(cudaMalloc(&escr, std::max<size_t>(escr_bytes, 16)));
      CK(drafthead::cuda::HeadGemvFp8(x, 64, K, packed[0], exps[0], N, y, N, nullptr));
      // Variant 0 is the production entry point; the others the experimental dispatches.
      auto run_epi = [&](int variant, bool host_rows) {
        const drafthead::cuda::ReduceRow* hr = host_rows ? rr.data() : nullptr;
        return variant == 0
                   ? drafthead::cuda::ShardEpilogue(y, N, N, N, 0, drows, rows, pay, escr,
                                                    escr_bytes, nullptr, hr)
                   : drafthead::cuda::ShardEpilogueVariant(y, N, N, N, 0, drows, rows, pay, escr,
                                                           escr_bytes, nullptr, hr, variant);
      };
      auto time_epi = [&](int variant, bool host_rows) {
        return TimeIt(iters, [&](int) { CK(run_epi(variant, host_rows)); }) * 1e3;
      };
      const double t_old = time_epi(1, false), t_new = time_epi(0, true);
      const double t_nh = time_epi(0, false), t_512 = time_epi(2, true), t_1k = time_epi(4, true);
      const double t_2k = time_epi(3, true), t_4k = time_epi(5, true);
      // GPU time as in the server: the epilogue queued behind a GEMV (so the host is ahead and
      // its launch overhead is hidden), timed from an event after the GEMV to one after it.
      auto gpu_epi = [&](int variant, bool host_rows) {
        cudaEvent_t b, c;
        CK(cudaEventCreate(&b));
        CK(cudaEventCreate(&c));
        std::vector<float> v;
        for (int i = 0; i < iters + 2; ++i) {
          CK(drafthead::cuda::HeadGemvFp8(x, 64, K, packed[0], exps[0], N, y, N, nullptr));
          CK(cudaEventRecord(b));
          CK(run_epi(variant, host_rows));
          CK(cudaEventRecord(c));
          CK(cudaEventSynchronize(c));
          float t = 0;
          CK(cudaEventElapsedTime(&t, b, c));
          if (i >= 2) v.push_back(t);
        }
        cudaEventDestroy(b);
        cudaEventDestroy(c);
        return Median(v) * 1e3;
      };
      const double t_spl = time_epi(6, true);
      const double g_old = gpu_epi(1, false), g_new = gpu_epi(0, true), g_spl = gpu_epi(6, true);
      std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f |\n",
                  label, t_old, t_new, t_nh, t_512, t_1k, t_2k, t_4k, t_old / t_new, g_old, g_new, t_spl,
                  g_spl);
      CK(cudaFree(escr));
    }
    CK(cudaFree(pay));
    CK(cudaFree(drows));
    for (int c = 0; c < copies; ++c) {
      cudaFree(wb[c]);
      cudaFree(codes[c]);
      cudaFree(packed[c]);
      cudaFree(exps[c]);
    }
  }
  cublasDestroy(h);
  return 0;
}
