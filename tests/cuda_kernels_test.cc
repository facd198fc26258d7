// The CUDA kernels against the CPU kernels and float64 references, on the real shard shape
// (32320 x 5120), the full 129280-row vocabulary and odd shapes. Every test skips (GTEST_SKIP)
// where no GPU is present.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <utility>

#include "kernels/candidate.h"
#include "kernels/cpu/shard_reduce.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/cuda/experimental/epilogue_variants.cuh"
#include "kernels/cuda/experimental/head_gemv_variants.cuh"
#include "kernels/cuda/head_bf16.cuh"
#include "kernels/cuda/head_gemv.cuh"
#include "kernels/cuda/shard_reduce.cuh"
#include "kernels/cuda/twin.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/numeric.h"

namespace drafthead::cudatest {

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define DH_SKIP_WITHOUT_GPU()                                                        \
  do {                                                                               \
    if (!::drafthead::cudatest::HaveGpu())                                           \
      GTEST_SKIP() << "no CUDA GPU on this machine (cudaGetDeviceCount failed or 0)"; \
  } while (0)

#define DH_CU(expr)                                                         \
  do {                                                                      \
    const cudaError_t dh_e_ = (expr);                                       \
    ASSERT_EQ(dh_e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(dh_e_); \
  } while (0)

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { Resize(n); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Resize(size_t n) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = n;
    if (n && cudaMalloc(&p_, std::max<size_t>(n * sizeof(T), 16)) != cudaSuccess) p_ = nullptr;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  cudaError_t Upload(const std::vector<T>& v) {
    return cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download(size_t n) const {
    std::vector<T> v(n);
    if (cudaMemcpy(v.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) v.clear();
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline int Threads() { return std::max(1u, std::thread::hardware_concurrency()); }

template <typename F>
void ParallelRows(int64_t n, F&& fn) {
  const int nt = Threads();
  std::vector<std::thread> ts;
  for (int i = 0; i < nt; ++i)
    ts.emplace_back([&, i] {
      for (int64_t r = i; r < n; r += nt) fn(r);
    });
  for (auto& t : ts) t.join();
}

// Approximately Gaussian (sum of 4 uniforms) from a counter hash: fast and reproducible.
inline float Gauss(uint64_t seed, uint64_t i) {
  const uint64_t h1 = Mix64(seed * 0x9e3779b97f4a7c15ull + i), h2 = Mix64(h1 ^ 0x1234567ull);
  const float u = static_cast<float>(h1 & 0xffffff) + static_cast<float>(h1 >> 40) +
                  static_cast<float>(h2 & 0xffffff) + static_cast<float>(h2 >> 40);
  return (u * 5.9604644775390625e-8f - 2.0f) * 1.7320508f;
}

// Weights like an LM head: N(0, 0.02) scaled per row over ~1.5 decades, some outlier columns.
inline std::vector<uint16_t> MakeWeights(int64_t n, int64_t k, uint64_t seed) {
  std::vector<uint16_t> w(static_cast<size_t>(n) * k);
  ParallelRows(n, [&](int64_t r) {
    const float scale = 0.02f * std::pow(10.f, 0.75f * Gauss(seed + 1, r) / 1.7f);
    for (int64_t c = 0; c < k; ++c) {
      float v = Gauss(seed, static_cast<uint64_t>(r) * k + c) * scale;
      if (c % 997 == 3) v *= 8.f;
      w[r * k + c] = FloatToBf16(v);
    }
  });
  return w;
}

inline std::vector<uint16_t> MakeHidden(int m, int64_t k, uint64_t seed) {
  std::vector<uint16_t> x(static_cast<size_t>(m) * k);
  for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(Gauss(seed, i));
  return x;
}

// float64 reference: ref[m * n + j] = sum_k x[m,k] w[j,k], abs[m * n + j] = sum_k |x w|, where
// w is the exactly dequantized twin (codes/exps) or, with codes == nullptr, the bf16 weights.
struct Reference {
  std::vector<double> y, abs;
};
inline Reference ComputeReference(const std::vector<uint16_t>& x, int m, int64_t k,
                                  const uint8_t* codes, const uint8_t* exps, const uint16_t* bf16,
                                  int64_t n) {
  Reference ref;
  ref.y.resize(static_cast<size_t>(m) * n);
  ref.abs.resize(static_cast<size_t>(m) * n);
  std::vector<double> xd(static_cast<size_t>(m) * k);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = Bf16ToFloat(x[i]);
  ParallelRows(n, [&](int64_t j) {
    std::vector<double> wd(k);
    for (int64_t c = 0; c < k; ++c) {
      if (codes) {
        const int e = static_cast<int>(exps[(j / 32) * (k / 32) + c / 32]) - 127;
        wd[c] = std::ldexp(static_cast<double>(E4m3ToFloat(codes[j * k + c])), e);
      } else {
        wd[c] = Bf16ToFloat(bf16[j * k + c]);
      }
    }
    for (int r = 0; r < m; ++r) {
      const double* xr = &xd[static_cast<size_t>(r) * k];
      double s0 = 0, s1 = 0, a0 = 0, a1 = 0;
      for (int64_t c = 0; c < k; c += 2) {
        const double p0 = xr[c] * wd[c], p1 = xr[c + 1] * wd[c + 1];
        s0 += p0;
        s1 += p1;
        a0 += std::fabs(p0);
        a1 += std::fabs(p1);
      }
      ref.y[static_cast<size_t>(r) * n + j] = s0 + s1;
      ref.abs[static_cast<size_t>(r) * n + j] = a0 + a1;
    }
  });
  return ref;
}

// fp32 accumulation of k products: |y - ref| <= c * 2^-23 * sqrt(k) * sum|x w| (a random-walk
// bound on rounding errors with a safety factor c; products themselves are exact in fp32).
inline double AccumulationBound(int64_t k, double abs_sum, double c = 4.0) {
  return c * std::ldexp(1.0, -23) * std::sqrt(static_cast<double>(k)) * abs_sum + 1e-30;
}

}  // namespace drafthead::cudatest

using namespace drafthead;
using namespace drafthead::cudatest;

namespace {

std::vector<float> Poisoned(size_t n) { return std::vector<float>(n, std::nanf("")); }

// The twin, built on the GPU and on the CPU, must agree byte for byte.
void ExpectTwinMatches(const std::vector<uint16_t>& w, int64_t n, int64_t k) {
  const int64_t eb = (n + 31) / 32 * (k / 32);
  std::vector<uint8_t> codes(static_cast<size_t>(n) * k), exps(eb);
  cpu::ThreadPool pool(0);
  cpu::MakeTwin(w.data(), n, k, codes.data(), exps.data(), pool);
  DeviceBuffer<uint16_t> dw(w.size());
  DeviceBuffer<uint8_t> dc(codes.size()), de(exps.size());
  DH_CU(dw.Upload(w));
  DH_CU(cudaMemset(dc.get(), 0xa5, codes.size()));
  DH_CU(cudaMemset(de.get(), 0xa5, exps.size()));
  DH_CU(cuda::MakeTwin(dw.get(), n, k, dc.get(), de.get(), nullptr));
  DH_CU(cudaDeviceSynchronize());
  const auto gc = dc.Download(codes.size());
  const auto ge = de.Download(exps.size());
  size_t bad_c = 0, bad_e = 0, first = SIZE_MAX;
  for (size_t i = 0; i < codes.size(); ++i)
    if (gc[i] != codes[i]) {
      ++bad_c;
      first = std::min(first, i);
    }
  for (size_t i = 0; i < exps.size(); ++i) bad_e += ge[i] != exps[i];
  EXPECT_EQ(bad_c, 0u) << "n=" << n << " k=" << k << " first mismatch at " << first;
  EXPECT_EQ(bad_e, 0u) << "n=" << n << " k=" << k;
}

}  // namespace

TEST(CudaTwin, MatchesCpuOnTheRealShard) {
  DH_SKIP_WITHOUT_GPU();
  const auto w = MakeWeights(32320, 5120, 11);
  ExpectTwinMatches(w, 32320, 5120);
}

TEST(CudaTwin, MatchesCpuOnOddShapes) {
  DH_SKIP_WITHOUT_GPU();
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {33, 96}, {1000, 160},
                                                               {77, 5120}, {31, 288}}) {
    ExpectTwinMatches(MakeWeights(n, k, 100 + n), n, k);
  }
}

TEST(CudaTwin, MatchesCpuOnSpecialValues) {
  DH_SKIP_WITHOUT_GPU();
  const int64_t n = 96, k = 256;
  auto w = MakeWeights(n, k, 5);
  for (int64_t c = 0; c < k; ++c) {
    for (int r = 0; r < 32; ++r) {
      const int64_t i = r * k + c;
      switch (c / 32) {
        case 0: w[i] = 0; break;                                   // all-zero block
        case 1: w[i] = (r & 1) ? 0x8000 : 0; break;                // signed zeros
        case 2: w[i] = static_cast<uint16_t>(1 + r + c); break;    // bf16 subnormals
        case 3: w[i] = FloatToBf16((r + 1) * 1e30f); break;        // huge
        case 4: w[i] = FloatToBf16(((r * 37 + c) % 64 - 32) * 7e-3f); break;  // rounding ties
        case 5: w[i] = FloatToBf16(448.f * ((r + c) % 3 ? 1 : -1)); break;
        case 6: w[i] = static_cast<uint16_t>(0x0080 + r); break;  // smallest normals
        default: break;
      }
    }
  }
  ExpectTwinMatches(w, n, k);
}

// ---- GEMV -------------------------------------------------------------------------------------
struct Shard {
  int64_t n, k;
  std::vector<uint16_t> w;
  DeviceBuffer<uint16_t> dw;
  DeviceBuffer<uint8_t> codes, exps;
  DeviceBuffer<uint8_t> packed;  // codes in the fast GEMV's fragment order
  std::vector<uint8_t> hcodes, hexps;
};

// Packs s.codes into s.packed, every byte poisoned first (the packing must write them all).
void Pack(Shard& s) {
  s.packed.Resize(cuda::Fp8PackedCodesBytes(s.n, s.k));
  EXPECT_EQ(cudaMemset(s.packed.get(), 0xee, s.packed.size()), cudaSuccess);
  EXPECT_EQ(cuda::PackFp8Codes(s.codes.get(), s.n, s.k, s.packed.get(), nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::unique_ptr<Shard> MakeShard(int64_t n, int64_t k, uint64_t seed, float mul = 1.f) {
  auto s = std::make_unique<Shard>();
  s->n = n;
  s->k = k;
  s->w = MakeWeights(n, k, seed);
  if (mul != 1.f)
    for (auto& v : s->w) v = FloatToBf16(Bf16ToFloat(v) * mul);
  s->dw.Resize(s->w.size());
  s->codes.Resize(static_cast<size_t>(n) * k);
  s->exps.Resize((n + 31) / 32 * (k / 32));
  EXPECT_EQ(s->dw.Upload(s->w), cudaSuccess);
  EXPECT_EQ(cuda::MakeTwin(s->dw.get(), n, k, s->codes.get(), s->exps.get(), nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  s->hcodes = s->codes.Download(s->codes.size());
  s->hexps = s->exps.Download(s->exps.size());
  Pack(*s);
  return s;
}

// Runs the GEMV for the first m rows of x over the first n rows of the shard and checks every
// output against the float64 reference (computed for all rows of x over ref_n >= n columns).
// mode: 0 the production GEMV (packed codes), -1 the exact fallback, else a HeadGemvFp8Variant
// (packed codes for 7xx, row-major for the others).
void CheckGemv(const Shard& s, const DeviceBuffer<uint16_t>& dx, const Reference& ref,
               int64_t ref_n, int m, int64_t n, int mode, double* worst_rel) {
  const uint8_t* codes = mode == 0 || cuda::HeadGemvFp8VariantTakesPackedCodes(mode) ? s.packed.get() : s.codes.get();
  DeviceBuffer<float> dy(static_cast<size_t>(m) * n);
  DH_CU(cudaMemcpy(dy.get(), Poisoned(dy.size()).data(), dy.size() * 4, cudaMemcpyHostToDevice));
  if (mode == 0) {
    DH_CU(cuda::HeadGemvFp8(dx.get(), m, s.k, codes, s.exps.get(), n, dy.get(), n, nullptr));
  } else {
    DH_CU(cuda::HeadGemvFp8Variant(dx.get(), m, s.k, codes, s.exps.get(), n, dy.get(), n,
                                   mode, nullptr));
  }
  DH_CU(cudaDeviceSynchronize());
  const auto y = dy.Download(dy.size());
  int64_t nan = 0, over = 0;
  double worst = 0, err2 = 0, ref2 = 0;
  for (int r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const double v = y[static_cast<size_t>(r) * n + j];
      const double rv = ref.y[static_cast<size_t>(r) * ref_n + j];
      const double ab = ref.abs[static_cast<size_t>(r) * ref_n + j];
      if (std::isnan(v)) {
        ++nan;
        continue;
      }
      const double e = std::fabs(v - rv);
      if (e > AccumulationBound(s.k, ab)) ++over;
      worst = std::max(worst, e / (ab + 1e-300));
      err2 += e * e;
      ref2 += rv * rv;
    }
  }
  EXPECT_EQ(nan, 0) << "m=" << m << " n=" << n << " mode=" << mode << ": unwritten outputs";
  EXPECT_EQ(over, 0) << "m=" << m << " n=" << n << " mode=" << mode
                     << ": outputs past the accumulation bound; worst |err|/sum|xw| = " << worst;
  if (worst_rel) *worst_rel = std::max(*worst_rel, worst);
  if (m == 1 || m == 64)
    std::printf("gemv m=%d n=%lld k=%lld mode=%d: worst |err|/sum|xw| %.3g, rel L2 %.3g\n", m,
                static_cast<long long>(n), static_cast<long long>(s.k), mode, worst,
                std::sqrt(err2 / (ref2 + 1e-300)));
}

class CudaGemv : public ::testing::Test {
 protected:
  // Built once per process and kept (never torn down): --gtest_repeat=N then repeats the GPU
  // work, not the ~40 GFLOP float64 reference.
  static void SetUpTestSuite() {
    if (!HaveGpu() || shard_) return;
    // The full vocabulary on one GPU; its first 32320 rows are one tp=4 shard (block aligned).
    shard_ = MakeShard(129280, 5120, 21).release();
    x_ = MakeHidden(64, 5120, 99);
    dx_ = new DeviceBuffer<uint16_t>(x_.size());
    EXPECT_EQ(dx_->Upload(x_), cudaSuccess);
    ref_ = new Reference(ComputeReference(x_, 64, 5120, shard_->hcodes.data(),
                                          shard_->hexps.data(), nullptr, 129280));
  }
  static Shard* shard_;
  static std::vector<uint16_t> x_;
  static DeviceBuffer<uint16_t>* dx_;
  static Reference* ref_;
};
Shard* CudaGemv::shard_ = nullptr;
std::vector<uint16_t> CudaGemv::x_;
DeviceBuffer<uint16_t>* CudaGemv::dx_ = nullptr;
Reference* CudaGemv::ref_ = nullptr;

TEST_F(CudaGemv, EveryMOnTheRealShard) {
  DH_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::Fp8TwinFitsFastPath(shard_->hexps.data(), shard_->hexps.size()));
  double worst = 0;
  for (int m = 1; m <= 64; ++m) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 0, &worst);
  std::printf("worst |err|/sum|xw| over M=1..64: %.3g (2^-23 = %.3g)\n", worst,
              std::ldexp(1.0, -23));
}

TEST_F(CudaGemv, FullVocabulary) {
  DH_SKIP_WITHOUT_GPU();
  for (int m : {1, 5, 8, 9, 16, 17, 33, 64}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 129280, 0, nullptr);
}

TEST_F(CudaGemv, BenchmarkVariantsAndFallbackAreCorrect) {
  DH_SKIP_WITHOUT_GPU();
  for (int m : {1, 8, 16}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 8, nullptr);
  for (int m : {1, 24, 64}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 2, nullptr);
  for (int m : {1, 64}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 4, nullptr);
  for (int m : {1, 9, 17, 40, 64}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 604, nullptr);
  for (int m : {1, 5, 40, 64}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 100, nullptr);
  for (int m : {1, 13, 64}) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 4000, -1, nullptr);
  // Round 2 variants (M <= 16): no L2 hint; K split in 2 across warps of one CTA (32 or 16 warps);
  // bulk L2 prefetch;
  // n = 1000 / 4000 leaves warps of the last CTA without rows (they still reach the barriers).
  for (int v : {200, 302, 304, 314, 408, 416, 432})
    for (int m : {1, 5, 8, 9, 16})
      for (int64_t n : {int64_t{32320}, int64_t{129280}, int64_t{1000}})
        CheckGemv(*shard_, *dx_, *ref_, 129280, m, n, v, nullptr);
}

// Issue 12's TMA ring (M <= 16): every M on the real shard, the full vocabulary, CTAs with fewer
// units than consumer warps (n = 17, 1000), K not a multiple of the 128-column stage (zero-filled
// by the copy engine), every variant (depths, exponent distances, 8 / 16 consumers, PDL, evict-first).
TEST_F(CudaGemv, TmaRingVariantsAreCorrect) {
  DH_SKIP_WITHOUT_GPU();
  double worst = 0;
  for (int v : {508, 504, 564})
    for (int m = 1; m <= 16; ++m) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, v, &worst);
  for (int v : {508, 518, 528, 538, 548, 588, 574})
    for (int m : {1, 5, 9, 16})
      for (int64_t n : {int64_t{129280}, int64_t{1000}, int64_t{17}})
        CheckGemv(*shard_, *dx_, *ref_, 129280, m, n, v, &worst);
  std::printf("ring: worst |err|/sum|xw| %.3g\n", worst);
}

// ---- issue 23: codes in fragment order -------------------------------------------------------
// The layout head_gemv.cuh documents, computed on the host from the row-major codes.
std::vector<uint8_t> PackOnHost(const std::vector<uint8_t>& codes, int64_t n, int64_t k) {
  std::vector<uint8_t> p(cuda::Fp8PackedCodesBytes(n, k), 0xee);
  const int64_t steps = cuda::PackedSteps(k);
  for (int64_t tile = 0; tile < cuda::PackedTiles(n); ++tile)
    for (int64_t s = 0; s < steps; ++s)
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l)
          for (int b = 0; b < 16; ++b) {
            const int64_t row = tile * 16 + 8 * h + l / 4, col = s * 64 + 16 * (l % 4) + b;
            p[((tile * steps + s) * 2 + h) * 512 + 16 * l + b] =
                row < n && col < k ? codes[row * k + col] : 0;
          }
  return p;
}

TEST(CudaGemvShapes, FragmentOrderPackingMatchesTheLayout) {
  DH_SKIP_WITHOUT_GPU();
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 32}, {33, 96}, {517, 5120}, {70, 2080}, {64, 512}}) {
    auto s = MakeShard(n, k, 500 + n);  // packs on the device
    EXPECT_EQ(s->packed.Download(s->packed.size()), PackOnHost(s->hcodes, n, k)) << n << "x" << k;
  }
  DeviceBuffer<uint8_t> a(1 << 16), b(1 << 16);
  EXPECT_EQ(cuda::PackFp8Codes(a.get(), 1, 48, b.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::PackFp8Codes(a.get(), 0, 64, b.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::PackFp8Codes(a.get() + 1, 1, 64, b.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::PackFp8Codes(nullptr, 1, 64, b.get(), nullptr), cudaErrorInvalidValue);
}

// Rows 0, 3 and 63 of x alone and inside batches of every bucket: bit-identical outputs.
// variant 0: the production GEMV; else a packed HeadGemvFp8Variant.
void ExpectRowsBatchInvariant(const DeviceBuffer<uint16_t>& dx, int64_t k, const Shard& s, int64_t n,
                              int variant) {
  DeviceBuffer<float> alone(n), batch(64 * n);
  auto gemv = [&](const uint16_t* x, int m, float* y) {
    return variant == 0 ? cuda::HeadGemvFp8(x, m, k, s.packed.get(), s.exps.get(), n, y, n, nullptr)
                        : cuda::HeadGemvFp8Variant(x, m, k, s.packed.get(), s.exps.get(), n, y, n,
                                                   variant, nullptr);
  };
  for (int r : {0, 3, 63}) {
    DH_CU(gemv(dx.get() + r * k, 1, alone.get()));
    DH_CU(cudaDeviceSynchronize());
    const auto a = alone.Download(n);
    for (int m : {r + 1, 8, 9, 16, 17, 40, 64}) {
      if (m <= r) continue;
      DH_CU(gemv(dx.get(), m, batch.get()));
      DH_CU(cudaDeviceSynchronize());
      const auto b = batch.Download(static_cast<size_t>(m) * n);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data() + static_cast<size_t>(r) * n, n * 4))
          << "variant " << variant << " k=" << k << ": row " << r << " alone vs in a batch of " << m;
    }
  }
}

