// Per-shard reductions and rank 0's merge (kernels/cpu/shard_reduce.cc) against brute force over
// the whole row (tests/reference.cc): TOP_K / ARGMAX / SAMPLE for any tp split must equal the
// full-row answer exactly; softmax probabilities within 1e-5 of float64; SAMPLE frequencies follow
// the softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/candidate.h"
#include "kernels/cpu/shard_reduce.h"
#include "kernels/numeric.h"
#include "reference.h"

namespace drafthead {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows with many exact ties (values on a coarse grid) plus a few -inf.
std::vector<float> TiedRow(int64_t v, uint64_t seed, int levels = 12) {
  std::mt19937_64 rng(seed);
  std::vector<float> row(v);
  for (auto& x : row) x = 0.5f * static_cast<float>(static_cast<int>(rng() % levels) - levels / 2);
  if (v > 10) row[rng() % v] = -kInf;
  return row;
}

std::vector<float> GaussianRow(int64_t v, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> row(v);
  for (auto& x : row) x = g(rng);
  return row;
}

struct Split {
  std::vector<int64_t> begin, size;
};

// The server's split: shards of S = ceil(v / tp) columns, the last ones short or empty.
Split TpSplit(int64_t v, int tp) {
  Split s;
  const int64_t per = (v + tp - 1) / tp;
  for (int r = 0; r < tp; ++r) {
    const int64_t b = std::min<int64_t>(v, r * per);
    s.begin.push_back(b);
    s.size.push_back(std::min<int64_t>(v, b + per) - b);
  }
  return s;
}

// Per-shard top-k and softmax partials, merged like rank 0 does.
struct Merged {
  std::vector<Candidate> top;
  uint32_t count;
  cpu::SoftmaxTotal total;
};

Merged TopKAcrossShards(const std::vector<float>& row, int tp, uint32_t k, float t) {
  const Split s = TpSplit(static_cast<int64_t>(row.size()), tp);
  std::vector<std::vector<Candidate>> lists(tp, std::vector<Candidate>(k));
  std::vector<SoftmaxPartial> parts(tp);
  std::vector<const Candidate*> lp;
  std::vector<const SoftmaxPartial*> pp;
  for (int r = 0; r < tp; ++r) {
    cpu::ShardTopK(row.data() + s.begin[r], s.size[r], static_cast<int32_t>(s.begin[r]), k, t,
                   lists[r].data(), &parts[r]);
    lp.push_back(lists[r].data());
    pp.push_back(&parts[r]);
  }
  Merged m;
  m.top.resize(k);
  m.count = cpu::MergeCandidates(lp.data(), tp, k, k, m.top.data());
  m.total = cpu::CombineSoftmax(pp.data(), tp);
  return m;
}

void ExpectTopKEqualsBruteForce(const std::vector<float>& row, uint32_t k, const std::string& what) {
  const auto want = ref::RefTopK(row.data(), static_cast<int64_t>(row.size()), static_cast<int>(k));
  for (int tp = 1; tp <= 4; ++tp) {
    const Merged m = TopKAcrossShards(row, tp, k, 1.0f);
    ASSERT_EQ(m.count, want.size()) << what << " tp=" << tp;
    for (uint32_t i = 0; i < k; ++i) {
      if (i < want.size()) {
        EXPECT_EQ(m.top[i].id, want[i]) << what << " tp=" << tp << " slot " << i;
        EXPECT_EQ(m.top[i].logit, row[want[i]]) << what << " tp=" << tp << " slot " << i;
        EXPECT_EQ(m.top[i].key, row[want[i]]) << what << " tp=" << tp << " slot " << i;
      } else {
        EXPECT_EQ(m.top[i].id, -1) << what << " tp=" << tp << " slot " << i;
      }
    }
  }
}

TEST(ShardTopK, SingleShardMatchesSort) {
  for (int64_t v : {1, 2, 7, 100, 1000}) {
    const auto row = TiedRow(v, 10 + v);
    for (uint32_t k : {1u, 3u, 8u, 64u, 2000u}) {
      std::vector<Candidate> out(k);
      cpu::ShardTopK(row.data(), v, 1000, k, 1.0f, out.data(), nullptr);
      const auto want = ref::RefTopK(row.data(), v, static_cast<int>(k));
      for (uint32_t i = 0; i < k; ++i) {
        if (i < want.size()) {
          ASSERT_EQ(out[i].id, want[i] + 1000) << "v=" << v << " k=" << k << " slot " << i;
        } else {
          ASSERT_EQ(out[i].id, -1) << "v=" << v << " k=" << k << " slot " << i;  // n_valid < k
        }
      }
    }
  }
}

TEST(ShardTopK, KZeroWritesNothing) {
  const auto row = TiedRow(50, 3);
  SoftmaxPartial p{0.f, 0.f};
  cpu::ShardTopK(row.data(), 50, 0, 0, 1.0f, nullptr, &p);  // must not touch out
  EXPECT_GT(p.sum_exp, 0.0f);
}

TEST(ShardTopK, EmptyShard) {
  std::vector<Candidate> out(4, Candidate{7, 1.f, 1.f});
  SoftmaxPartial p{1.f, 1.f};
  cpu::ShardTopK(nullptr, 0, 0, 4, 1.0f, out.data(), &p);
  for (const auto& c : out) EXPECT_EQ(c.id, -1);
  EXPECT_EQ(p.sum_exp, 0.0f);
  Candidate a{7, 1.f, 1.f};
  cpu::ShardArgmax(nullptr, 0, 0, &a);
  EXPECT_EQ(a.id, -1);
  cpu::ShardSample(nullptr, 0, 0, 1.0f, 1, 0, &a);
  EXPECT_EQ(a.id, -1);
  // A total over nothing but empty shards has no mass.
  const SoftmaxPartial* pp[] = {&p, &p};
  EXPECT_EQ(cpu::CombineSoftmax(pp, 2).sum_exp, 0.0);
}

// The AVX-512 softmax partial against the portable one (libm's exp per column): the same max, bit
// for bit, and the same sum within a float's rounding (the vector exp is within ~2 ulp of libm's
// in double, and its 8 lanes are added in another order); NaN, +-Inf, a spread that underflows,
// tails around the vector width, several temperatures.
TEST(SoftmaxPartial, VectorisedEqualsPortable) {
  if (!cpu::SoftmaxPartialVectorised()) GTEST_SKIP() << "no AVX-512F on this CPU";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 33, 100, 4097, 129280})
    rows.push_back({"gaussian n=" + std::to_string(n), GaussianRow(n, 5 * n + 1, 3.0f)});
  std::vector<float> spread(3000);
  for (size_t i = 0; i < spread.size(); ++i) spread[i] = -static_cast<float>(i) * 0.5f;  // down to e^-1500
  rows.push_back({"underflowing spread", spread});
  std::vector<float> with_nan = GaussianRow(200, 9, 1.0f);
  with_nan[123] = nan;
  with_nan[176] = nan;  // the last full block of 16, its first lane: the max must skip NaN too
  with_nan[190] = nan;
  rows.push_back({"NaNs", with_nan});
  std::vector<float> with_inf = GaussianRow(200, 10, 1.0f);
  with_inf[5] = -kInf;
  with_inf[77] = -kInf;
  rows.push_back({"-Inf columns", with_inf});
  std::vector<float> pos_inf = GaussianRow(40, 11, 1.0f);
  pos_inf[20] = kInf;
  rows.push_back({"+Inf max", pos_inf});
  rows.push_back({"all -Inf", std::vector<float>(50, -kInf)});
  for (const auto& [what, row] : rows) {
    for (float t : {0.3f, 1.0f, 7.5f}) {
      const int64_t n = static_cast<int64_t>(row.size());
      const SoftmaxPartial want = cpu::SoftmaxPartialPortable(row.data(), n, t);
      const SoftmaxPartial got = cpu::internal::SoftmaxPartialAvx512(row.data(), n, t);
      ASSERT_EQ(std::bit_cast<uint32_t>(got.max_scaled), std::bit_cast<uint32_t>(want.max_scaled)) << what << " T=" << t;
      if (std::isnan(want.sum_exp)) {
        EXPECT_TRUE(std::isnan(got.sum_exp)) << what << " T=" << t;
      } else {
        EXPECT_NEAR(got.sum_exp, want.sum_exp, 2.5e-7 * want.sum_exp) << what << " T=" << t;
      }
    }
  }
}

