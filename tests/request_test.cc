// Request validation: every malformed field is refused with INVALID_ARGUMENT naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/numeric.h"
#include "server/request/hidden_decode.h"
#include "server/request/request.h"

namespace drafthead {
namespace {

ServingLimits Limits() {
  ServingLimits l;
  l.hidden = 64;
  l.vocab_size = 1000;
  l.max_rows = 8;
  l.max_top_k = 16;
  l.has_bf16 = false;
  return l;
}

v1::LogitsRequest Valid(int rows = 2) {
  v1::LogitsRequest r;
  r.set_rows(rows);
  r.set_hidden(std::string(rows * 64 * 2, '\0'));
  return r;
}

void ExpectBad(const v1::LogitsRequest& r, const std::string& field) {
  auto p = PrepareRequest(r, Limits());
  ASSERT_FALSE(p.ok()) << "accepted a bad " << field;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message().substr(0, field.size() + 1), field + ":") << p.status();
}

TEST(RequestTest, AcceptsValidRequests) {
  auto p = PrepareRequest(Valid(), Limits());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rows, 2u);
  EXPECT_EQ(p->x.size(), 128u);
  EXPECT_EQ(p->task.mode, RowMode::kFullLogits);
  EXPECT_EQ(p->task.dtype, OutDType::kBf16);
}

TEST(RequestTest, Fp32HiddenIsRoundedToBf16) {
  v1::LogitsRequest r = Valid(1);
  r.set_hidden_dtype(v1::FP32);
  std::vector<float> x(64, 0.f);
  x[0] = 1.0f + 1.0f / 256;  // halfway between two bf16 values: rounds to even (1.0)
  x[1] = 3.0f;
  r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), 256));
  auto p = PrepareRequest(r, Limits());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->x[0], 0x3f80);
  EXPECT_EQ(p->x[1], 0x4040);
}

// The hidden rows are checked in blocks of 64 values: a bad value anywhere (first, inside, across
// a block edge, in a short tail block) is found and named by row and column, in both dtypes; the
// fp32 -> bf16 rounding matches FloatToBf16 value for value.
TEST(RequestTest, NamesABadHiddenValueAnywhere) {
  const int rows = 3;  // 3 x 64 = 192 values: three whole blocks; with K = 40 below, a tail
  for (int hidden : {64, 40}) {
    ServingLimits l = Limits();
    l.hidden = hidden;
    const size_t n = static_cast<size_t>(rows) * hidden;
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = std::ldexp(static_cast<float>(i % 13) - 6.3f, static_cast<int>(i % 9) - 4);
    for (size_t bad : {size_t{0}, size_t{63}, size_t{64}, size_t{65}, n - 1, n / 2}) {
      for (float v : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
        const std::string expect = "hidden: non-finite value at row " + std::to_string(bad / hidden) +
                                   ", column " + std::to_string(bad % hidden);
        std::vector<float> g = f;
        g[bad] = v;
        v1::LogitsRequest r;
        r.set_rows(rows);
        r.set_hidden_dtype(v1::FP32);
        r.set_hidden(std::string(reinterpret_cast<const char*>(g.data()), n * 4));
        auto p = PrepareRequest(r, l);
        ASSERT_FALSE(p.ok()) << "fp32, bad at " << bad;
        EXPECT_EQ(p.status().message(), expect);
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; ++i) h[i] = FloatToBf16(g[i]);
        r.set_hidden_dtype(v1::BF16);
        r.set_hidden(std::string(reinterpret_cast<const char*>(h.data()), n * 2));
        p = PrepareRequest(r, l);
        ASSERT_FALSE(p.ok()) << "bf16, bad at " << bad;
        EXPECT_EQ(p.status().message(), expect);
      }
    }
    // Finite everywhere: accepted, rounded exactly as FloatToBf16 rounds (ties to even included).
    f[5] = 1.0f + 1.0f / 256;
    f[70] = -(1.0f + 3.0f / 256);
    v1::LogitsRequest r;
    r.set_rows(rows);
    r.set_hidden_dtype(v1::FP32);
    r.set_hidden(std::string(reinterpret_cast<const char*>(f.data()), n * 4));
    auto p = PrepareRequest(r, l);
    ASSERT_TRUE(p.ok()) << p.status();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p->x[i], FloatToBf16(f[i])) << i;
    // A finite fp32 value that rounds to a bf16 infinity is refused, named.
    f[66] = std::numeric_limits<float>::max();
    r.set_hidden(std::string(reinterpret_cast<const char*>(f.data()), n * 4));
    p = PrepareRequest(r, l);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("row " + std::to_string(66 / hidden) + ", column " +
                                        std::to_string(66 % hidden) + " is beyond bf16's range"),
              std::string::npos)
        << p.status();
  }
}

