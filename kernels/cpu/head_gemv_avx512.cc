// AVX-512 BF16 LM-head GEMV for the fp8 twin (built with -mavx512f -mavx512bw -mavx512vbmi
// -mavx512bf16; called only after the run-time check in head_gemv.cc).
//
// The products are bf16 x bf16 on `vdpbf16ps` (32 multiply-adds an instruction into fp32, four
// times the AVX2 FMA's 8). Both operands are exact bf16:
//  - weights: every e4m3 value (2^-9 .. 448, 3 mantissa bits) is a bf16 normal, so the decode is
//    a byte -> 16-bit table lookup: two `vpermi2b` (128-entry tables of the low and high bytes,
//    indexed by the 7 magnitude bits), the sign or-ed into the high byte, `vpunpck{l,h}bw` to
//    make 16-bit lanes. No scale on the weights.
//  - x: the block scale 2^(exp-127) is folded into x once per band (as the AVX2 path folds it
//    into its fp32 x): an integer add of (exp-127) << 7 to every nonzero bf16 (+-0 stay zero),
//    exact while the result is a bf16 normal (with several x-row groups the scale goes on the
//    decoded weights instead, the same add). A band with an exponent byte outside [10, 246] or
//    where some scaled |x| would leave [2^-117, 2^119) (so a product with a nonzero code could
//    fall below fp32's normals, which vdpbf16ps flushes, or overflow), or a call whose x holds a
//    subnormal / Inf / NaN (vdpbf16ps reads subnormals as zero), goes to the AVX2 path; no real
//    head and hidden state come near.
// So every product is exact and the result is an fp32 sum of them in another order than the AVX2
// path: bounded by the same fp32 accumulation error, not bit-identical, to it.
// M > 8 (several x-row groups): each column chunk of a band is decoded once into an L2-resident
// bf16 buffer that every group then reads, so the decode is not repeated per group.
// The unpack works inside 128-bit lanes: decoded vector "lo" holds columns {0-7, 16-23, 32-39,
// 48-55} of a 64-column group and "hi" the others (in both, 16-bit lanes 0-15 come from the
// group's first exponent block, 16-31 from the second); x is stored permuted the same way.
// Blocking as in head_gemv_avx2.cc: bands of 32 output rows (one exponent row), x rows in groups
// of up to 8, columns in chunks whose x tile stays in L1, NR weight rows per tile. A tile's
// accumulators and decoded weights live in registers (>= 12 independent vdpbf16ps chains, see
// NrFor); a streamed band prefetches the next band's codes. Measurements: docs/NOTES.md, issue 12.
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_ps extracts with an undefined operand that -Wmaybe-uninitialized
// reports at every inlined use (a header false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/head_gemv.h"
#include "kernels/numeric.h"

