// The fp8 twin (kernels/cpu/twin.cc, kernels/numeric.h) against the independent float64 reference
// in tests/reference.cc: bit-exact codes and exponents on the SPEC's corner cases, plus the
// scalar conversions over dense sweeps of fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/numeric.h"
#include "reference.h"

namespace drafthead {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t Bf(float f) { return FloatToBf16(f); }

// Checks FloatToE4m3 against the reference on every fp32 bit pattern in [lo, hi) (both signs).
void SweepBits(uint32_t lo, uint32_t hi, uint32_t stride = 1) {
  int64_t bad = 0;
  for (uint64_t u = lo; u < hi; u += stride) {
    for (uint32_t s : {0u, 0x80000000u}) {
      const float f = FromBits(static_cast<uint32_t>(u) | s);
      const uint8_t got = FloatToE4m3(f), want = ref::RefFloatToE4m3(f);
      if (got != want && bad++ < 5) {
        ADD_FAILURE() << "FloatToE4m3(" << f << " = 0x" << std::hex << (u | s) << ") = 0x"
                      << int{got} << ", reference 0x" << int{want};
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(E4m3, AllCodesToFloat) {
  for (int c = 0; c < 256; ++c) {
    const float got = E4m3ToFloat(static_cast<uint8_t>(c));
    const double want = ref::RefE4m3Value(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
      EXPECT_EQ(std::signbit(got), c >= 128) << c;  // including -0 for 0x80
    }
  }
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(E4m3ToFloat(0x08), 0.015625f);     // smallest normal 2^-6
}

TEST(E4m3, RoundTripOfEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(c))), c);
    EXPECT_EQ(ref::RefFloatToE4m3(static_cast<float>(ref::RefE4m3Value(static_cast<uint8_t>(c)))), c);
  }
}

TEST(E4m3, SweepSubnormalAndLowNormalRange) {
  // [2^-12, 2^-5]: the subnormal grid, the subnormal/normal boundary 2^-6 and its ties.
  SweepBits(Bits(std::ldexp(1.0f, -12)), Bits(std::ldexp(1.0f, -5)) + 1);
}

TEST(E4m3, SweepTopRange) {
  // [256, 480): the top binade, 448, the tie at 464 and the values that round to NaN.
  SweepBits(Bits(256.0f), Bits(480.0f));
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(-464.0f), 0xfe);
  EXPECT_EQ(FloatToE4m3(FromBits(Bits(464.0f) + 1)), 0x7f);
  EXPECT_EQ(FloatToE4m3(480.0f), 0x7f);
  EXPECT_EQ(FloatToE4m3(1e30f), 0x7f);
}

TEST(E4m3, StrideThroughAllFloats) {
  // Every finite fp32 class (subnormals, tiny, normal, huge) plus +-inf and NaNs at the end.
  SweepBits(0, 0x7f800000u, 997);
  SweepBits(0x7f800000u, 0x80000000u, 4099);
  SweepBits(0, 1u << 16);  // the fp32 subnormals nearest zero
}

TEST(TwinExponent, MatchesFrexpReference) {
  std::vector<float> amax;
  for (int e = -140; e <= 130; ++e) {
    for (float m : {1.0f, 1.0000001f, 0.9999999f, 1.5f, 448.0f, 447.99997f, 448.00003f}) {
      const float v = std::ldexp(m, e);
      if (std::isfinite(v) && v >= std::ldexp(1.0f, -126)) amax.push_back(v);
    }
  }
  for (uint32_t u = 0x00800000u; u < 0x7f800000u; u += 65537) amax.push_back(FromBits(u));
  for (float a : amax) EXPECT_EQ(TwinBlockExponent(a), ref::RefTwinExponent(a)) << a;
  EXPECT_EQ(ref::RefTwinExponent(448.0f), 0);
  EXPECT_EQ(ref::RefTwinExponent(449.0f), 1);
  EXPECT_EQ(ref::RefTwinExponent(std::ldexp(1.0f, -126)), -127);  // clamp
}