// Runs a portable decoder and its vector twin on the same n values: the same first bad index
// (`want`), the same bad bits, the same values before it, nothing written past n. *out: the
// portable decoder's values before the bad one.
template <typename Bits>
void ExpectSameDecode(size_t (*portable)(const char*, size_t, uint16_t*, Bits*),
                      size_t (*vector)(const char*, size_t, uint16_t*, Bits*), const char* src, size_t n,
                      size_t want, const char* what, std::vector<uint16_t>* out) {
  std::vector<uint16_t> a(n + 1, 0xabcd), b(n + 1, 0xabcd);
  Bits ba = 0, bb = 0;
  const size_t ia = portable(src, n, a.data(), &ba);
  const size_t ib = vector(src, n, b.data(), &bb);
  ASSERT_EQ(ia, want) << what << ", n " << n;
  ASSERT_EQ(ib, ia) << what << ", n " << n << ", bad at " << want;
  if (ia < n) {
    EXPECT_EQ(bb, ba) << what;
  }
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + ia, b.begin())) << what << ", n " << n;
  EXPECT_EQ(b[n], 0xabcd) << what << ": wrote past the end";
  out->assign(a.begin(), a.begin() + ia);
}

// The vector decoders (AVX-512, AVX2) against the portable reference, bit for bit: every length
// around the vector widths, random bits with every finite exponent (subnormals, values that round
// up into a new binade), NaN, Inf and a value that rounds to a bf16 infinity at several positions,
// the first bad value's index and bits, and the values before it.
using Fp32Decoder = size_t (*)(const char*, size_t, uint16_t*, uint32_t*);
using Bf16Decoder = size_t (*)(const char*, size_t, uint16_t*, uint16_t*);

void ExpectVectorDecodeEqualsThePortableOne(Fp32Decoder fp32, Bf16Decoder bf16) {
  std::mt19937 g(7);
  for (size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 1000, 5120 * 5}) {
    for (int bad_at : {-1, 0, 1, 16, 31, 47, 63, 64, 127, 999}) {
      if (bad_at >= static_cast<int>(n)) continue;
      const size_t want = bad_at < 0 ? n : static_cast<size_t>(bad_at);
      // Biased exponents 0..253: finite, and none rounds to a bf16 infinity.
      std::vector<uint32_t> f(n);
      for (auto& v : f) v = (g() & 0x807fffffu) | ((g() % 254) << 23);
      if (bad_at >= 0) f[bad_at] = (g() % 3 == 0) ? 0x7fc00001u : (g() % 2 ? 0xff800000u : 0x7f7fffffu);
      std::vector<uint16_t> got;
      ExpectSameDecode(&hidden::Fp32ToBf16Portable, fp32, reinterpret_cast<const char*>(f.data()), n, want, "fp32",
                       &got);
      if (::testing::Test::HasFatalFailure()) return;
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], FloatToBf16(BitsFloat(f[i]))) << i;

      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = static_cast<uint16_t>(f[i] >> 16);
      if (bad_at >= 0) h[bad_at] = (g() % 2) ? 0x7fc1 : 0xff80;
      ExpectSameDecode(&hidden::CopyBf16Portable, bf16, reinterpret_cast<const char*>(h.data()), n, want, "bf16",
                       &got);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(RequestTest, Avx512HiddenDecodeEqualsThePortableOne) {
  if (!hidden::CpuHasAvx512Bw()) GTEST_SKIP() << "no AVX-512 F+BW on this CPU";
  ExpectVectorDecodeEqualsThePortableOne(&hidden::Fp32ToBf16Avx512, &hidden::CopyBf16Avx512);
}