namespace drafthead::cpu::internal {
namespace {

constexpr int64_t kBand = 32;
constexpr int kMaxMr = 8;
constexpr int64_t kGroup = 64;  // columns per decoded pair of vectors

// Tile width (weight rows) for mr x rows. vdpbf16ps issues 2 a cycle with a latency of 6 (Zen 5),
// so a tile needs >= 12 independent accumulator chains, MR x NR, where the registers allow (32:
// MR x NR accumulators + 2 NR weight vectors + 5 decode constants for streamed tiles; x is read
// as a memory operand). One chain per output: each output's summation order is then the same
// for every MR, NR and tail tile, so a row's logits do not depend on the batch it came in.
constexpr int NrFor(int mr, bool decoded) {
  return decoded ? (mr <= 4 ? 3 : 2) : mr == 1 ? 8 : mr == 2 ? 6 : mr == 3 ? 4 : mr <= 5 ? 3 : 2;
}

struct Tables {
  __m512i lo0, lo1, hi0, hi1;
};

const Tables& DecodeTables() {
  static const Tables t = [] {
    alignas(64) std::array<uint8_t, 128> lo{}, hi{};
    for (int c = 0; c < 128; ++c) {
      // 0x7f is e4m3's NaN, which a twin never holds; its entry is unused.
      const uint16_t b = c == 0x7f ? 0 : FloatToBf16(E4m3ToFloat(static_cast<uint8_t>(c)));
      lo[c] = static_cast<uint8_t>(b & 0xff);
      hi[c] = static_cast<uint8_t>(b >> 8);
    }
    Tables r;
    r.lo0 = _mm512_load_si512(lo.data());
    r.lo1 = _mm512_load_si512(lo.data() + 64);
    r.hi0 = _mm512_load_si512(hi.data());
    r.hi1 = _mm512_load_si512(hi.data() + 64);
    return r;
  }();
  return t;
}

// 64 codes -> 64 bf16 equal to the codes' values, in the lo/hi column order above.
inline void Decode64(__m512i codes, const Tables& t, __m512i sign_mask, __m512i& lo, __m512i& hi) {
  const __m512i l = _mm512_permutex2var_epi8(t.lo0, codes, t.lo1);  // index bit 7 is ignored
  const __m512i h = _mm512_or_si512(_mm512_permutex2var_epi8(t.hi0, codes, t.hi1),
                                    _mm512_and_si512(codes, sign_mask));
  lo = _mm512_unpacklo_epi8(l, h);
  hi = _mm512_unpackhi_epi8(l, h);
}

inline __mmask64 ValidMask(int64_t left) {
  return left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
}

// One MR x NR tile over kcn columns (a multiple of 64): xs [MR][ldxs] bf16 (permuted, scaled).
// DECODED: w is a bf16 buffer of decoded rows (uint16_t, stride ldw elements, lo then hi per
// 64 columns); else e4m3 codes (stride ldw bytes, `valid` real columns, zero-masked past them).
// Every loop over MR / NR is unrolled so that accumulators and decoded weights stay in
// registers (GCC 12 at -O2 does not unroll them by itself: it kept both on the stack, a store and
// reload per accumulator per 64 columns).
template <int MR, int NR, bool DECODED>
__attribute__((noinline)) void Micro(const uint16_t* xs, int64_t ldxs, const void* wv,
                                     int64_t ldw, int64_t kcn, int64_t valid, float* part,
                                     bool first, bool last, float* y, int64_t ldy,
                                     int64_t pf_dist) {
  const Tables& t = DecodeTables();
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const uint8_t* w = static_cast<const uint8_t*>(wv);
  const uint16_t* wd = static_cast<const uint16_t*>(wv);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j)
      acc[i][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + (j * MR + i) * 16);
  }
  for (int64_t kk = 0; kk < kcn; kk += kGroup) {
    __m512i wl[NR], wh[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (DECODED) {
        wl[j] = _mm512_load_si512(wd + j * ldw + kk);
        wh[j] = _mm512_load_si512(wd + j * ldw + kk + 32);
      } else {
        if (pf_dist != 0)
          _mm_prefetch(reinterpret_cast<const char*>(w + j * ldw + kk + pf_dist), _MM_HINT_T0);
        Decode64(_mm512_maskz_loadu_epi8(ValidMask(valid - kk), w + j * ldw + kk), t, sign, wl[j],
                 wh[j]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh xl = (__m512bh)_mm512_load_si512(xs + i * ldxs + kk);
      const __m512bh xh = (__m512bh)_mm512_load_si512(xs + i * ldxs + kk + 32);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wl[j], xl);
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wh[j], xh);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if (last)
        y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
      else
        _mm512_storeu_ps(part + (j * MR + i) * 16, acc[i][j]);
    }
  }
}

struct Chunk {
  const uint16_t* xs;  // [mr][ldxs]
  int64_t ldxs, kcn, valid;
  bool first, last;
  int64_t pf_dist;
};

// Calls tile(std::integral_constant<int, left>) for 1 <= left <= N: a compile-time tile width
// from the run-time count of rows left; nothing for 0.
template <int N, class Tile>
void TailTile(int left, Tile& tile) {
  if constexpr (N >= 1) {
    if (left == N) return tile(std::integral_constant<int, N>{});
    TailTile<N - 1>(left, tile);
  }
}

template <int MR, bool DECODED>
void BandRows(const Chunk& c, const void* w, int64_t ldw, int64_t nb, float* part, float* y,
              int64_t ldy) {
  constexpr int NR = NrFor(MR, DECODED);
  constexpr int64_t kElem = DECODED ? 2 : 1;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  int64_t j = 0;
  for (; j + NR <= nb; j += NR)
    Micro<MR, NR, DECODED>(c.xs, c.ldxs, wb + j * ldw * kElem, ldw, c.kcn, c.valid,
                           part + j * MR * 16, c.first, c.last, y + j, ldy, c.pf_dist);
  auto tail = [&](auto nr) {  // the band's last nb % NR rows as one narrower tile
    Micro<MR, decltype(nr)::value, DECODED>(c.xs, c.ldxs, wb + j * ldw * kElem, ldw, c.kcn,
                                            c.valid, part + j * MR * 16, c.first, c.last, y + j,
                                            ldy, c.pf_dist);
  };
  TailTile<NR - 1>(static_cast<int>(nb - j), tail);
}