// The vectorised bf16 conversion of a full-logits row equals FloatToBf16 value by value: rounding
// ties both ways, NaN payloads of both signs, +-Inf, values rounding to Inf, subnormals, at every
// position of rows around the vector widths.
TEST(LogitsToBf16, EqualsFloatToBf16ValueByValue) {
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc12345u), kInf, -kInf,
                           std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),  // ties: even down, odd up
                           std::bit_cast<float>(0x7f7fffffu), 1e-40f, -1e-45f, 0.f, -0.f};
  for (int64_t n : {1, 7, 15, 16, 17, 31, 33, 64, 100}) {
    std::vector<float> row = GaussianRow(n, 3 * n, 2.0f);
    for (size_t i = 0; i < row.size(); ++i)
      if (i % 3 == 0) row[i] = special[(i / 3 + n) % std::size(special)];
    std::vector<uint16_t> out(n + 1, 0xabcd);
    cpu::LogitsToBf16(row.data(), n, out.data());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(out[j], FloatToBf16(row[j])) << "n=" << n << " j=" << j;
    EXPECT_EQ(out[n], 0xabcd) << "nothing written past the row";
  }
}

// ShardTopK and ShardArgmax skip a block of 64 columns when none ranks before the worst kept: rows where late
// columns must enter (ascending, a best value in the last full block and in the tail), where none
// does (descending, all tied: ties never enter, the smaller id wins), and with NaN (ordered last)
// and +-Inf anywhere, each against every column sorted by CandidateBefore.
TEST(ShardReduce, SkippedBlocksHoldNothingThatRanksBefore) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  for (int64_t v : {63, 64, 65, 200, 1000, 4097}) {
    std::vector<float> up(v), down(v), tied(v, 0.5f), late = GaussianRow(v, 11 * v, 1.0f);
    for (int64_t j = 0; j < v; ++j) up[j] = static_cast<float>(j) * 0.25f, down[j] = -up[j];
    rows.push_back({"ascending", up});
    rows.push_back({"descending", down});
    rows.push_back({"tied", tied});
    late[v - 1] = 50.f;                       // the tail
    if (v >= 128) late[(v / 64) * 64 - 1] = 40.f;  // the last full block
    rows.push_back({"late best", late});
    std::vector<float> odd = GaussianRow(v, 13 * v, 1.0f);
    for (int64_t j = 5; j < v; j += 37) odd[j] = nan;
    odd[v / 2] = kInf;
    odd[v - 1] = -kInf;
    if (v > 100) odd[99] = kInf;  // a tie at +Inf: the smaller id first
    rows.push_back({"NaN and Inf", odd});
    std::vector<float> all_nan(v, nan);
    all_nan[v - 1] = -kInf;
    rows.push_back({"NaN but the last", all_nan});
  }
  for (const auto& [what, row] : rows) {
    const int64_t v = static_cast<int64_t>(row.size());
    std::vector<Candidate> all(v);
    for (int64_t j = 0; j < v; ++j) all[j] = Candidate{static_cast<int32_t>(7 + j), row[j], row[j]};
    std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) { return CandidateBefore(a, b); });
    for (uint32_t k : {1u, 8u, 64u, 100u}) {
      std::vector<Candidate> out(k);
      cpu::ShardTopK(row.data(), v, 7, k, 1.0f, out.data(), nullptr);
      for (uint32_t i = 0; i < k && i < v; ++i)
        ASSERT_EQ(out[i].id, all[i].id) << what << " v=" << v << " k=" << k << " slot " << i;
    }
    Candidate best{};
    cpu::ShardArgmax(row.data(), v, 7, &best);
    ASSERT_EQ(best.id, all[0].id) << what << " v=" << v << " argmax";
  }
}