TEST(RequestTest, Avx2HiddenDecodeEqualsThePortableOne) {
  if (!hidden::CpuHasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  ExpectVectorDecodeEqualsThePortableOne(&hidden::Fp32ToBf16Avx2, &hidden::CopyBf16Avx2);
}

TEST(RequestTest, RefusesEachBadField) {
  auto r = Valid();
  r.set_rows(0);
  ExpectBad(r, "rows");
  r = Valid(9);
  ExpectBad(r, "rows");
  r = Valid();
  r.set_hidden(std::string(10, '\0'));
  ExpectBad(r, "hidden");
  r = Valid();
  r.set_hidden_dtype(v1::FP32);  // bytes now half of what fp32 needs
  ExpectBad(r, "hidden");
  r = Valid();
  r.set_hidden_dtype(static_cast<v1::DType>(5));
  ExpectBad(r, "hidden_dtype");
  r = Valid();
  r.set_mode(static_cast<v1::Mode>(9));
  ExpectBad(r, "mode");
  r = Valid();
  r.set_logits_dtype(static_cast<v1::DType>(3));
  ExpectBad(r, "logits_dtype");
  r = Valid();
  r.set_head(static_cast<v1::Head>(4));
  ExpectBad(r, "head");
  r = Valid();
  r.set_head(v1::BF16_EXACT);
  ExpectBad(r, "head");
  r = Valid();
  r.set_mode(v1::TOP_K);
  r.set_top_k(0);
  ExpectBad(r, "top_k");
  r.set_top_k(17);
  ExpectBad(r, "top_k");
  r = Valid();
  r.set_mode(v1::SAMPLE);
  r.set_temperature(0);
  ExpectBad(r, "temperature");
  r.set_temperature(-1);
  ExpectBad(r, "temperature");
  r.set_temperature(std::numeric_limits<float>::quiet_NaN());
  ExpectBad(r, "temperature");
  r = Valid();
  r.set_mode(v1::TOP_K);
  r.set_top_k(3);
  r.set_temperature(std::numeric_limits<float>::infinity());
  ExpectBad(r, "temperature");
  r = Valid(1);
  std::string h(128, '\0');
  h[10] = '\x80';
  h[11] = '\x7f';  // bf16 0x7f80 = +inf
  r.set_hidden(h);
  ExpectBad(r, "hidden");
}

TEST(RequestTest, TopKTemperatureZeroMeansOne) {
  auto r = Valid();
  r.set_mode(v1::TOP_K);
  r.set_top_k(4);
  r.set_return_probs(true);
  auto p = PrepareRequest(r, Limits());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->task.temperature, 1.0f);
  EXPECT_EQ(p->task.k, 4u);
  EXPECT_EQ(p->task.want_probs, 1);
}

TEST(RequestTest, TopKIsBoundedByTheVocabulary) {
  ServingLimits l = Limits();
  l.vocab_size = 5;
  auto r = Valid();
  r.set_mode(v1::TOP_K);
  r.set_top_k(6);
  EXPECT_FALSE(PrepareRequest(r, l).ok());
  r.set_top_k(5);
  EXPECT_TRUE(PrepareRequest(r, l).ok());
}

}  // namespace
}  // namespace drafthead
