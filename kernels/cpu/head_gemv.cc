// Portable scalar LM-head GEMV and the run-time dispatch between it and the AVX2 / AVX-512 BF16
// kernels (head_gemv_avx2.cc, head_gemv_avx512.cc). The scalar path is the reference-grade fallback: it dequantizes each weight
// exactly (E4m3ToFloat(code) * 2^(exp - 127) in fp32), once per call, then forms fp32 dot products.
#include "kernels/cpu/head_gemv.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/numeric.h"

namespace drafthead::cpu {
namespace {

constexpr int64_t kBand = 32;  // output rows per band (= rows per twin exponent row)

const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int c = 0; c < 256; ++c) a[c] = E4m3ToFloat(static_cast<uint8_t>(c));
    return a;
  }();
  return t;
}

// 2^(e - 127) for every biased exponent byte; 2^-127 is an fp32 subnormal, still exact.
const std::array<float, 256>& ScaleTable() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int e = 0; e < 256; ++e) a[e] = std::ldexp(1.0f, e - 127);
    return a;
  }();
  return t;
}

// Eight independent partial sums so the compiler can keep several chains (and SSE lanes) busy.
inline float Dot(const float* a, const float* b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < k; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// x as fp32 [m, k]; per thread, reused across calls.
const float* ConvertX(const uint16_t* x, int m, int64_t k, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(m) * k);
  for (int64_t i = 0; i < static_cast<int64_t>(m) * k; ++i) buf[i] = Bf16ToFloat(x[i]);
  return buf.data();
}

enum class Resolved { kScalar, kAvx2, kAvx512 };

bool CpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = CpuHasAvx2Fma() && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vbmi") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

// kAuto: the widest path the CPU has, nothing else (an explicit GemvIsa picks another).
Resolved AutoIsa() {
  static const Resolved r = CpuHasAvx512Bf16() ? Resolved::kAvx512
                            : CpuHasAvx2Fma()  ? Resolved::kAvx2
                                               : Resolved::kScalar;
  return r;
}

Resolved Resolve(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::kAuto:
      return AutoIsa();
    case GemvIsa::kScalar:
      return Resolved::kScalar;
    case GemvIsa::kAvx2:
      if (!CpuHasAvx2Fma()) {
        std::fprintf(stderr, "drafthead: HeadGemv*With(kAvx2) on a CPU without AVX2/FMA/F16C\n");
        std::abort();
      }
      return Resolved::kAvx2;
    case GemvIsa::kAvx512Bf16:
      if (!CpuHasAvx512Bf16()) {
        std::fprintf(stderr, "drafthead: HeadGemv*With(kAvx512Bf16) on a CPU without AVX-512 BF16\n");
        std::abort();
      }
      return Resolved::kAvx512;
  }
  return Resolved::kScalar;
}

void ZeroOutput(int m, int64_t n, float* y, int64_t ldy) {
  for (int i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + n, 0.0f);
}

}  // namespace

namespace internal {

void Fp8BandsScalar(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                    int64_t n, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  thread_local std::vector<float> xbuf, wrow;
  const float* xf = ConvertX(x, m, k, xbuf);
  wrow.resize(k);
  const auto& lut = E4m3Table();
  const auto& scale = ScaleTable();
  const int64_t kb = k / 32;
  for (int64_t band = b0; band < b1; ++band) {
    const uint8_t* e = exps + band * kb;
    const int64_t r1 = std::min(n, (band + 1) * kBand);
    for (int64_t r = band * kBand; r < r1; ++r) {
      // Dequantize the row once (exact), then reuse it for every x row.
      const uint8_t* c = codes + r * k;
      for (int64_t b = 0; b < kb; ++b) {
        const float s = scale[e[b]];
        for (int j = 0; j < 32; ++j) wrow[b * 32 + j] = lut[c[b * 32 + j]] * s;
      }
      for (int i = 0; i < m; ++i) y[i * ldy + r] = Dot(xf + i * k, wrow.data(), k);
    }
  }
}

void Bf16BandsScalar(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                     int64_t ldy, int64_t b0, int64_t b1) {
  thread_local std::vector<float> xbuf, wrow;
  const float* xf = ConvertX(x, m, k, xbuf);
  wrow.resize(k);
  for (int64_t band = b0; band < b1; ++band) {
    const int64_t r1 = std::min(n, (band + 1) * kBand);
    for (int64_t r = band * kBand; r < r1; ++r) {
      const uint16_t* row = w + r * k;
      for (int64_t c = 0; c < k; ++c) wrow[c] = Bf16ToFloat(row[c]);
      for (int i = 0; i < m; ++i) y[i * ldy + r] = Dot(xf + i * k, wrow.data(), k);
    }
  }
}

}  // namespace internal