TEST(ShardTopK, AnySplitEqualsFullRow) {
  for (int64_t v : {1, 3, 5, 33, 257, 1000}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const auto tied = TiedRow(v, 100 * v + seed, seed % 2 ? 3 : 12);
      for (uint32_t k : {1u, 2u, 5u, 40u}) ExpectTopKEqualsBruteForce(tied, k, "tied v=" + std::to_string(v));
      const auto g = GaussianRow(v, 7 * v + seed, 3.0f);
      ExpectTopKEqualsBruteForce(g, 10, "gaussian v=" + std::to_string(v));
    }
  }
}

TEST(ShardArgmax, AnySplitEqualsFullRow) {
  for (int64_t v : {1, 2, 9, 100, 4097}) {
    for (uint64_t seed = 0; seed < 5; ++seed) {
      const auto row = TiedRow(v, 50 * v + seed, 4);  // few levels: the max is tied often
      const int32_t want = ref::RefArgmax(row.data(), v);
      for (int tp = 1; tp <= 4; ++tp) {
        const Split s = TpSplit(v, tp);
        std::vector<Candidate> c(tp);
        std::vector<const Candidate*> lp;
        for (int r = 0; r < tp; ++r) {
          cpu::ShardArgmax(row.data() + s.begin[r], s.size[r], static_cast<int32_t>(s.begin[r]), &c[r]);
          lp.push_back(&c[r]);
        }
        Candidate best;
        ASSERT_EQ(cpu::MergeCandidates(lp.data(), tp, 1, 1, &best), 1u);
        EXPECT_EQ(best.id, want) << "v=" << v << " tp=" << tp;
        EXPECT_EQ(best.logit, row[want]);
      }
    }
  }
}

