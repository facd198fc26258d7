// HeadGemvFp8 / HeadGemvBf16 (every ISA path here) against float64 dot products of bf16 x and the
// exactly dequantized weights (tests/reference.cc). Tolerance per output: 1e-5 * sum_k |x w|
// plus a tiny absolute floor. Outputs are poisoned with NaN before every call, and the columns
// past n in a padded ldy must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/head_gemv.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/numeric.h"
#include "reference.h"

namespace drafthead {
namespace {

using cpu::GemvIsa;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<GemvIsa> Isas() {
  std::vector<GemvIsa> v = {GemvIsa::kScalar};
  if (cpu::GemvIsaAvailable(GemvIsa::kAvx2)) v.push_back(GemvIsa::kAvx2);
  if (cpu::GemvIsaAvailable(GemvIsa::kAvx512Bf16)) v.push_back(GemvIsa::kAvx512Bf16);
  return v;
}

const char* Name(GemvIsa isa) { return cpu::GemvIsaName(isa); }

struct Twin {
  int64_t n, k;
  std::vector<uint8_t> codes, exps;
};

// Random valid codes and exponents around the range of real LM heads.
Twin RandomTwin(int64_t n, int64_t k, uint64_t seed, int exp_lo = 112, int exp_hi = 124) {
  return {n, k, ref::RandomTwinCodes(n * k, seed),
          ref::RandomTwinExps(cpu::TwinExpRows(n) * (k / 32), seed + 1, exp_lo, exp_hi)};
}

// Compares y [m, ldy] (columns cols[j] of the GEMV) with the reference; columns [n, ldy) must
// still be NaN.
void ExpectClose(const std::vector<float>& y, int m, int64_t n, int64_t ldy,
                 const std::vector<int64_t>* cols, const ref::RefGemv& r, const std::string& what) {
  int bad = 0;
  for (int i = 0; i < m; ++i) {
    for (int64_t jj = 0; jj < r.n; ++jj) {
      const int64_t j = cols ? (*cols)[jj] : jj;
      const float got = y[i * ldy + j];
      const double want = r.at(i, jj), tol = r.Tolerance(i, jj, 1e-5, 1e-35);
      if (!(std::fabs(got - want) <= tol) && bad++ < 5) {
        ADD_FAILURE() << what << ": y[" << i << "][" << j << "] = " << got << ", reference "
                      << want << " (tol " << tol << ")";
      }
    }
    for (int64_t j = n; j < ldy; ++j) {
      if (!std::isnan(y[i * ldy + j]) && bad++ < 5)
        ADD_FAILURE() << what << ": wrote past n at [" << i << "][" << j << "]";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

void CheckFp8(GemvIsa isa, const Twin& t, int m, cpu::ThreadPool& pool, uint64_t seed,
              int64_t ldy_pad = 0, const std::vector<int64_t>* cols = nullptr,
              double x_scale = 1.0) {
  const int64_t n = t.n, k = t.k, ldy = n + ldy_pad;
  std::vector<uint16_t> x = ref::RandomBf16(static_cast<size_t>(m) * k, seed, x_scale);
  std::vector<float> y(static_cast<size_t>(m) * ldy, kNaN);
  cpu::HeadGemvFp8With(isa, x.data(), m, k, t.codes.data(), t.exps.data(), n, y.data(), ldy, pool);
  const ref::RefGemv r = cols ? ref::ReferenceGemvFp8Cols(x.data(), m, k, t.codes.data(),
                                                          t.exps.data(), *cols)
                              : ref::ReferenceGemvFp8(x.data(), m, k, t.codes.data(),
                                                      t.exps.data(), n);
  ExpectClose(y, m, n, ldy, cols, r,
              std::string("fp8 ") + Name(isa) + " m=" + std::to_string(m) + " n=" +
                  std::to_string(n) + " k=" + std::to_string(k));
}

void CheckBf16(GemvIsa isa, const std::vector<uint16_t>& w, int64_t n, int64_t k, int m,
               cpu::ThreadPool& pool, uint64_t seed, int64_t ldy_pad = 0,
               const std::vector<int64_t>* cols = nullptr) {
  const int64_t ldy = n + ldy_pad;
  std::vector<uint16_t> x = ref::RandomBf16(static_cast<size_t>(m) * k, seed);
  std::vector<float> y(static_cast<size_t>(m) * ldy, kNaN);
  cpu::HeadGemvBf16With(isa, x.data(), m, k, w.data(), n, y.data(), ldy, pool);
  const ref::RefGemv r = cols ? ref::ReferenceGemvBf16Cols(x.data(), m, k, w.data(), *cols)
                              : ref::ReferenceGemvBf16(x.data(), m, k, w.data(), n);
  ExpectClose(y, m, n, ldy, cols, r,
              std::string("bf16 ") + Name(isa) + " m=" + std::to_string(m) + " n=" +
                  std::to_string(n) + " k=" + std::to_string(k));
}

std::vector<int> AllM() {
  std::vector<int> ms;
  for (int m = 1; m <= 64; ++m) ms.push_back(m);
  for (int m : {65, 100, 256}) ms.push_back(m);
  return ms;
}

TEST(HeadGemv, Dispatch) {
  const std::string isa = cpu::HeadGemvIsa();
  EXPECT_TRUE(isa == "avx512bf16" || isa == "avx2" || isa == "scalar");
  const bool avx512 = cpu::GemvIsaAvailable(GemvIsa::kAvx512Bf16);
  EXPECT_EQ(isa == "avx512bf16", avx512);
  EXPECT_EQ(isa == "avx2", !avx512 && cpu::GemvIsaAvailable(GemvIsa::kAvx2));
  EXPECT_TRUE(cpu::GemvIsaAvailable(GemvIsa::kScalar));
  for (GemvIsa i : {GemvIsa::kAuto, GemvIsa::kScalar, GemvIsa::kAvx2, GemvIsa::kAvx512Bf16}) {
    GemvIsa back = GemvIsa::kScalar;
    EXPECT_TRUE(cpu::ParseGemvIsa(cpu::GemvIsaName(i), &back));
    EXPECT_EQ(back, i);
  }
  GemvIsa unused;
  EXPECT_FALSE(cpu::ParseGemvIsa("avx512", &unused));
}

TEST(HeadGemvFp8, SmallKEveryM) {
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    for (int64_t n : {1, 31, 33, 1000}) {
      const Twin t = RandomTwin(n, 64, 100 + n);
      for (int m : AllM()) CheckFp8(isa, t, m, pool, 7 * m + n, m % 3 == 0 ? 5 : 0);
    }
  }
}

TEST(HeadGemvFp8, RealKEveryM) {
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    for (int64_t n : {33, 100}) {
      const Twin t = RandomTwin(n, 5120, 200 + n);
      for (int m = 1; m <= 64; ++m) CheckFp8(isa, t, m, pool, 11 * m + n);
    }
    const Twin t = RandomTwin(31, 5120, 250);
    for (int m : {100, 256}) CheckFp8(isa, t, m, pool, m, 3);
  }
}

TEST(HeadGemvFp8, OddK) {
  // K not a multiple of the AVX2 kernel's column chunk, and K = 32.
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    for (int64_t k : {32, 96, 1056, 2080}) {
      const Twin t = RandomTwin(70, k, 300 + k);
      for (int m : {1, 2, 5, 9, 13, 33}) CheckFp8(isa, t, m, pool, m + k);
    }
  }
}

TEST(HeadGemvFp8, TwinOfGaussianWeights) {
  // A twin as the server builds it (MakeTwin of bf16 weights), not just random codes.
  cpu::ThreadPool pool(2);
  const int64_t n = 200, k = 5120;
  const auto w = ref::RandomBf16(n * k, 400, 0.02);
  Twin t{n, k, std::vector<uint8_t>(n * k), std::vector<uint8_t>(cpu::TwinExpRows(n) * (k / 32))};
  cpu::MakeTwin(w.data(), n, k, t.codes.data(), t.exps.data(), pool);
  for (GemvIsa isa : Isas())
    for (int m : {1, 5, 16, 64}) CheckFp8(isa, t, m, pool, 500 + m);
}

TEST(HeadGemvFp8, EveryCodeDecodesExactly) {
  // Row r of the twin holds code r once (at a column that walks through every position of a
  // 64-column group) and zeros elsewhere; x row i is 2^i everywhere. Each output is then one exact
  // product, code value * 2^(block exponent - 127) * 2^i, so a wrong decode of any of the 254
  // valid codes (the two NaN codes are left zero) is an exact mismatch, not hidden in a tolerance.
  const int64_t n = 256, k = 128;
  Twin t{n, k, std::vector<uint8_t>(n * k, 0), std::vector<uint8_t>(cpu::TwinExpRows(n) * (k / 32))};
  auto col = [&](int64_t r) { return (r * 37) % k; };
  for (int64_t r = 0; r < n; ++r)
    if ((r & 0x7f) != 0x7f) t.codes[r * k + col(r)] = static_cast<uint8_t>(r);
  for (size_t b = 0; b < t.exps.size(); ++b) t.exps[b] = static_cast<uint8_t>(118 + b % 13);
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    for (int m : {1, 5, 9}) {  // 9: two x-row groups (the AVX-512 path decodes once per band)
      std::vector<uint16_t> x(static_cast<size_t>(m) * k);
      for (int i = 0; i < m; ++i)
        std::fill(x.begin() + i * k, x.begin() + (i + 1) * k, FloatToBf16(std::ldexp(1.0f, i)));
      std::vector<float> y(static_cast<size_t>(m) * n, kNaN);
      cpu::HeadGemvFp8With(isa, x.data(), m, k, t.codes.data(), t.exps.data(), n, y.data(), n,
                           pool);
      int bad = 0;
      for (int i = 0; i < m; ++i) {
        for (int64_t r = 0; r < n; ++r) {
          const uint8_t code = t.codes[r * k + col(r)];
          const int e = t.exps[(r / 32) * (k / 32) + col(r) / 32];
          const float want = std::ldexp(E4m3ToFloat(code), e - 127 + i);
          if (y[i * n + r] != want && bad++ < 5)
            ADD_FAILURE() << Name(isa) << " m=" << m << " code 0x" << std::hex << int{code}
                          << std::dec << " row " << i << ": " << y[i * n + r] << ", want " << want;
        }
      }
      EXPECT_EQ(bad, 0) << Name(isa) << " m=" << m;
    }
  }
}

TEST(HeadGemvFp8, ExtremeExponents) {
  // Bands with exponents at both ends (including > 246, which the AVX2 kernel hands to the
  // scalar path) and x scaled so the products stay inside fp32.
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    // Up to exp 247 (e = 120, the largest a twin of finite bf16 can have), with magnitudes
    // <= 240 so every dequantized weight is a finite fp32 (as in a real twin).
    Twin hi = RandomTwin(96, 64, 600, 238, 247);
    for (auto& c : hi.codes) c = (c & 0x80) | std::min<uint8_t>(c & 0x7f, 0x77);
    for (int m : {1, 4, 13}) CheckFp8(isa, hi, m, pool, 601 + m, 0, nullptr, std::ldexp(1.0, -110));
    const Twin lo = RandomTwin(96, 64, 610, 0, 20);
    for (int m : {1, 4, 13}) CheckFp8(isa, lo, m, pool, 611 + m, 0, nullptr, std::ldexp(1.0, 60));
  }
}