// Every packed variant on the real shard, the full vocabulary, CTAs with fewer units than warps
// (n = 1000, 17); every M on the shard for the packed default; a row alone and inside batches of
// every bucket gives bit-identical outputs.
TEST_F(CudaGemv, FragmentOrderVariantsAreCorrect) {
  DH_SKIP_WITHOUT_GPU();
  double worst = 0;
  for (int m = 1; m <= 64; ++m)
    CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 700, &worst);
  for (int v : {700, 702, 740, 741, 750, 760, 770, 771, 773, 774, 780})
    for (int m : {1, 5, 9, 16, 17, 33, 64}) {
      if (m > 16 && (v == 760 || v == 780)) continue;
      for (int64_t n : {int64_t{129280}, int64_t{1000}, int64_t{17}})
        CheckGemv(*shard_, *dx_, *ref_, 129280, m, n, v, &worst);
    }
  std::printf("fragment order: worst |err|/sum|xw| %.3g\n", worst);

  for (int v : {0, 700, 770, 771, 773, 774}) ExpectRowsBatchInvariant(*dx_, 5120, *shard_, 32320, v);
}

TEST(CudaGemvShapes, FragmentOrderOddShapes) {
  DH_SKIP_WITHOUT_GPU();
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 32}, {33, 96}, {1000, 160}, {517, 5120}, {70, 2080}, {4096, 12288}}) {
    auto s = MakeShard(n, k, 600 + n);
    const auto x = MakeHidden(64, k, 17 + n);
    DeviceBuffer<uint16_t> dx(x.size());
    DH_CU(dx.Upload(x));
    const auto ref = ComputeReference(x, 64, k, s->hcodes.data(), s->hexps.data(), nullptr, n);
    for (int v : {0, 700, 741, 760, 780, 800, 810, 830, 833, 836})  // 8xx: wgmma (x in chunks at k = 12288)
      for (int m : {1, 8, 9, 16, 17, 40, 64}) {
        if (m > 16 && (v == 760 || v == 780)) continue;
        if ((v == 760 || v == 780) && k == 12288) continue;  // K split: x whole in shared memory
        CheckGemv(*s, dx, ref, n, m, n, v, nullptr);
      }
    // At k = 12288 buckets 1-2 take the 16-warp kernel (x does not fit beside the K split's sums).
    ExpectRowsBatchInvariant(dx, k, *s, n, 0);
    ExpectRowsBatchInvariant(dx, k, *s, n, 810);
  }
}