TEST(CombineSoftmax, ProbabilitiesMatchFloat64) {
  for (float t : {0.7f, 1.0f, 2.5f}) {
    for (float scale : {1.0f, 30.0f}) {
      auto row = GaussianRow(3001, static_cast<uint64_t>(t * 100 + scale), scale);
      row[17] += 80.0f;  // a dominant logit: the shift by the global max matters
      const auto p = ref::RefSoftmax(row.data(), static_cast<int64_t>(row.size()), t);
      for (int tp = 1; tp <= 4; ++tp) {
        const Merged m = TopKAcrossShards(row, tp, 20, t);
        for (uint32_t i = 0; i < m.count; ++i) {
          const double want = p[m.top[i].id];
          const double got = cpu::SoftmaxProb(m.total, m.top[i].logit, t);
          EXPECT_NEAR(got, want, 1e-5 * want + 1e-30) << "T=" << t << " tp=" << tp << " slot " << i;
        }
        // And for arbitrary tokens, not only the top ones.
        for (int j = 0; j < 3001; j += 301) {
          EXPECT_NEAR(cpu::SoftmaxProb(m.total, row[j], t), p[j], 1e-5 * p[j] + 1e-30) << j;
        }
      }
    }
  }
}

// Per-shard samples merged like the server does.
int32_t SampleAcrossShards(const std::vector<float>& row, int tp, float t, uint64_t seed,
                           uint32_t row_index) {
  const Split s = TpSplit(static_cast<int64_t>(row.size()), tp);
  std::vector<Candidate> c(tp);
  std::vector<const Candidate*> lp;
  for (int r = 0; r < tp; ++r) {
    cpu::ShardSample(row.data() + s.begin[r], s.size[r], static_cast<int32_t>(s.begin[r]), t, seed,
                     row_index, &c[r]);
    lp.push_back(&c[r]);
  }
  Candidate best;
  if (cpu::MergeCandidates(lp.data(), tp, 1, 1, &best) == 0) return -1;
  EXPECT_EQ(best.logit, row[best.id]);
  EXPECT_EQ(best.key, SampleKey(row[best.id], t, seed, row_index, best.id));
  return best.id;
}

// SPEC: u in (0, 1). Every one of the 2^24 bit patterns gives such a u, and noise within the
// Gumbel range of that grid (no value rounds to 1.0, whose noise would read 88: seed 1, row 0,
// token 8922528 did, making that token win whatever its logit).
TEST(ShardSample, NoiseStaysInRangeForEveryUniform) {
  float lo = 1e30f, hi = -1e30f;
  for (uint32_t v = 0; v < (1u << 24); ++v) {
    const float u = UniformFromBits24(v);
    ASSERT_GT(u, 0.0f) << v;
    ASSERT_LT(u, 1.0f) << v;
    const float g = -DetLog(-DetLog(u));
    lo = std::min(lo, g);
    hi = std::max(hi, g);
  }
  EXPECT_GT(lo, -3.0f);
  EXPECT_LT(hi, 17.0f);
  EXPECT_LT(GumbelNoise(1, 0, 8922528), 17.0f);
  EXPECT_LT(SampleKey(0.0f, 1.0f, 1, 0, 8922528), 17.0f);
}