TEST(HeadGemvFp8, RealShard) {
  // N = 32320, K = 5120 (165 MB of codes); the reference on a sample of columns, every band
  // boundary kind included (first, last, multiples of 32 and neighbours).
  const int64_t n = 32320, k = 5120;
  const Twin t = RandomTwin(n, k, 700);
  std::vector<int64_t> cols;
  for (int64_t j = 0; j < n; j += 97) cols.push_back(j);
  for (int64_t j : {31, 32, 33, 16159, 16160, 32287, 32288, 32318, 32319}) cols.push_back(j);
  cpu::ThreadPool pool(0);
  for (GemvIsa isa : Isas()) {
    for (int m : {1, 5, 64}) {
      if (isa == GemvIsa::kScalar && m == 64) continue;  // minutes in scalar code; covered above
      CheckFp8(isa, t, m, pool, 800 + m, 0, &cols);
    }
  }
}

TEST(HeadGemvBf16, EveryMAndShape) {
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    for (int64_t n : {1, 31, 33, 1000}) {
      const auto w = ref::RandomBf16(n * 64, 900 + n, 0.5);
      for (int m : AllM()) CheckBf16(isa, w, n, 64, m, pool, 3 * m + n, m % 4 == 1 ? 3 : 0);
    }
    for (int64_t n : {33, 100}) {
      const auto w = ref::RandomBf16(n * 5120, 950 + n, 0.02);
      for (int m = 1; m <= 64; ++m) CheckBf16(isa, w, n, 5120, m, pool, 5 * m + n);
    }
  }
}

