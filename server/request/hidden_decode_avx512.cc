// hidden_decode.h's AVX-512 (F + BW) versions, built with those flags (CMakeLists.txt) and called
// only where the CPU has them. 16 fp32 or 32 bf16 values per step, the tail masked.

#include "kernels/cpu/x86_intrinsics.h"
#include "server/request/hidden_decode.h"

namespace drafthead::hidden {

size_t Fp32ToBf16Avx512(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  const __m512i half = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bexp = _mm512_set1_epi32(0x7f80);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512i u = _mm512_maskz_loadu_epi32(live, src + i * 4);
    // Round to nearest even on the bits: + 0x7fff + the kept part's lowest bit, keep the top half.
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    const __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, half), lsb), 16);
    const __mmask16 bad = (_mm512_mask_cmpeq_epi32_mask(live, _mm512_and_si512(u, exp), exp) |
                           _mm512_mask_cmpeq_epi32_mask(live, _mm512_and_si512(b, bexp), bexp));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, live, b);
    if (bad != 0) {
      alignas(64) uint32_t got[16];
      _mm512_store_si512(got, u);  // the value as read
      const int j = __builtin_ctz(bad);
      *bad_bits = got[j];
      return i + j;
    }
  }
  return n;
}

size_t CopyBf16Avx512(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits) {
  const __m512i exp = _mm512_set1_epi16(0x7f80);
  for (size_t i = 0; i < n; i += 32) {
    const __mmask32 live = n - i >= 32 ? __mmask32(0xffffffffu) : __mmask32((uint64_t{1} << (n - i)) - 1);
    const __m512i v = _mm512_maskz_loadu_epi16(live, src + i * 2);
    _mm512_mask_storeu_epi16(dst + i, live, v);
    const __mmask32 bad = _mm512_mask_cmpeq_epi16_mask(live, _mm512_and_si512(v, exp), exp);
    if (bad != 0) {
      alignas(64) uint16_t got[32];
      _mm512_store_si512(got, v);
      const int j = __builtin_ctz(bad);
      *bad_bits = got[j];
      return i + j;
    }
  }
  return n;
}

}  // namespace drafthead::hidden