// Issue 23's wgmma kernels (head_gemv_wgmma.cuh; production above 16 rows as 801): every M above 16 on the real
// shard (800: mma.sync up to 16 rows, wgmma above), every M on it for the all-wgmma dispatch (810),
// each variant on the full vocabulary and on CTAs with fewer units than warps (n = 1000, 17).
TEST_F(CudaGemv, WgmmaVariantsAreCorrect) {
  DH_SKIP_WITHOUT_GPU();
  double worst = 0;
  for (int m = 17; m <= 64; ++m) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 800, &worst);
  for (int m = 1; m <= 64; ++m) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 810, &worst);
  for (int m = 1; m <= 64; ++m) CheckGemv(*shard_, *dx_, *ref_, 129280, m, 32320, 833, &worst);
  for (int v : {800, 801, 804, 805, 810, 814, 815, 820, 821, 822, 830, 831, 832, 833, 834, 835, 836, 837})
    for (int m : {1, 8, 9, 16, 17, 32, 33, 64})
      for (int64_t n : {int64_t{129280}, int64_t{1000}, int64_t{17}})
        CheckGemv(*shard_, *dx_, *ref_, 129280, m, n, v, &worst);
  std::printf("wgmma: worst |err|/sum|xw| %.3g\n", worst);
}