TEST(HeadGemvBf16, RealShard) {
  const int64_t n = 32320, k = 5120;
  const auto w = ref::RandomBf16Bits(n * k, 1000, -9, -4);
  std::vector<int64_t> cols;
  for (int64_t j = 0; j < n; j += 131) cols.push_back(j);
  cols.push_back(n - 1);
  cpu::ThreadPool pool(0);
  for (GemvIsa isa : Isas()) {
    for (int m : {1, 5, 64}) {
      if (isa == GemvIsa::kScalar && m == 64) continue;
      CheckBf16(isa, w, n, k, m, pool, 1100 + m, 0, &cols);
    }
  }
}

TEST(HeadGemv, SameResultForAnyThreadCount) {
  // Each output is computed by one thread with a fixed blocking: bit-identical across pools.
  const Twin t = RandomTwin(1000, 1024, 1200);
  const auto x = ref::RandomBf16(17 * 1024, 1201);
  for (GemvIsa isa : Isas()) {
    std::vector<float> a(17 * 1000, kNaN), b(17 * 1000, kNaN);
    cpu::ThreadPool p1(1), p3(3);
    cpu::HeadGemvFp8With(isa, x.data(), 17, 1024, t.codes.data(), t.exps.data(), 1000, a.data(),
                         1000, p1);
    cpu::HeadGemvFp8With(isa, x.data(), 17, 1024, t.codes.data(), t.exps.data(), 1000, b.data(),
                         1000, p3);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << Name(isa);
  }
}