bool GemvIsaAvailable(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::kAvx2: return CpuHasAvx2Fma();
    case GemvIsa::kAvx512Bf16: return CpuHasAvx512Bf16();
    default: return true;
  }
}

bool ParseGemvIsa(std::string_view name, GemvIsa* isa) {
  for (GemvIsa i : {GemvIsa::kAuto, GemvIsa::kScalar, GemvIsa::kAvx2, GemvIsa::kAvx512Bf16}) {
    if (name == GemvIsaName(i)) {
      *isa = i;
      return true;
    }
  }
  return false;
}

const char* GemvIsaName(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::kScalar: return "scalar";
    case GemvIsa::kAvx2: return "avx2";
    case GemvIsa::kAvx512Bf16: return "avx512bf16";
    default: return "auto";
  }
}

namespace {

// The frame both heads share: empty shapes, then the bands split over the pool, each range of bands
// computed by bands(resolved ISA, b0, b1).
template <class Bands>
void RunBands(GemvIsa isa, int m, int64_t k, int64_t n, float* y, int64_t ldy, ThreadPool& pool, Bands bands) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return ZeroOutput(m, n, y, ldy);
  const Resolved r = Resolve(isa);
  pool.ParallelFor((n + kBand - 1) / kBand, 1, [&](int64_t b0, int64_t b1) { bands(r, b0, b1); });
}

}  // namespace

void HeadGemvFp8With(GemvIsa isa, const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                     const uint8_t* exps, int64_t n, float* y, int64_t ldy, ThreadPool& pool) {
  RunBands(isa, m, k, n, y, ldy, pool, [&](Resolved r, int64_t b0, int64_t b1) {
#if defined(__x86_64__) || defined(__i386__)
    if (r == Resolved::kAvx512) return internal::Fp8BandsAvx512(x, m, k, codes, exps, n, y, ldy, b0, b1);
    if (r == Resolved::kAvx2) return internal::Fp8BandsAvx2(x, m, k, codes, exps, n, y, ldy, b0, b1);
#endif
    internal::Fp8BandsScalar(x, m, k, codes, exps, n, y, ldy, b0, b1);
  });
}

void HeadGemvBf16With(GemvIsa isa, const uint16_t* x, int m, int64_t k, const uint16_t* w,
                      int64_t n, float* y, int64_t ldy, ThreadPool& pool) {
  RunBands(isa, m, k, n, y, ldy, pool, [&](Resolved r, int64_t b0, int64_t b1) {
#if defined(__x86_64__) || defined(__i386__)
    if (r != Resolved::kScalar) return internal::Bf16BandsAvx2(x, m, k, w, n, y, ldy, b0, b1);
#endif
    internal::Bf16BandsScalar(x, m, k, w, n, y, ldy, b0, b1);
  });
}

void HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                 int64_t n, float* y, int64_t ldy, ThreadPool& pool) {
  HeadGemvFp8With(GemvIsa::kAuto, x, m, k, codes, exps, n, y, ldy, pool);
}

void HeadGemvBf16(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                  int64_t ldy, ThreadPool& pool) {
  HeadGemvBf16With(GemvIsa::kAuto, x, m, k, w, n, y, ldy, pool);
}

const char* HeadGemvIsa() {
  switch (AutoIsa()) {
    case Resolved::kAvx512: return "avx512bf16";
    case Resolved::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace drafthead::cpu