template <bool DECODED>
void BandRowsDispatch(int mr, const Chunk& c, const void* w, int64_t ldw, int64_t nb,
                      float* part, float* y, int64_t ldy) {
  switch (mr) {
#define DH_CASE(R) \
  case R:          \
    return BandRows<R, DECODED>(c, w, ldw, nb, part, y, ldy);
    DH_CASE(1) DH_CASE(2) DH_CASE(3) DH_CASE(4) DH_CASE(5) DH_CASE(6) DH_CASE(7) DH_CASE(8)
#undef DH_CASE
  }
}

// The scale of exponent byte e as a bf16 exponent-field add: (e - 127) << 7.
inline int16_t ScaleAdd(uint8_t e) { return static_cast<int16_t>((static_cast<int>(e) - 127) * 128); }

// Smallest / largest of the 32 16-bit lanes of v (unsigned).
inline int16_t MinEpu16(__m512i v) {
  return static_cast<int16_t>(_mm512_reduce_min_epu32(
      _mm512_min_epu32(_mm512_and_si512(v, _mm512_set1_epi32(0xffff)), _mm512_srli_epi32(v, 16))));
}
inline int16_t MaxEpu16(__m512i v) {
  return static_cast<int16_t>(_mm512_reduce_max_epu32(
      _mm512_max_epu32(_mm512_and_si512(v, _mm512_set1_epi32(0xffff)), _mm512_srli_epi32(v, 16))));
}

// x prepared once per call: xs[i] = x[i] permuted per 64-column group (zero past k), and per
// 32-column block the smallest and largest biased exponent of its nonzero values over all rows
// (bands then check their scale against these; a block zero in every row gets lo 255 > hi 0).
// False when x holds a subnormal, Inf or NaN. Columns outer, rows inner: the per-block minimum
// and maximum stay in registers and are reduced once per block, not once per row.
bool PrepX(const uint16_t* x, int64_t k, int m, int64_t ldxs, uint16_t* xs, int16_t* ex_lo,
           int16_t* ex_hi) {
  // Word indices of the lo / hi vectors in the two 32-word halves of a group (bit 5 picks b).
  alignas(64) static const uint16_t kLoIdx[32] = {0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18,
                                                  19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37,
                                                  38, 39, 48, 49, 50, 51, 52, 53, 54, 55};
  alignas(64) static const uint16_t kHiIdx[32] = {8,  9,  10, 11, 12, 13, 14, 15, 24, 25, 26,
                                                  27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45,
                                                  46, 47, 56, 57, 58, 59, 60, 61, 62, 63};
  const __m512i lo_idx = _mm512_load_si512(kLoIdx), hi_idx = _mm512_load_si512(kHiIdx);
  const __m512i mag = _mm512_set1_epi16(0x7fff), ex_mask = _mm512_set1_epi16(0xff);
  __mmask32 bad = 0;
  for (int64_t g = 0; g < k; g += kGroup) {
    const bool two = g + 32 < k;  // the group's second exponent block exists
    __m512i vlo[2] = {ex_mask, ex_mask}, vhi[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int i = 0; i < m; ++i) {
      const uint16_t* xr = x + static_cast<int64_t>(i) * k + g;
      __m512i half[2] = {_mm512_loadu_si512(xr), _mm512_setzero_si512()};
      if (two) half[1] = _mm512_loadu_si512(xr + 32);
      for (int h = 0; h < 2; ++h) {
        const __mmask32 nz = _mm512_test_epi16_mask(half[h], mag);
        const __m512i ex = _mm512_and_si512(_mm512_srli_epi16(half[h], 7), ex_mask);
        bad |= _mm512_mask_cmpeq_epi16_mask(nz, ex, _mm512_setzero_si512()) |
               _mm512_mask_cmpeq_epi16_mask(nz, ex, ex_mask);
        vlo[h] = _mm512_mask_min_epu16(vlo[h], nz, vlo[h], ex);
        vhi[h] = _mm512_mask_max_epu16(vhi[h], nz, vhi[h], ex);
      }
      uint16_t* d = xs + i * ldxs + g;
      _mm512_store_si512(d, _mm512_permutex2var_epi16(half[0], lo_idx, half[1]));
      _mm512_store_si512(d + 32, _mm512_permutex2var_epi16(half[0], hi_idx, half[1]));
    }
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      ex_lo[g / 32 + h] = MinEpu16(vlo[h]);
      ex_hi[g / 32 + h] = MaxEpu16(vhi[h]);
    }
  }
  return bad == 0;
}