TEST(HeadGemv, ARowsResultDoesNotDependOnItsBatch) {
  // The server batches requests: each x row's output must be bit-identical whatever M it came in
  // with (tile shapes, x-row groups and column chunks differ with M). K = 5120 so that chunking
  // differs too; every row of M = 19 (3 groups on AVX-512) against the same row alone and inside
  // M = 5.
  const int64_t n = 70, k = 5120;
  const Twin t = RandomTwin(n, k, 1250);
  const int m = 19;
  const auto x = ref::RandomBf16(static_cast<size_t>(m) * k, 1251);
  cpu::ThreadPool pool(2);
  for (GemvIsa isa : Isas()) {
    std::vector<float> all(m * n, kNaN);
    cpu::HeadGemvFp8With(isa, x.data(), m, k, t.codes.data(), t.exps.data(), n, all.data(), n,
                         pool);
    for (int i = 0; i < m; ++i) {
      std::vector<float> one(n, kNaN), five(5 * n, kNaN);
      cpu::HeadGemvFp8With(isa, x.data() + i * k, 1, k, t.codes.data(), t.exps.data(), n,
                           one.data(), n, pool);
      const int i0 = std::min(i, m - 5);  // five rows holding row i at position i - i0
      cpu::HeadGemvFp8With(isa, x.data() + i0 * k, 5, k, t.codes.data(), t.exps.data(), n,
                           five.data(), n, pool);
      EXPECT_EQ(std::memcmp(one.data(), &all[i * n], n * 4), 0) << Name(isa) << " row " << i;
      EXPECT_EQ(std::memcmp(one.data(), &five[(i - i0) * n], n * 4), 0) << Name(isa) << " row " << i;
    }
  }
}

// HeadGemv* (kAuto) run the path HeadGemvIsa names (the widest this CPU has: Dispatch).
TEST(HeadGemv, AutoMatchesTheChosenIsa) {
  const Twin t = RandomTwin(100, 256, 1300);
  const auto w = ref::RandomBf16(100 * 256, 1302, 0.05);
  const auto x = ref::RandomBf16(5 * 256, 1301);
  GemvIsa chosen = GemvIsa::kScalar;
  ASSERT_TRUE(cpu::ParseGemvIsa(cpu::HeadGemvIsa(), &chosen));
  cpu::ThreadPool pool(2);
  std::vector<float> a(500, kNaN), b(500, kNaN);
  cpu::HeadGemvFp8(x.data(), 5, 256, t.codes.data(), t.exps.data(), 100, a.data(), 100, pool);
  cpu::HeadGemvFp8With(chosen, x.data(), 5, 256, t.codes.data(), t.exps.data(), 100, b.data(), 100,
                       pool);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  std::vector<float> c(500, kNaN), d(500, kNaN);
  cpu::HeadGemvBf16(x.data(), 5, 256, w.data(), 100, c.data(), 100, pool);
  cpu::HeadGemvBf16With(chosen, x.data(), 5, 256, w.data(), 100, d.data(), 100, pool);
  EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * 4), 0);
}

