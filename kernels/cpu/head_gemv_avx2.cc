// AVX2/FMA/F16C LM-head GEMV (built with -mavx2 -mfma -mf16c; called only after the run-time check
// in head_gemv.cc).
//
// Dequantization without gathers: an e4m3fn byte s eeee mmm becomes the fp16 s 0eeee mmm0000000
// (sign-extend to 16 bits, shift left 7, clear bit 14), whose value is exactly e4m3 * 2^-8 for
// normals and subnormals alike (fp16's exponent range is wider). vcvtph2ps makes it fp32. The
// block scale 2^(exp-127) and the 2^8 correction are folded into x: xs = x * 2^(exp-119), exact
// for exp <= 246 (bands with a larger exponent, i.e. weights near 2^120, go to the scalar path).
//
// Blocking: output rows come in bands of 32 (one exponent row). Per band, x rows are taken in
// groups of up to 12 (MR); per group the band's columns in chunks of KC so the scaled x tile
// (MR x KC fp32) stays in L1 while NR weight rows at a time stream through. The first group reads
// the band's weights from memory (software prefetch one chunk ahead); the other groups find them
// in L1/L2, so every weight byte crosses the memory bus once per call whatever M is.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/head_gemv.h"
#include "kernels/numeric.h"

namespace drafthead::cpu::internal {
namespace {

constexpr int64_t kBand = 32;
// x rows per group. Up to 12 would fit the registers (12 accumulators + weight + x + constant),
// but 8 measured faster here: fewer x loads in flight per converted weight vector.
constexpr int kMaxMr = 8;
constexpr int kMaxExpFolded = 246;  // x * 2^(exp - 119) must stay a finite fp32 scale

struct Fp8Format {
  using T = uint8_t;
  static __m256 Load8(const uint8_t* p, __m128i clear14) {
    __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    h = _mm_and_si128(_mm_slli_epi16(h, 7), clear14);
    return _mm256_cvtph_ps(h);
  }
};

struct Bf16Format {
  using T = uint16_t;
  static __m256 Load8(const uint16_t* p, __m128i) {
    const __m256i d = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
  }
};

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Weight rows per microkernel call for MR x rows, keeping MR * NR accumulators <= 12.
constexpr int NrFor(int mr) { return mr <= 2 ? 4 : mr == 3 ? 3 : mr <= 6 ? 2 : 1; }

// One MR x NR tile over kcn columns (a multiple of 32): xs [MR][ldxs] scaled fp32, w NR rows of
// stride ldw. Vector partial sums live in part [NR][MR][8] between column chunks; the last chunk
// reduces them into y [MR][ldy] (columns [0, NR)).
// Not inlined: each tile gets its own register allocation, and a call costs little next to the
// hundreds of FMAs in it.
template <class F, int MR, int NR>
__attribute__((noinline)) void Micro(const float* xs, int64_t ldxs, const typename F::T* w,
                                     int64_t ldw, int64_t kcn, float* part, bool first,
                                     bool last, float* y, int64_t ldy, int64_t pf_dist) {
  const __m128i clear14 = _mm_set1_epi16(static_cast<int16_t>(0xbfff));
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      acc[i][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + (j * MR + i) * 8);
  constexpr int64_t kLine = 64 / sizeof(typename F::T);  // columns per cache line of w
  for (int64_t kk = 0; kk < kcn; kk += 32) {
    if (pf_dist != 0 && (kk & (kLine - 1)) == 0) {
      for (int j = 0; j < NR; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w + j * ldw + kk + pf_dist), _MM_HINT_T0);
    }
    for (int q = 0; q < 32; q += 8) {
      __m256 wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = F::Load8(w + j * ldw + kk + q, clear14);
      for (int i = 0; i < MR; ++i) {
        const __m256 xv = _mm256_loadu_ps(xs + i * ldxs + kk + q);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  if (last) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) y[i * ldy + j] = HSum(acc[i][j]);
  } else {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) _mm256_storeu_ps(part + (j * MR + i) * 8, acc[i][j]);
  }
}

struct Chunk {
  const float* xs;  // [mr][kcn]
  int64_t kcn;
  bool first, last;
  int64_t pf_dist;  // how far ahead (in elements of w) to prefetch, 0 = none
};

// All rows of one band for one x-row group and one column chunk.
template <class F, int MR>
void BandRows(const Chunk& c, const typename F::T* w, int64_t ldw, int64_t nb, float* part,
              float* y, int64_t ldy) {
  constexpr int NR = NrFor(MR);
  int64_t j = 0;
  for (; j + NR <= nb; j += NR)
    Micro<F, MR, NR>(c.xs, c.kcn, w + j * ldw, ldw, c.kcn, part + j * MR * 8, c.first, c.last,
                     y + j, ldy, c.pf_dist);
  for (; j < nb; ++j)
    Micro<F, MR, 1>(c.xs, c.kcn, w + j * ldw, ldw, c.kcn, part + j * MR * 8, c.first, c.last,
                    y + j, ldy, c.pf_dist);
}

template <class F>
void BandRowsDispatch(int mr, const Chunk& c, const typename F::T* w, int64_t ldw, int64_t nb,
                      float* part, float* y, int64_t ldy) {
  switch (mr) {
#define DH_CASE(R) \
  case R:          \
    return BandRows<F, R>(c, w, ldw, nb, part, y, ldy);
    DH_CASE(1) DH_CASE(2) DH_CASE(3) DH_CASE(4) DH_CASE(5) DH_CASE(6) DH_CASE(7) DH_CASE(8)
#undef DH_CASE
  }
}

// xs[i][0, kcn) = bf16 x[m0 + i][kc0, kc0 + kcn) as fp32, times scale[block] when scale != null.
void PrepX(const uint16_t* x, int64_t k, int m0, int mr, int64_t kc0, int64_t kcn,
           const float* scale, float* xs) {
  for (int i = 0; i < mr; ++i) {
    const uint16_t* xr = x + static_cast<int64_t>(m0 + i) * k + kc0;
    float* d = xs + i * kcn;
    for (int64_t b = 0; b < kcn; b += 32) {
      const __m256 s = _mm256_set1_ps(scale != nullptr ? scale[(kc0 + b) / 32] : 1.0f);
      for (int q = 0; q < 32; q += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + b + q)));
        _mm256_storeu_ps(d + b + q, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), s));
      }
    }
  }
}