// A row alone and inside batches of every bucket, bit for bit: within the wgmma kernels (810),
// and across mma.sync (M <= 16) and wgmma (M > 16) in one dispatch (800, and production's).
TEST_F(CudaGemv, WgmmaRowsAreBatchInvariant) {
  DH_SKIP_WITHOUT_GPU();
  ExpectRowsBatchInvariant(*dx_, 5120, *shard_, 32320, 810);
  ExpectRowsBatchInvariant(*dx_, 5120, *shard_, 32320, 800);
  ExpectRowsBatchInvariant(*dx_, 5120, *shard_, 32320, 830);  // 16 warps x 1 tile: the same sums
  ExpectRowsBatchInvariant(*dx_, 5120, *shard_, 32320, 833);
  ExpectRowsBatchInvariant(*dx_, 5120, *shard_, 32320, 0);  // production: depth 4 at N = 32, 2 at 64
}

// Round 7's kernels (16 or 12 warps a CTA, one tile a warp) add each output's terms in the same
// order as production's: their outputs equal production's bit for bit at every bucket.
TEST_F(CudaGemv, OneTileWarpsMatchProductionBitForBit) {
  DH_SKIP_WITHOUT_GPU();
  const int64_t n = 32320, k = 5120;
  DeviceBuffer<float> want(64 * n), got(64 * n);
  for (int m : {1, 5, 8, 16, 17, 31, 32, 33, 64}) {
    DH_CU(cuda::HeadGemvFp8(dx_->get(), m, k, shard_->packed.get(), shard_->exps.get(), n, want.get(), n,
                            nullptr));
    DH_CU(cudaDeviceSynchronize());
    const auto a = want.Download(static_cast<size_t>(m) * n);
    for (int v : {830, 831, 832, 833, 834, 835, 836, 837}) {
      DH_CU(cuda::HeadGemvFp8Variant(dx_->get(), m, k, shard_->packed.get(), shard_->exps.get(), n,
                                     got.get(), n, v, nullptr));
      DH_CU(cudaDeviceSynchronize());
      const auto b = got.Download(static_cast<size_t>(m) * n);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "variant " << v << " m=" << m;
    }
  }
}

