// Scalar number formats shared by every backend: bf16 and OCP e4m3fn conversions, the twin's
// block exponent, and the counter-based generator behind SAMPLE. Header-only and usable from
// CUDA (__host__ __device__) so the CPU and GPU paths cannot drift apart.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define DH_HD __host__ __device__ __forceinline__
#else
#define DH_HD inline
#endif

namespace drafthead {

DH_HD int LeadingBit(uint32_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return 31 - __clz(x);
#else
  return 31 - __builtin_clz(x);
#endif
}

DH_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DH_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 is carried as its raw uint16_t bits everywhere outside kernels.
DH_HD float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
DH_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// e4m3fn (OCP FP8: bias 7, no infinities, 0x7f/0xff are NaN, max 448) to fp32, exact.
DH_HD float E4m3ToFloat(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t man = c & 0x7u;
  if (exp == 0xfu && man == 0x7u) return BitsFloat(sign | 0x7fc00000u);
  if (exp == 0) {
    // subnormal: man * 2^-9
    float v = static_cast<float>(man) * 0.001953125f;
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 120u) << 23) | (man << 20));
}

// fp32 to e4m3fn, round to nearest even. |f| >= 480 (the first value that would round past 448)
// and NaN give the NaN code, as PyTorch's float8_e4m3fn cast does; the twin never produces them
// because every scaled block value is <= 448 by construction.
DH_HD uint8_t FloatToE4m3(float f) {
  uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u >= 0x43f00000u) return static_cast<uint8_t>(sign | 0x7fu);  // >= 480 or NaN
  if (u < 0x3c800000u) {
    // Below 2^-6: the e4m3 subnormal range, a fixed-point grid of 2^-9. Adding 2^-9 * 2^23
    // (= 2^14) aligns the grid with the fp32 integer ulp so the FPU does the RNE rounding.
    const float big = BitsFloat(141u << 23);  // 2^14
    const float s = BitsFloat(u) + big;
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(FloatBits(s) - FloatBits(big)));
  }
  // Normal: keep 3 mantissa bits with RNE on the 20 dropped ones, then rebias 127 -> 7.
  const uint32_t odd = (u >> 20) & 1u;
  u += 0x7ffffu + odd;
  u -= (127u - 7u) << 23;
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(u >> 20));
}

// The twin's block exponent e = ceil(log2(amax / 448)), computed exactly from frexp's
// decomposition, clamped to [-127, 127]; amax is already clamped to >= 2^-126.
DH_HD int TwinBlockExponent(float amax) {
  const float r = amax / 448.0f;
  const uint32_t u = FloatBits(r);
  int p;           // r = m * 2^p, m in [0.5, 1)
  uint32_t man;    // fraction bits, zero iff m == 0.5
  const uint32_t be = (u >> 23) & 0xffu;
  if (be == 0) {
    // subnormal r: find its leading bit
    uint32_t f = u & 0x7fffffu;
    int lead = LeadingBit(f);
    p = lead - 148;  // value = f * 2^-149, leading bit 2^(lead-149) = 0.5 * 2^(lead-148)
    man = f & ~(1u << lead);
  } else {
    p = static_cast<int>(be) - 126;
    man = u & 0x7fffffu;
  }
  int e = (man == 0) ? p - 1 : p;
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return e;
}

// ---- SAMPLE: counter-based Gumbel noise ----------------------------------------------------
// Every step below is an IEEE-exact operation (integer mixing, correctly rounded division and
// explicit fmaf) so the CPU and the GPU draw the same noise bit for bit: the sample depends only on
// (seed, row within its request, global token id), never on tp, batch mates or the backend.

DH_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

DH_HD uint64_t Mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// u in (0, 1) from 24 random bits v: (v + 1/2) 2^-24 rounded to fp32 (exact below 1/2, a 2^-23
// grid above). The largest v would round to 1.0, whose noise -log(-log u) reads 88 (DetLog of
// -0): a token drawn whatever its logit, in ~0.8 % of rows over a 129280-token vocabulary. It is
// held just below 1 (noise 16.6, in line with its neighbours) instead.
DH_HD float UniformFromBits24(uint32_t v) {
  const float u = (static_cast<float>(v) + 0.5f) * 5.9604644775390625e-8f;
  return u < 0.99999994f ? u : 0.99999994f;  // 1 - 2^-24, the largest fp32 below 1
}

DH_HD float SampleUniform(uint64_t seed, uint32_t row, uint32_t token) {
  const uint64_t h = Mix64(Mix64(seed + 0x9e3779b97f4a7c15ull) ^
                           ((static_cast<uint64_t>(row) << 32) | token));
  return UniformFromBits24(static_cast<uint32_t>(h >> 40));
}

// Natural log for x > 0 (normal fp32), deterministic: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s), s = (m - 1) / (m + 1); |error| < 2 ulp, which sampling does not need better.
DH_HD float DetLog(float x) {
  uint32_t u = FloatBits(x);
  int e = static_cast<int>((u >> 23) & 0xffu) - 127;
  u = (u & 0x7fffffu) | 0x3f800000u;  // m in [1, 2)
  float m = BitsFloat(u);
  if (m > 1.41421356f) {
    m *= 0.5f;
    e += 1;
  }
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  float p = Fma(s2, 1.0f / 9.0f, 1.0f / 7.0f);
  p = Fma(p, s2, 1.0f / 5.0f);
  p = Fma(p, s2, 1.0f / 3.0f);
  p = Fma(p, s2, 1.0f);
  const float log_m = 2.0f * s * p;
  return Fma(static_cast<float>(e), 0.693147180559945309f, log_m);
}

// Gumbel(0, 1) noise -log(-log(u)).
DH_HD float GumbelNoise(uint64_t seed, uint32_t row, uint32_t token) {
  const float u = SampleUniform(seed, row, token);
  return -DetLog(-DetLog(u));
}

// The Gumbel-max key of one logit: logit / T + g.
DH_HD float SampleKey(float logit, float temperature, uint64_t seed, uint32_t row, uint32_t token) {
  const float g = GumbelNoise(seed, row, token);
  const float scaled = logit / temperature;
  return scaled + g;
}

}  // namespace drafthead