// MakeTwin (and, band by band, MakeTwinBand) bit-exact against ReferenceTwin.
void ExpectTwinMatches(const std::vector<uint16_t>& w, int64_t n, int64_t k, const std::string& what,
                       int threads = 2) {
  ASSERT_EQ(static_cast<int64_t>(w.size()), n * k);
  cpu::ThreadPool pool(threads);
  const int64_t eb = cpu::TwinExpRows(n), kb = k / 32;
  std::vector<uint8_t> codes(n * k, 0xaa), exps(eb * kb, 0xaa);
  cpu::MakeTwin(w.data(), n, k, codes.data(), exps.data(), pool);
  const ref::RefTwin t = ref::ReferenceTwin(w.data(), n, k);
  int bad = 0;
  for (int64_t i = 0; i < eb * kb && bad < 5; ++i) {
    if (exps[i] != t.exps[i]) {
      ++bad;
      ADD_FAILURE() << what << ": exp[" << i / kb << "][" << i % kb << "] = " << int{exps[i]}
                    << ", reference " << int{t.exps[i]};
    }
  }
  for (int64_t i = 0; i < n * k && bad < 10; ++i) {
    if (codes[i] != t.codes[i]) {
      ++bad;
      ADD_FAILURE() << what << ": code[" << i / k << "][" << i % k << "] = 0x" << std::hex
                    << int{codes[i]} << ", reference 0x" << int{t.codes[i]} << std::dec
                    << " (w = " << Bf16ToFloat(w[i]) << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(MakeTwin, RandomGaussian) {
  for (double sd : {1.0, 0.02, 1e-3, 37.0}) {
    ExpectTwinMatches(ref::RandomBf16(64 * 256, 11, sd), 64, 256, "gaussian sd " + std::to_string(sd));
  }
}

TEST(MakeTwin, RandomBitPatternsWideRange) {
  // Blocks mixing magnitudes 2^-40..2^20: many codes round to subnormals or to zero.
  ExpectTwinMatches(ref::RandomBf16Bits(96 * 128, 5, -40, 20), 96, 128, "wide range");
  ExpectTwinMatches(ref::RandomBf16Bits(64 * 64, 6, -3, 0), 64, 64, "narrow range");
}

TEST(MakeTwin, Zeros) {
  std::vector<uint16_t> w(32 * 64, 0);
  ExpectTwinMatches(w, 32, 64, "zeros");
  const ref::RefTwin t = ref::ReferenceTwin(w.data(), 32, 64);
  EXPECT_EQ(t.exps[0], 0);  // amax clamped to 2^-126 -> e = -127
  EXPECT_EQ(t.codes[0], 0);
}

TEST(MakeTwin, NegativeZero) {
  std::vector<uint16_t> w(32 * 64, 0x8000);
  w[5] = Bf(1.0f);  // one block with a real amax, its -0s still -0
  ExpectTwinMatches(w, 32, 64, "negative zero");
  const ref::RefTwin t = ref::ReferenceTwin(w.data(), 32, 64);
  EXPECT_EQ(t.codes[0], 0x80);
  EXPECT_EQ(t.codes[40], 0x80);
}

TEST(MakeTwin, AllEqualBlocks) {
  for (float v : {0.7f, -0.7f, 1.0f, 3.0e-5f, -1234.5f, 448.0f}) {
    ExpectTwinMatches(std::vector<uint16_t>(32 * 96, Bf(v)), 32, 96, "all " + std::to_string(v));
  }
}

TEST(MakeTwin, AmaxExactly448TimesPowerOfTwo) {
  // amax = 448 * 2^e gives r = 2^e exactly (the frexp m == 0.5 case); that value maps to 0x7e.
  const int64_t n = 32, k = 32 * 41;
  std::vector<uint16_t> w = ref::RandomBf16(n * k, 3, 0.01);
  for (int b = 0; b < 41; ++b) {
    const float a = std::ldexp(448.0f, b - 20);
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 32; ++c) w[r * k + b * 32 + c] = Bf(a * 0.001f * ((r * 7 + c) % 50));
    w[(b % 32) * k + b * 32 + 3] = Bf((b % 2) ? -a : a);
  }
  ExpectTwinMatches(w, n, k, "448 * 2^e");
  const ref::RefTwin t = ref::ReferenceTwin(w.data(), n, k);
  for (int b = 0; b < 41; ++b) EXPECT_EQ(t.exps[b], 127 + b - 20) << b;
}

TEST(MakeTwin, SubnormalCodesAndTies) {
  // amax 448 (e = 0): block values are their own e4m3 arguments. Include every subnormal value,
  // the midpoints between them (ties to even), the subnormal/normal boundary and normal ties.
  const int64_t n = 32, k = 64;
  std::vector<uint16_t> w(n * k, 0);
  w[0] = Bf(448.0f);
  int i = 1;
  for (int j = 0; j <= 40; ++j) {
    w[i++] = Bf(std::ldexp(static_cast<float>(j), -10));   // multiples of half the 2^-9 grid
    w[i++] = Bf(-std::ldexp(static_cast<float>(j), -10));
  }
  for (float v : {1.0625f, 1.1875f, 2.125f, 0.0146484375f, 0.015625f, 0.0166015625f, 240.0f,
                  248.0f, 232.0f, 3e-6f, 1.5e-3f}) {
    w[i++] = Bf(v);
    w[i++] = Bf(-v);
  }
  ExpectTwinMatches(w, n, k, "subnormals and ties");
}

TEST(MakeTwin, TinyAmaxBf16Subnormals) {
  // amax < 2^-126: the clamp sets e = -127 and the values scale up by 2^127 exactly.
  const int64_t n = 32, k = 64;
  std::vector<uint16_t> w(n * k, 0);
  for (int64_t j = 0; j < n * k; ++j) w[j] = static_cast<uint16_t>((j * 37) % 0x80) | ((j & 1) << 15);
  ExpectTwinMatches(w, n, k, "bf16 subnormals");
  // Just above the clamp: normal but tiny.
  for (int64_t j = 0; j < n * k; ++j) w[j] = static_cast<uint16_t>(0x0080 + (j * 13) % 0x300);
  ExpectTwinMatches(w, n, k, "tiny normals");
}

TEST(MakeTwin, HugeValues) {
  const int64_t n = 32, k = 64;
  std::vector<uint16_t> w = ref::RandomBf16Bits(n * k, 9, 100, 127);
  w[3] = 0x7f7f;   // bf16 max
  w[70] = 0xff7f;  // -max
  ExpectTwinMatches(w, n, k, "huge");
  // A huge block next to ordinary and tiny ones in the same band.
  std::vector<uint16_t> mix = ref::RandomBf16Bits(n * k, 10, -130, 127);
  ExpectTwinMatches(mix, n, k, "mixed huge/tiny");
}

TEST(MakeTwin, PaddedLastBlock) {
  for (int64_t n : {1, 31, 33, 100}) {
    ExpectTwinMatches(ref::RandomBf16(n * 96, 20 + n, 0.05), n, 96, "n=" + std::to_string(n));
  }
  // The padding rows must count as zeros, not as the next rows' data: a band whose real rows are
  // tiny next to nothing else.
  std::vector<uint16_t> w(33 * 32, Bf(1e-3f));
  ExpectTwinMatches(w, 33, 32, "n=33 tiny last row");
}

TEST(MakeTwin, ShapesK32AndK5120) {
  ExpectTwinMatches(ref::RandomBf16(64 * 32, 30, 0.02), 64, 32, "k=32");
  ExpectTwinMatches(ref::RandomBf16(70 * 5120, 31, 0.02), 70, 5120, "k=5120", 3);
  ExpectTwinMatches(ref::RandomBf16(40 * 5120, 32, 0.02), 40, 5120, "k=5120, 1 thread", 1);
}

TEST(MakeTwin, DequantizedValuesAreExactInBf16) {
  // SPEC: every dequantized value is exact in bf16.
  const auto w = ref::RandomBf16Bits(64 * 128, 40, -30, 30);
  const ref::RefTwin t = ref::ReferenceTwin(w.data(), 64, 128);
  for (int64_t i = 0; i < 64 * 128; ++i) {
    const double d = ref::RefDequant(t.codes[i], t.exps[(i / 128 / 32) * 4 + (i % 128) / 32]);
    const float f = static_cast<float>(d);
    ASSERT_EQ(static_cast<double>(f), d) << i;
    ASSERT_EQ(Bf16ToFloat(FloatToBf16(f)), f) << i;
  }
}

}  // namespace
}  // namespace drafthead