TEST(CudaGemvShapes, TmaRingOddShapes) {
  DH_SKIP_WITHOUT_GPU();
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 32}, {33, 96}, {1000, 160}, {517, 5120}, {70, 2080}, {300, 12288}}) {
    auto s = MakeShard(n, k, 400 + n);
    const auto x = MakeHidden(16, k, 9 + n);
    DeviceBuffer<uint16_t> dx(x.size());
    DH_CU(dx.Upload(x));
    const auto ref = ComputeReference(x, 16, k, s->hcodes.data(), s->hexps.data(), nullptr, n);
    for (int m : {1, 8, 9, 16}) {
      if (k == 12288 && m > 8) {  // x of 16 rows (393 KB) does not fit in shared memory
        DeviceBuffer<float> dy(static_cast<size_t>(m) * n);
        EXPECT_EQ(cuda::HeadGemvFp8Variant(dx.get(), m, k, s->codes.get(), s->exps.get(), n,
                                           dy.get(), n, 508, nullptr),
                  cudaErrorNotSupported);
        continue;
      }
      CheckGemv(*s, dx, ref, n, m, n, 508, nullptr);
    }
  }
}

TEST(CudaGemvShapes, OddShapesAndMoreThan64Rows) {
  DH_SKIP_WITHOUT_GPU();
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 32}, {33, 96}, {1000, 160}, {517, 5120}, {70, 2080}, {4096, 12288}}) {
    auto s = MakeShard(n, k, 300 + n);
    const int mmax = 130;
    const auto x = MakeHidden(mmax, k, 7 + n);
    DeviceBuffer<uint16_t> dx(x.size());
    DH_CU(dx.Upload(x));
    const auto ref = ComputeReference(x, mmax, k, s->hcodes.data(), s->hexps.data(), nullptr, n);
    for (int m : {1, 2, 7, 8, 9, 31, 40, 64, 65, 130}) CheckGemv(*s, dx, ref, n, m, n, 0, nullptr);
    CheckGemv(*s, dx, ref, n, 5, n, -1, nullptr);
  }
}