// Whether the band's scales keep every product exact (see the top): exponent bytes in [10, 246]
// (code * 2^s a bf16 normal) and each nonzero x * 2^s in [2^-117, 2^119) (a bf16 normal whose
// products with codes in [2^-9, 448] are fp32 normals), i.e. biased exponents in [10, 245].
bool BandFits(const uint8_t* e, int64_t kb, const int16_t* ex_lo, const int16_t* ex_hi) {
  for (int64_t b = 0; b < kb; ++b) {
    if (e[b] < 10 || e[b] > 246) return false;
    if (ex_lo[b] > ex_hi[b]) continue;  // x is zero in this block for every row
    const int s = static_cast<int>(e[b]) - 127;
    if (ex_lo[b] + s < 10 || ex_hi[b] + s > 245) return false;
  }
  return true;
}

// dst[i] = xs[i] * 2^(e[block] - 127) (exact under BandFits), same layout, for m rows and the
// columns [c0, c1) (multiples of 64): one column chunk, scaled just before its tiles read it so
// that it is still in L1 (a whole band's x for 5 rows, 51 KB, is not).
void ScaleX(const uint16_t* xs, int m, int64_t kpad, int64_t c0, int64_t c1, const uint8_t* e,
            int64_t kb, uint16_t* dst) {
  const __m512i mag = _mm512_set1_epi16(0x7fff);
  for (int64_t g = c0; g < c1; g += kGroup) {
    const int64_t b = g / 32;
    // Lanes 0-15 of lo and hi come from block b, 16-31 from block b + 1.
    const __m512i s = _mm512_mask_blend_epi16(
        0xffff0000u, _mm512_set1_epi16(ScaleAdd(e[b])),
        _mm512_set1_epi16(b + 1 < kb ? ScaleAdd(e[b + 1]) : int16_t{0}));
    for (int i = 0; i < m; ++i) {
      for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_load_si512(xs + i * kpad + g + 32 * h);
        _mm512_store_si512(dst + i * kpad + g + 32 * h,
                           _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(v, mag), v, s));
      }
    }
  }
}

// Rows [0, nb) of a band, columns [kc0, kc0 + kcn) (a multiple of 64), decoded into wd [nb][kcn]
// and scaled by the band's exponents e (exact under BandFits: code * 2^s stays a bf16 normal).
void DecodeChunk(const uint8_t* w, int64_t k, int64_t nb, int64_t kc0, int64_t kcn,
                 const uint8_t* e, uint16_t* wd) {
  const Tables& t = DecodeTables();
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i mag = _mm512_set1_epi16(0x7fff);
  const int64_t kb = k / 32;
  for (int64_t r = 0; r < nb; ++r) {
    const uint8_t* row = w + r * k + kc0;
    for (int64_t kk = 0; kk < kcn; kk += kGroup) {
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kk), _MM_HINT_T0);  // the next row
      const int64_t b = (kc0 + kk) / 32;
      const __m512i s = _mm512_mask_blend_epi16(
          0xffff0000u, _mm512_set1_epi16(ScaleAdd(e[b])),
          _mm512_set1_epi16(b + 1 < kb ? ScaleAdd(e[b + 1]) : int16_t{0}));
      __m512i lo, hi;
      Decode64(_mm512_maskz_loadu_epi8(ValidMask(k - kc0 - kk), row + kk), t, sign, lo, hi);
      _mm512_store_si512(wd + r * kcn + kk, _mm512_mask_add_epi16(lo, _mm512_test_epi16_mask(lo, mag), lo, s));
      _mm512_store_si512(wd + r * kcn + kk + 32, _mm512_mask_add_epi16(hi, _mm512_test_epi16_mask(hi, mag), hi, s));
    }
  }
}