// The AVX-512 BF16 path against the AVX2 path: bit-identical where it hands the work to the AVX2
// kernel (a band with an exponent outside [10, 246]; x with a subnormal or Inf), within the fp32
// accumulation bound of each other elsewhere (same exact products, another summation order).
TEST(HeadGemvFp8, Avx512MatchesAvx2) {
  if (!cpu::GemvIsaAvailable(GemvIsa::kAvx512Bf16)) GTEST_SKIP() << "no AVX-512 BF16 here";
  const int64_t n = 256, k = 1056;  // 33 exponent blocks: a 64-column group half past k
  Twin t = RandomTwin(n, k, 1500);
  for (int64_t b = 0; b < k / 32; ++b) t.exps[3 * (k / 32) + b] = static_cast<uint8_t>(5 + b % 3);
  cpu::ThreadPool pool(2);
  for (int m : {1, 5, 8, 9, 64}) {
    auto x = ref::RandomBf16(static_cast<size_t>(m) * k, 1501 + m);
    std::vector<float> a(m * n, kNaN), b(m * n, kNaN);
    auto run = [&](GemvIsa isa, std::vector<float>& y) {
      cpu::HeadGemvFp8With(isa, x.data(), m, k, t.codes.data(), t.exps.data(), n, y.data(), n, pool);
    };
    run(GemvIsa::kAvx512Bf16, a);
    run(GemvIsa::kAvx2, b);
    const ref::RefGemv r = ref::ReferenceGemvFp8(x.data(), m, k, t.codes.data(), t.exps.data(), n);
    for (int i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const size_t at = static_cast<size_t>(i) * n + j;
        if (j / 32 == 3) {  // the out-of-range band: AVX2's own result
          ASSERT_EQ(std::memcmp(&a[at], &b[at], 4), 0) << "m=" << m << " j=" << j;
        } else {
          ASSERT_LE(std::fabs(a[at] - b[at]), 2 * r.Tolerance(i, j, 1e-5, 1e-35))
              << "m=" << m << " i=" << i << " j=" << j;
        }
      }
    }
    x[k / 2] = 0x0001;  // a bf16 subnormal in x: the whole call is the AVX2 kernel's
    run(GemvIsa::kAvx512Bf16, a);
    run(GemvIsa::kAvx2, b);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "m=" << m;
  }
}

// The scalar path is reached by the GemvIsa argument alone (the server's --isa=scalar passes it),
// on any CPU: bit for bit the scalar bands run single-threaded.
TEST(HeadGemv, ExplicitScalarIsTheScalarPath) {
  const int m = 3;
  const int64_t n = 100, k = 256, bands = (n + 31) / 32;
  const Twin t = RandomTwin(n, k, 1400);
  const auto w = ref::RandomBf16(n * k, 1402, 0.05);
  const auto x = ref::RandomBf16(m * k, 1401);
  cpu::ThreadPool pool(2);
  std::vector<float> a(m * n, kNaN), b(m * n, kNaN);
  cpu::HeadGemvFp8With(GemvIsa::kScalar, x.data(), m, k, t.codes.data(), t.exps.data(), n,
                       a.data(), n, pool);
  cpu::internal::Fp8BandsScalar(x.data(), m, k, t.codes.data(), t.exps.data(), n, b.data(), n, 0,
                                bands);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "fp8";
  std::fill(a.begin(), a.end(), kNaN);
  std::fill(b.begin(), b.end(), kNaN);
  cpu::HeadGemvBf16With(GemvIsa::kScalar, x.data(), m, k, w.data(), n, a.data(), n, pool);
  cpu::internal::Bf16BandsScalar(x.data(), m, k, w.data(), n, b.data(), n, 0, bands);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "bf16";
}

}  // namespace
}  // namespace drafthead