template <class F>
void Bands(const uint16_t* x, int m, int64_t k, const typename F::T* w, const uint8_t* exps,
           int64_t n, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  // Near-equal x-row groups of at most kMaxMr rows.
  const int groups = (m + kMaxMr - 1) / kMaxMr;
  const int mr_max = (m + groups - 1) / groups;
  // Column chunk: the whole row when all of x fits in L1 comfortably, else an L1-sized x tile.
  int64_t kc = k;
  if (static_cast<int64_t>(m) * k * 4 > 32 * 1024) {
    kc = std::clamp<int64_t>((16 * 1024 / (4 * mr_max)) / 32 * 32, 256, k);
  }
  thread_local std::vector<float> xs_buf, part, scale;
  xs_buf.resize(static_cast<size_t>(mr_max) * kc + 16);
  // 64-byte aligned so no 32-byte x load splits a cache line (measured ~15% at large M).
  float* const xs = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(xs_buf.data()) + 63) &
                                             ~static_cast<uintptr_t>(63));
  part.resize(static_cast<size_t>(mr_max) * kBand * 8);
  const int64_t kb = k / 32;
  scale.resize(kb);

  for (int64_t band = b0; band < b1; ++band) {
    const int64_t r0 = band * kBand;
    const int64_t nb = std::min(kBand, n - r0);
    const float* sc = nullptr;
    if constexpr (sizeof(typename F::T) == 1) {
      const uint8_t* e = exps + band * kb;
      if (*std::max_element(e, e + kb) > kMaxExpFolded) {
        // Weights near the top of the fp32 range: the exact scalar path handles the band.
        Fp8BandsScalar(x, m, k, reinterpret_cast<const uint8_t*>(w), exps, n, y, ldy, band,
                       band + 1);
        continue;
      }
      for (int64_t b = 0; b < kb; ++b) scale[b] = BitsFloat(static_cast<uint32_t>(e[b] + 8) << 23);
      sc = scale.data();
    }
    const typename F::T* wb = w + r0 * k;
    int m0 = 0;
    for (int g = 0; g < groups; ++g) {
      const int mr = m / groups + (g < m % groups ? 1 : 0);
      for (int64_t kc0 = 0; kc0 < k; kc0 += kc) {
        const int64_t kcn = std::min(kc, k - kc0);
        PrepX(x, k, m0, mr, kc0, kcn, sc, xs);
        Chunk c{xs, kcn, kc0 == 0, kc0 + kcn == k, 0};
        // Only the first group pulls the band from memory; prefetch the next chunk of each row
        // (or, for whole rows, the rows one tile further on).
        if (g == 0) c.pf_dist = kc < k ? kc : NrFor(mr) * k;
        BandRowsDispatch<F>(mr, c, wb + kc0, k, nb, part.data(), y + m0 * ldy + r0, ldy);
      }
      m0 += mr;
    }
  }
}

}  // namespace

void Fp8BandsAvx2(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                  int64_t n, float* y, int64_t ldy, int64_t b0, int64_t b1) {
  Bands<Fp8Format>(x, m, k, codes, exps, n, y, ldy, b0, b1);
}

void Bf16BandsAvx2(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                   int64_t ldy, int64_t b0, int64_t b1) {
  Bands<Bf16Format>(x, m, k, w, nullptr, n, y, ldy, b0, b1);
}

}  // namespace drafthead::cpu::internal