// Blocks of one large value per row and many tiny ones: most codes are e4m3 subnormals, which
// the fast path's dequantization must keep exactly (a flush to zero would move the outputs ~1e-3
// relative, far past the bound). Both conversion routes are checked.
TEST(CudaGemvShapes, SubnormalCodesAreExact) {
  DH_SKIP_WITHOUT_GPU();
  const int64_t n = 2048, k = 1024;
  Shard s;
  s.n = n;
  s.k = k;
  s.w.resize(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      s.w[r * k + c] = FloatToBf16(c % 32 == r % 32 ? 1.0f : 3e-5f * Gauss(8, r * k + c));
  s.dw.Resize(s.w.size());
  s.codes.Resize(n * k);
  s.exps.Resize(n / 32 * (k / 32));
  DH_CU(s.dw.Upload(s.w));
  DH_CU(cuda::MakeTwin(s.dw.get(), n, k, s.codes.get(), s.exps.get(), nullptr));
  DH_CU(cudaDeviceSynchronize());
  s.hcodes = s.codes.Download(s.codes.size());
  s.hexps = s.exps.Download(s.exps.size());
  Pack(s);
  int64_t subnormal = 0;
  for (uint8_t c : s.hcodes) subnormal += (c & 0x78) == 0 && (c & 7) != 0;
  ASSERT_GT(subnormal, n * k / 4) << "the test data should be mostly subnormal codes";
  const auto x = MakeHidden(64, k, 12);
  DeviceBuffer<uint16_t> dx(x.size());
  DH_CU(dx.Upload(x));
  const auto ref = ComputeReference(x, 64, k, s.hcodes.data(), s.hexps.data(), nullptr, n);
  for (int m : {1, 16, 64}) {
    CheckGemv(s, dx, ref, n, m, n, 0, nullptr);    // production (byte-permute route)
    CheckGemv(s, dx, ref, n, m, n, 100, nullptr);  // f16-convert route
  }
  for (int m : {1, 16}) CheckGemv(s, dx, ref, n, m, n, 508, nullptr);  // TMA ring, smem dequant
  for (int m : {1, 17, 64}) CheckGemv(s, dx, ref, n, m, n, 810, nullptr);  // wgmma
  for (int m : {1, 16, 64}) CheckGemv(s, dx, ref, n, m, n, 4, nullptr);  // the row-major kernel
}

TEST(CudaGemvShapes, HugeBlocksUseTheExactFallback) {
  DH_SKIP_WITHOUT_GPU();
  auto s = MakeShard(300, 256, 77, 1e9f);  // block exponents far above 15
  EXPECT_FALSE(cuda::Fp8TwinFitsFastPath(s->hexps.data(), s->hexps.size()));
  const auto x = MakeHidden(9, 256, 3);
  DeviceBuffer<uint16_t> dx(x.size());
  DH_CU(dx.Upload(x));
  const auto ref = ComputeReference(x, 9, 256, s->hcodes.data(), s->hexps.data(), nullptr, 300);
  DeviceBuffer<float> dy(9 * 300);
  DH_CU(cuda::HeadGemvFp8Exact(dx.get(), 9, 256, s->codes.get(), s->exps.get(), 300, dy.get(), 300,
                               nullptr));
  DH_CU(cudaDeviceSynchronize());
  const auto y = dy.Download(dy.size());
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_LE(std::fabs(y[i] - ref.y[i]), AccumulationBound(256, ref.abs[i])) << i;
}

TEST(CudaGemvShapes, RefusesBadShapes) {
  DH_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint16_t> x(64 * 64);
  DeviceBuffer<uint8_t> c(64 * 64), e(64);
  DeviceBuffer<float> y(64 * 64);
  for (auto* gemv : {&cuda::HeadGemvFp8, &cuda::HeadGemvFp8Exact}) {
    EXPECT_EQ(gemv(x.get(), 1, 48, c.get(), e.get(), 32, y.get(), 32, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(gemv(x.get(), 0, 64, c.get(), e.get(), 32, y.get(), 32, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(gemv(x.get(), 1, 64, c.get(), e.get(), 32, y.get(), 16, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(gemv(x.get() + 1, 1, 64, c.get(), e.get(), 32, y.get(), 32, nullptr), cudaErrorInvalidValue);
  }
  EXPECT_EQ(cuda::MakeTwin(x.get(), 32, 40, c.get(), e.get(), nullptr), cudaErrorInvalidValue);
}

// ---- reductions -------------------------------------------------------------------------------
namespace {

struct EpilogueCase {
  std::vector<cuda::ReduceRow> rows;
  size_t bytes = 0;
};

void AddRow(EpilogueCase& c, int y_row, cuda::ReduceMode mode, uint32_t k, float t, uint64_t seed,
            uint32_t rir, bool bf16, int64_t n_shard) {
  cuda::ReduceRow r{};
  r.y_row = y_row;
  r.mode = static_cast<uint8_t>(mode);
  r.out_bf16 = bf16;
  r.k = k;
  r.temperature = t;
  r.row_in_request = rir;
  r.seed = seed;
  r.out_offset = c.bytes;
  size_t b = mode == cuda::ReduceMode::kFullLogits ? n_shard * (bf16 ? 2 : 4)
                                                   : sizeof(SoftmaxPartial) + k * sizeof(Candidate);
  c.bytes += (b + 15) & ~size_t{15};
  c.rows.push_back(r);
}

// Runs the GPU epilogue over host logits y [rows, ldy] and compares with the CPU reductions.
void CheckEpilogueOnce(const std::vector<float>& y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                       int32_t id_base, const EpilogueCase& c, bool host_rows, int variant) {
  ASSERT_EQ(cuda::ValidateReduceRows(c.rows.data(), static_cast<int>(c.rows.size())), cudaSuccess);
  DeviceBuffer<float> dy(y.size());
  DH_CU(dy.Upload(y));
  DeviceBuffer<cuda::ReduceRow> drows(c.rows.size());
  DH_CU(drows.Upload(c.rows));
  DeviceBuffer<uint8_t> pay(c.bytes);
  const int nrows = static_cast<int>(c.rows.size());
  const size_t sb = cuda::EpilogueScratchBytes(n_valid, nrows);
  // A guard band of 0xab bytes past the scratch the epilogue asked for: none may be written
  // (cudaMalloc's rounding would hide a small overrun).
  constexpr size_t kGuard = 4096;
  DeviceBuffer<uint8_t> scratch(sb + kGuard);
  DH_CU(cudaMemset(scratch.get() + sb, 0xab, kGuard));
  const cuda::ReduceRow* hrows = host_rows ? c.rows.data() : nullptr;
  // Twice on one scratch, the first answer overwritten (0xcd bytes left anywhere a second call
  // fails to write).
  for (int call = 0; call < 2; ++call) {
    DH_CU(cudaMemset(pay.get(), 0xcd, c.bytes));
    if (variant == 0) {  // the production entry point
      DH_CU(cuda::ShardEpilogue(dy.get(), ldy, n_shard, n_valid, id_base, drows.get(), nrows,
                                pay.get(), scratch.get(), sb, nullptr, hrows));
    } else {
      DH_CU(cuda::ShardEpilogueVariant(dy.get(), ldy, n_shard, n_valid, id_base, drows.get(),
                                       nrows, pay.get(), scratch.get(), sb, nullptr, hrows,
                                       variant));
    }
  }
  DH_CU(cudaDeviceSynchronize());
  const auto guard = scratch.Download(sb + kGuard);
  ASSERT_EQ(guard.size(), sb + kGuard);
  for (size_t i = sb; i < sb + kGuard; ++i)
    ASSERT_EQ(guard[i], 0xab) << "the epilogue wrote byte " << i - sb << " past its " << sb << " bytes of scratch";
  const auto p = pay.Download(c.bytes);
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const auto& r = c.rows[i];
    const float* yr = &y[static_cast<size_t>(r.y_row) * ldy];
    const uint8_t* out = p.data() + r.out_offset;
    const auto mode = static_cast<cuda::ReduceMode>(r.mode);
    if (mode == cuda::ReduceMode::kFullLogits) {
      for (int64_t j = 0; j < n_shard; ++j) {
        if (r.out_bf16) {
          uint16_t v;
          std::memcpy(&v, out + 2 * j, 2);
          ASSERT_EQ(v, FloatToBf16(yr[j])) << "row " << i << " col " << j;
        } else {
          uint32_t v;
          std::memcpy(&v, out + 4 * j, 4);
          ASSERT_EQ(v, FloatBits(yr[j])) << "row " << i << " col " << j;
        }
      }
      continue;
    }
    std::vector<Candidate> want(r.k);
    SoftmaxPartial wp{0.f, 0.f};
    switch (mode) {
      case cuda::ReduceMode::kTopK:
        cpu::ShardTopK(yr, n_valid, id_base, r.k, r.temperature, want.data(), &wp);
        break;
      case cuda::ReduceMode::kArgmax:
        cpu::ShardArgmax(yr, n_valid, id_base, want.data());
        break;
      default:
        cpu::ShardSample(yr, n_valid, id_base, r.temperature, r.seed, r.row_in_request, want.data());
        break;
    }
    SoftmaxPartial gp;
    std::memcpy(&gp, out, sizeof(gp));
    EXPECT_EQ(FloatBits(gp.max_scaled), FloatBits(wp.max_scaled)) << "row " << i;
    if (std::isnan(wp.sum_exp)) {
      EXPECT_TRUE(std::isnan(gp.sum_exp)) << "row " << i;
    } else {
      EXPECT_NEAR(gp.sum_exp, wp.sum_exp, 1e-6 * std::fabs(wp.sum_exp)) << "row " << i;
    }
    for (uint32_t q = 0; q < r.k; ++q) {
      Candidate g;
      std::memcpy(&g, out + sizeof(SoftmaxPartial) + q * sizeof(Candidate), sizeof(g));
      ASSERT_EQ(g.id, want[q].id) << "row " << i << " mode " << int(r.mode) << " rank " << q;
      ASSERT_EQ(FloatBits(g.key), FloatBits(want[q].key)) << "row " << i << " rank " << q;
      ASSERT_EQ(FloatBits(g.logit), FloatBits(want[q].logit)) << "row " << i << " rank " << q;
    }
  }
}

// Every epilogue dispatch: the default (TOP_K k <= 16 on the group family; with and without the
// host copy of the rows), the round-1 kernels, and the split path for every row with 512- to
// 4096-column chunks or the default chunk (variant 6).
void CheckEpilogue(const std::vector<float>& y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                   int32_t id_base, const EpilogueCase& c) {
  const struct {
    int variant;
    bool host_rows;
  } configs[] = {{0, true}, {0, false}, {1, false}, {2, true}, {3, true}, {4, true}, {5, true},
                 {6, true}, {6, false}};
  for (const auto& cfg : configs) {
    SCOPED_TRACE(testing::Message() << "epilogue variant " << cfg.variant << " host rows "
                                    << cfg.host_rows << " n_valid " << n_valid);
    CheckEpilogueOnce(y, ldy, n_shard, n_valid, id_base, c, cfg.host_rows, cfg.variant);
    if (testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace

TEST_F(CudaGemv, ReductionsMatchTheCpuOnGpuLogits) {
  DH_SKIP_WITHOUT_GPU();
  const int64_t n = 32320, ldy = 32320;
  DeviceBuffer<float> dy(64 * n);
  DH_CU(cuda::HeadGemvFp8(dx_->get(), 64, 5120, shard_->packed.get(), shard_->exps.get(), n,
                          dy.get(), ldy, nullptr));
  DH_CU(cudaDeviceSynchronize());
  const auto y = dy.Download(dy.size());
  EpilogueCase c;
  const uint32_t ks[] = {1, 2, 8, 50, 64, 65, 256, 1000, 1024};
  int row = 0;
  for (uint32_t k : ks) {
    AddRow(c, row, cuda::ReduceMode::kTopK, k, row % 2 ? 1.f : 0.7f, 0, 0, false, n);
    ++row;
  }
  for (int i = 0; i < 8; ++i) AddRow(c, row++, cuda::ReduceMode::kArgmax, 1, 1.f, 0, 0, false, n);
  for (int i = 0; i < 16; ++i)
    AddRow(c, row++, cuda::ReduceMode::kSample, 1, i % 3 ? 1.f : 0.35f, 1234 + i / 4, i % 4, false, n);
  AddRow(c, row++, cuda::ReduceMode::kFullLogits, 0, 1.f, 0, 0, true, n);
  AddRow(c, row++, cuda::ReduceMode::kFullLogits, 0, 1.f, 0, 0, false, n);
  AddRow(c, 3, cuda::ReduceMode::kTopK, 8, 1.f, 0, 0, false, n);  // rows may share logits
  // Rank 2 of 4 with a vocabulary cropped inside its shard.
  CheckEpilogue(y, ldy, n, 32000, 2 * 32320, c);
  CheckEpilogue(y, ldy, n, n, 0, c);
  // The full vocabulary on one rank: rows longer than the shared-memory stage (segmented).
  const int64_t nf = 129280;
  DeviceBuffer<float> dyf(24 * nf);
  DH_CU(cuda::HeadGemvFp8(dx_->get(), 24, 5120, shard_->packed.get(), shard_->exps.get(), nf,
                          dyf.get(), nf, nullptr));
  DH_CU(cudaDeviceSynchronize());
  const auto yf = dyf.Download(dyf.size());
  EpilogueCase cf;
  row = 0;
  for (uint32_t k : ks) {
    AddRow(cf, row, cuda::ReduceMode::kTopK, k, row % 2 ? 1.f : 0.6f, 0, 0, false, nf);
    ++row;
  }
  for (int i = 0; i < 4; ++i) AddRow(cf, row++, cuda::ReduceMode::kArgmax, 1, 1.f, 0, 0, false, nf);
  for (int i = 0; i < 4; ++i) AddRow(cf, row++, cuda::ReduceMode::kSample, 1, 0.9f, 5, i, false, nf);
  AddRow(cf, row++, cuda::ReduceMode::kFullLogits, 0, 1.f, 0, 0, true, nf);
  CheckEpilogue(yf, nf, nf, nf, 0, cf);
  CheckEpilogue(yf, nf, nf, 129000, 0, cf);
  CheckEpilogue(yf, nf, nf, 40961, 0, cf);  // just past one stage: two segments
}

TEST(CudaReduce, TiesNansZerosAndShortShards) {
  DH_SKIP_WITHOUT_GPU();
  const int64_t n = 5000, ldy = 5000;
  std::vector<float> y(8 * ldy);
  for (int64_t j = 0; j < n; ++j) {
    y[0 * ldy + j] = static_cast<float>((j * 7919) % 13);  // heavy ties
    y[1 * ldy + j] = 1.f;                                   // all equal
    y[2 * ldy + j] = (j % 3 == 0) ? std::nanf("") : (j % 3 == 1 ? -0.f : 0.f);
    y[3 * ldy + j] = (j % 5 == 0) ? -INFINITY : static_cast<float>(j % 17) - 8.f;
    y[4 * ldy + j] = Gauss(9, j) * 3.f;
    y[5 * ldy + j] = (j == 4321) ? INFINITY : Gauss(10, j);
    y[6 * ldy + j] = std::nanf("");
    y[7 * ldy + j] = -static_cast<float>(j);
  }
  EpilogueCase c;
  for (int r = 0; r < 8; ++r) {
    for (uint32_t k : {1u, 5u, 64u, 1024u})
      AddRow(c, r, cuda::ReduceMode::kTopK, k, r == 4 ? 0.5f : 1.f, 0, 0, false, n);
    AddRow(c, r, cuda::ReduceMode::kArgmax, 1, 1.f, 0, 0, false, n);
    AddRow(c, r, cuda::ReduceMode::kSample, 1, 0.8f, 42, r, false, n);
  }
  CheckEpilogue(y, ldy, n, n, 1000, c);
  CheckEpilogue(y, ldy, n, 3, 1000, c);    // fewer valid columns than k
  CheckEpilogue(y, ldy, n, 0, 1000, c);    // a rank wholly past the crop
  CheckEpilogue(y, ldy, n, 4097, 7, c);
  // Long rows (segmented selection) with heavy ties.
  const int64_t nl = 100000;
  std::vector<float> yl(3 * nl);
  for (int64_t j = 0; j < nl; ++j) {
    yl[j] = static_cast<float>((j * 7919) % 13);
    yl[nl + j] = 1.f;
    yl[2 * nl + j] = (j % 7 == 0) ? -0.f : static_cast<float>(j % 5) * 0.f;
  }
  EpilogueCase cl;
  for (int r = 0; r < 3; ++r)
    for (uint32_t k : {1u, 8u, 1024u}) AddRow(cl, r, cuda::ReduceMode::kTopK, k, 1.f, 0, 0, false, nl);
  CheckEpilogue(yl, nl, nl, nl, 0, cl);
}

TEST(CudaReduce, RefusesBadRows) {
  DH_SKIP_WITHOUT_GPU();
  cuda::ReduceRow r{};
  r.mode = static_cast<uint8_t>(cuda::ReduceMode::kTopK);
  r.k = 1025;
  r.temperature = 1.f;
  EXPECT_EQ(cuda::ValidateReduceRows(&r, 1), cudaErrorInvalidValue);
  r.k = 4;
  r.out_offset = 8;
  EXPECT_EQ(cuda::ValidateReduceRows(&r, 1), cudaErrorInvalidValue);
  r.out_offset = 0;
  r.mode = 9;
  EXPECT_EQ(cuda::ValidateReduceRows(&r, 1), cudaErrorInvalidValue);
}

// ---- BF16_EXACT -------------------------------------------------------------------------------
TEST(CudaBf16Head, MatchesFloat64) {
  DH_SKIP_WITHOUT_GPU();
  const int64_t n = 32320, k = 5120;
  const auto w = MakeWeights(n, k, 31);
  const auto x = MakeHidden(64, k, 32);
  DeviceBuffer<uint16_t> dw(w.size()), dx(x.size());
  DH_CU(dw.Upload(w));
  DH_CU(dx.Upload(x));
  const auto ref = ComputeReference(x, 64, k, nullptr, nullptr, w.data(), n);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  for (int m : {1, 5, 16, 64}) {
    DeviceBuffer<float> dy(static_cast<size_t>(m) * n);
    DH_CU(cudaMemcpy(dy.get(), Poisoned(dy.size()).data(), dy.size() * 4, cudaMemcpyHostToDevice));
    ASSERT_EQ(cuda::HeadGemmBf16(h, dx.get(), m, k, dw.get(), n, dy.get(), n, nullptr),
              CUBLAS_STATUS_SUCCESS);
    DH_CU(cudaDeviceSynchronize());
    const auto y = dy.Download(dy.size());
    int64_t bad = 0;
    for (size_t i = 0; i < y.size(); ++i)
      bad += !(std::fabs(y[i] - ref.y[i]) <= AccumulationBound(k, ref.abs[i]));
    EXPECT_EQ(bad, 0) << "m=" << m;
  }
  cublasDestroy(h);
}
