#include "server/request/hidden_decode.h"

#include <algorithm>
#include <cstring>

namespace drafthead::hidden {
namespace {

constexpr size_t kBlock = 64;

// Whether some value of the block is bad. Written as arithmetic (an all-ones exponent field carries
// into the top bit), not comparisons, so that GCC vectorises it for a constant n.
inline bool Bf16BlockBad(const uint16_t* v, size_t n) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; ++j) bad |= (v[j] & 0x7f80u) + 0x80u;
  return (bad & 0x8000u) != 0;
}
inline bool Fp32BlockToBf16(const uint32_t* u, size_t n, uint16_t* out) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t x = u[j];
    const uint16_t b = static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // RNE
    bad |= ((x & 0x7f800000u) + 0x00800000u) | ((static_cast<uint32_t>(b & 0x7f80u) + 0x80u) << 16);
    out[j] = b;
  }
  return (bad & 0x80000000u) != 0;
}

}  // namespace

bool CpuHasAvx512Bw() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return ok;
}

bool CpuHasAvx2() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}

size_t Fp32ToBf16Portable(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits) {
  uint32_t u[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    std::memcpy(u, src + i * 4, m * 4);
    if (!(m == kBlock ? Fp32BlockToBf16(u, kBlock, dst + i) : Fp32BlockToBf16(u, m, dst + i))) continue;
    for (size_t j = 0; j < m; ++j) {
      if ((u[j] & 0x7f800000u) == 0x7f800000u || (dst[i + j] & 0x7f80u) == 0x7f80u) {
        *bad_bits = u[j];
        return i + j;
      }
    }
  }
  return n;
}

size_t CopyBf16Portable(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits) {
  if (n == 0) return 0;  // src and dst may be null then (memcpy's pointers may not)
  std::memcpy(dst, src, n * 2);
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    if (!(m == kBlock ? Bf16BlockBad(dst + i, kBlock) : Bf16BlockBad(dst + i, m))) continue;
    size_t j = 0;
    while ((dst[i + j] & 0x7f80u) != 0x7f80u) ++j;
    *bad_bits = dst[i + j];
    return i + j;
  }
  return n;
}

// AVX2 decodes 5 rows of bf16 (51 KB) at memcpy's speed, 4.6-5.5x the portable loop (built for
// the baseline x86-64, so SSE2), on an AMD EPYC without AVX-512 (docs/NOTES.md, session 24).
size_t Fp32ToBf16(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits) {
  if (CpuHasAvx512Bw()) return Fp32ToBf16Avx512(src, n, dst, bad_bits);
  if (CpuHasAvx2()) return Fp32ToBf16Avx2(src, n, dst, bad_bits);
  return Fp32ToBf16Portable(src, n, dst, bad_bits);
}

size_t CopyBf16(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits) {
  if (CpuHasAvx512Bw()) return CopyBf16Avx512(src, n, dst, bad_bits);
  if (CpuHasAvx2()) return CopyBf16Avx2(src, n, dst, bad_bits);
  return CopyBf16Portable(src, n, dst, bad_bits);
}

}  // namespace drafthead::hidden
