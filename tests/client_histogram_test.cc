// LogLinearHistogram: percentiles within the stated relative error of the exact nearest-rank
// percentiles of known samples; merging per-thread histograms equals one histogram of everything.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "client/histogram.h"

namespace drafthead::client {
namespace {

uint64_t ExactNearestRank(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

void ExpectWithinBound(const std::vector<uint64_t>& samples, int bits) {
  LogLinearHistogram h(bits);
  for (uint64_t s : samples) h.Record(s);
  ASSERT_EQ(h.count(), samples.size());
  const double bound = h.RelativeErrorBound();
  EXPECT_DOUBLE_EQ(bound, 1.0 / (2 << bits));
  for (double q : {0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0}) {
    const double exact = static_cast<double>(ExactNearestRank(samples, q));
    const double got = h.Percentile(q);
    EXPECT_LE(std::fabs(got - exact), bound * exact + 1e-9) << "q=" << q << " exact=" << exact << " got=" << got
                                                           << " bits=" << bits;
  }
  EXPECT_EQ(h.min(), *std::min_element(samples.begin(), samples.end()));
  EXPECT_EQ(h.max(), *std::max_element(samples.begin(), samples.end()));
}

TEST(LogLinearHistogram, LognormalLatenciesWithinRelativeError) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> d(std::log(300000.0), 1.2);  // ~300 us median, in ns
  std::vector<uint64_t> v(200000);
  for (auto& x : v) x = static_cast<uint64_t>(d(rng)) + 1;
  for (int bits : {4, 7, 10}) ExpectWithinBound(v, bits);
}

TEST(LogLinearHistogram, UniformAndHeavyTail) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> v;
  std::uniform_int_distribution<uint64_t> u(1, 5000000);
  for (int i = 0; i < 50000; ++i) v.push_back(u(rng));
  for (int i = 0; i < 500; ++i) v.push_back(1000000000ull + u(rng) * 100);  // a 1 s tail
  ExpectWithinBound(v, 7);
}

TEST(LogLinearHistogram, SmallValuesAreExact) {
  LogLinearHistogram h(7);
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < 256; ++i) {
    for (uint64_t r = 0; r <= i % 3; ++r) v.push_back(i);
  }
  for (uint64_t x : v) h.Record(x);
  for (double q : {0.1, 0.5, 0.9, 1.0}) EXPECT_EQ(h.Percentile(q), static_cast<double>(ExactNearestRank(v, q)));
}

TEST(LogLinearHistogram, BucketsTileTheRange) {
  LogLinearHistogram h(5, uint64_t{1} << 30);
  for (size_t i = 0; i + 1 < h.buckets(); ++i) {
    ASSERT_EQ(h.BucketUpper(i), h.BucketLower(i + 1)) << i;
    ASSERT_EQ(h.IndexOf(h.BucketLower(i)), i);
    ASSERT_EQ(h.IndexOf(h.BucketUpper(i) - 1), i);
    // width <= lower * 2^-bits (above the exact range)
    if (h.BucketLower(i) >= 64) {
      ASSERT_LE(h.BucketUpper(i) - h.BucketLower(i), h.BucketLower(i) >> 5);
    }
  }
}

TEST(LogLinearHistogram, MergeEqualsSingle) {
  std::mt19937_64 rng(3);
  std::exponential_distribution<double> d(1e-5);
  LogLinearHistogram all(7), parts[4];
  for (int i = 0; i < 40000; ++i) {
    const uint64_t x = static_cast<uint64_t>(d(rng));
    all.Record(x);
    parts[i % 4].Record(x);
  }
  LogLinearHistogram merged(7);
  for (auto& p : parts) ASSERT_TRUE(merged.Merge(p));
  EXPECT_EQ(merged.count(), all.count());
  EXPECT_EQ(merged.min(), all.min());
  EXPECT_EQ(merged.max(), all.max());
  EXPECT_DOUBLE_EQ(merged.mean(), all.mean());
  for (size_t i = 0; i < all.buckets(); ++i) ASSERT_EQ(merged.BucketCount(i), all.BucketCount(i));
  LogLinearHistogram other_bits(4);
  EXPECT_FALSE(merged.Merge(other_bits));
}

TEST(LogLinearHistogram, ClampsAboveMaxAndEmptyIsZero) {
  LogLinearHistogram h(7, 1000000);
  EXPECT_EQ(h.Percentile(0.5), 0.0);
  h.Record(5000000);
  EXPECT_EQ(h.max(), 1000000u);
  EXPECT_LE(h.Percentile(1.0), 1000000.0);
}

}  // namespace
}  // namespace drafthead::client
