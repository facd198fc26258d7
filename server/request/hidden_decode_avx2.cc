// hidden_decode.h's AVX2 versions (x86-64 CPUs without AVX-512 BW), built with -mavx2
// (CMakeLists.txt) and called only where the CPU has it. 64 bf16 or 16 fp32 values a step from
// registers (each source byte read once: a bad value is found in what was loaded), the rest
// one at a time.

#include <immintrin.h>

#include "server/request/hidden_decode.h"

namespace drafthead::hidden {
namespace {

inline bool Bf16Bad(uint16_t v) { return (v & 0x7f80u) == 0x7f80u; }

}  // namespace

size_t Fp32ToBf16Avx2(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  const __m256i half = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bexp = _mm256_set1_epi32(0x7f80);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * 4));
    const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * 4 + 32));
    // Round to nearest even on the bits: + 0x7fff + the kept part's lowest bit, keep the top half.
    const __m256i b0 = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u0, half), _mm256_and_si256(_mm256_srli_epi32(u0, 16), one)), 16);
    const __m256i b1 = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u1, half), _mm256_and_si256(_mm256_srli_epi32(u1, 16), one)), 16);
    const __m256i bad = _mm256_or_si256(
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u0, exp), exp),
                        _mm256_cmpeq_epi32(_mm256_and_si256(u1, exp), exp)),
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(b0, bexp), bexp),
                        _mm256_cmpeq_epi32(_mm256_and_si256(b1, bexp), bexp)));
    // packus works within 128-bit lanes: [b0 lo, b1 lo, b0 hi, b1 hi], put back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b0, b1), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
    if (_mm256_movemask_epi8(bad) != 0) {
      alignas(32) uint32_t got[16];  // the values as read
      _mm256_store_si256(reinterpret_cast<__m256i*>(got), u0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(got + 8), u1);
      for (int j = 0; j < 16; ++j) {
        if ((got[j] & 0x7f800000u) == 0x7f800000u || Bf16Bad(dst[i + j])) {
          *bad_bits = got[j];
          return i + j;
        }
      }
    }
  }
  for (; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, src + i * 4, 4);
    const uint16_t b = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    if ((u & 0x7f800000u) == 0x7f800000u || Bf16Bad(b)) {
      *bad_bits = u;
      return i;
    }
    dst[i] = b;
  }
  return n;
}

size_t CopyBf16Avx2(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits) {
  const __m256i exp = _mm256_set1_epi16(0x7f80);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256i v[4];
    for (int q = 0; q < 4; ++q) {
      v[q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * 2 + 32 * q));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16 * q), v[q]);
    }
    // The exponent fields' largest (unsigned) is all ones exactly when some value is Inf / NaN.
    const __m256i top = _mm256_max_epu16(_mm256_max_epu16(_mm256_and_si256(v[0], exp), _mm256_and_si256(v[1], exp)),
                                         _mm256_max_epu16(_mm256_and_si256(v[2], exp), _mm256_and_si256(v[3], exp)));
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(top, exp)) != 0) {
      alignas(32) uint16_t got[64];  // the values as read
      for (int q = 0; q < 4; ++q) _mm256_store_si256(reinterpret_cast<__m256i*>(got + 16 * q), v[q]);
      for (int j = 0; j < 64; ++j) {
        if (Bf16Bad(got[j])) {
          *bad_bits = got[j];
          return i + j;
        }
      }
    }
  }
  for (; i < n; ++i) {
    uint16_t v;
    __builtin_memcpy(&v, src + i * 2, 2);
    if (Bf16Bad(v)) {
      *bad_bits = v;
      return i;
    }
    dst[i] = v;
  }
  return n;
}

}  // namespace drafthead::hidden