TEST(ShardSample, DeterministicAndSplitIndependent) {
  for (int64_t v : {1, 6, 100, 1000}) {
    const auto row = GaussianRow(v, 900 + v, 2.0f);
    for (uint64_t seed : {0ull, 1ull, 12345678901ull}) {
      for (uint32_t ri : {0u, 3u}) {
        for (float t : {0.5f, 1.0f, 3.0f}) {
          const int32_t want = ref::RefSample(row.data(), v, t, seed, ri);
          for (int tp = 1; tp <= 4; ++tp) {
            EXPECT_EQ(SampleAcrossShards(row, tp, t, seed, ri), want)
                << "v=" << v << " seed=" << seed << " row=" << ri << " T=" << t << " tp=" << tp;
          }
          EXPECT_EQ(SampleAcrossShards(row, 3, t, seed, ri), want);  // same inputs, same answer
        }
      }
    }
  }
  // Different seeds and different rows of a request draw different noise.
  const auto flat = std::vector<float>(1000, 0.0f);
  int differs = 0;
  for (uint64_t seed = 0; seed < 20; ++seed)
    differs += SampleAcrossShards(flat, 1, 1.0f, seed, 0) != SampleAcrossShards(flat, 1, 1.0f, seed, 1);
  EXPECT_GE(differs, 15);
}

TEST(ShardSample, FrequenciesFollowSoftmax) {
  const std::vector<float> row = {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.1f, -0.3f, 1.5f};
  const float t = 1.3f;
  const auto p = ref::RefSoftmax(row.data(), 8, t);
  const int draws = 40000;
  std::vector<int> count(8, 0);
  for (int s = 0; s < draws; ++s) ++count[SampleAcrossShards(row, 1 + s % 4, t, 1000 + s, s % 5)];
  double chi2 = 0;
  for (int j = 0; j < 8; ++j) {
    const double e = p[j] * draws;
    chi2 += (count[j] - e) * (count[j] - e) / e;
  }
  // 7 degrees of freedom: mean 7, P(chi2 > 40) ~ 1e-6. Loose on purpose; a biased generator or a
  // wrong temperature lands far above.
  EXPECT_LT(chi2, 40.0) << "counts vs softmax";
  // Temperature matters: at T = 0.3 the top token dominates much more.
  int top = 0;
  for (int s = 0; s < 4000; ++s) top += SampleAcrossShards(row, 2, 0.3f, 77 + s, 0) == 4;
  const double p_top = ref::RefSoftmax(row.data(), 8, 0.3)[4];
  EXPECT_NEAR(top / 4000.0, p_top, 0.03);
}

TEST(MergeCandidates, ShortAndEmptyLists) {
  // Ranks with fewer valid columns than k pad with id -1; the merge stops at them.
  const std::vector<float> row = {3.f, 1.f, 2.f, 2.f, 5.f};
  for (int tp = 1; tp <= 4; ++tp) {
    const Merged m = TopKAcrossShards(row, tp, 8, 1.0f);
    EXPECT_EQ(m.count, 5u);
    const std::vector<int32_t> want = {4, 0, 2, 3, 1};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(m.top[i].id, want[i]) << tp;
    for (int i = 5; i < 8; ++i) EXPECT_EQ(m.top[i].id, -1) << tp;
  }
}

TEST(Reference, CheckersAcceptNearTiesAndRejectWrongAnswers) {
  const std::vector<double> ref_row = {1.0, 3.0, 2.0, 3.0 + 1e-7, -1.0};
  const int32_t ok_ids[] = {1, 3};  // swapped near-tie is acceptable within tol
  const float ok_vals[] = {3.0f, 3.0f};
  EXPECT_EQ(ref::CheckTopK(ref_row, ok_ids, ok_vals, 2, 1e-6), "");
  const int32_t bad_ids[] = {1, 2};
  const float bad_vals[] = {3.0f, 2.0f};
  EXPECT_NE(ref::CheckTopK(ref_row, bad_ids, bad_vals, 2, 1e-6), "");
  EXPECT_NE(ref::CheckArgmax(ref_row, 0, 1.0f, 1e-6), "");
  EXPECT_EQ(ref::CheckArgmax(ref_row, 3, 3.0f, 1e-6), "");
  std::vector<float> frow(ref_row.begin(), ref_row.end());
  const int32_t s = ref::RefSample(frow.data(), 5, 1.0f, 9, 0);
  EXPECT_EQ(ref::CheckSample(ref_row, s, 1.0f, 9, 0, 1e-6), "");
}

}  // namespace
}  // namespace drafthead