template <class T>
T* Align64(std::vector<T>& v, size_t n) {
  v.resize(n + 64 / sizeof(T));
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(v.data()) + 63) &
                              ~static_cast<uintptr_t>(63));
}

}  // namespace

void Fp8BandsAvx512(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                    const uint8_t* exps, int64_t n, float* y, int64_t ldy, int64_t b0,
                    int64_t b1) {
  const int groups = (m + kMaxMr - 1) / kMaxMr;
  const int mr_max = (m + groups - 1) / groups;
  const int64_t kpad = (k + kGroup - 1) / kGroup * kGroup;
  const int64_t kb = k / 32;
  // Column chunk: whole rows while a group's x (bf16) fits L1 comfortably, else L1-sized tiles.
  int64_t kc = kpad;
  if (static_cast<int64_t>(mr_max) * kpad * 2 > 24 * 1024)
    kc = std::clamp<int64_t>((16 * 1024 / (2 * mr_max)) / kGroup * kGroup, 256, kpad);
  thread_local std::vector<uint16_t> xs_buf, xscaled_buf, wd_buf;
  thread_local std::vector<int16_t> ex_lo, ex_hi;
  thread_local std::vector<float> part_buf;
  uint16_t* const xs = Align64(xs_buf, static_cast<size_t>(m) * kpad);
  ex_lo.resize(kb);
  ex_hi.resize(kb);
  if (!PrepX(x, k, m, kpad, xs, ex_lo.data(), ex_hi.data()))
    return Fp8BandsAvx2(x, m, k, codes, exps, n, y, ldy, b0, b1);
  // One group (m <= 8): the band's scale goes on its x (m rows); several groups: on the
  // weights, decoded once per band chunk, so x stays as prepared.
  uint16_t* const xsc = groups == 1 ? Align64(xscaled_buf, static_cast<size_t>(m) * kpad) : xs;
  uint16_t* const wd = groups > 1 ? Align64(wd_buf, static_cast<size_t>(kBand) * kc) : nullptr;
  const size_t part_per_group = static_cast<size_t>(mr_max) * kBand * 16;
  float* const part = Align64(part_buf, part_per_group * groups);
  for (int64_t band = b0; band < b1; ++band) {
    const int64_t r0 = band * kBand;
    const int64_t nb = std::min(kBand, n - r0);
    const uint8_t* e = exps + band * kb;
    if (!BandFits(e, kb, ex_lo.data(), ex_hi.data())) {
      Fp8BandsAvx2(x, m, k, codes, exps, n, y, ldy, band, band + 1);
      continue;
    }
    const uint8_t* wb = codes + r0 * k;
    // The next band's codes, when this thread does it and it is whole (see the prefetch below).
    const int64_t pf_dist = band + 1 < b1 && r0 + 2 * kBand <= n ? kBand * k : 0;
    for (int64_t kc0 = 0; kc0 < kpad; kc0 += kc) {
      const int64_t kcn = std::min(kc, kpad - kc0);
      if (groups > 1)
        DecodeChunk(wb, k, nb, kc0, kcn, e, wd);
      else
        ScaleX(xs, m, kpad, kc0, kc0 + kcn, e, kb, xsc);
      int m0 = 0;
      for (int g = 0; g < groups; ++g) {
        const int mr = m / groups + (g < m % groups ? 1 : 0);
        Chunk c{xsc + static_cast<int64_t>(m0) * kpad + kc0, kpad, kcn, std::min(kcn, k - kc0),
                kc0 == 0, kc0 + kcn == kpad, pf_dist};
        float* yg = y + m0 * ldy + r0;
        float* pg = part + g * part_per_group;
        if (groups > 1) {
          BandRowsDispatch<true>(mr, c, wd, kcn, nb, pg, yg, ldy);
        } else {
          // One group streams the band from memory and prefetches the next band's codes at the
          // same place, so each line is asked for once, a band (~164 KB, in L2) ahead. Without
          // software prefetch M = 1 and 5 ran ~3x slower on the real shard (Zen 5, 2026-12-03);
          // 1, 4 or 8 tiles ahead in the band or one band ahead measured the same within noise,
          // 8 tiles ahead in processing order (into the band's next chunk) 2x slower at M = 5.
          BandRowsDispatch<false>(mr, c, wb + kc0, k, nb, pg, yg, ldy);
        }
        m0 += mr;
      }
    }
  }
}

}  // namespace drafthead::cpu::internal
