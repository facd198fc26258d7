// The weights layer: head-shape probing, a rank's shard from a checkpoint or the synthetic
// generator (only its rows, zero-padded), non-finite rejection, and the generator's statistics.
#include "server/weights/shard_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kernels/numeric.h"
#include "st_test_util.h"

namespace drafthead {
namespace {

using testutil::Bytes;
using testutil::PatternBf16;
using testutil::TempDir;

WeightsConfig Synthetic(uint64_t seed, int64_t k, int64_t rows) {
  WeightsConfig cfg;
  cfg.synthetic_seed = seed;
  cfg.hidden_size = k;
  cfg.padded_vocab = rows;
  cfg.threads = 2;
  return cfg;
}

TEST(SynthesizeTest, DeterministicAndIndependentOfTheSplit) {
  const int64_t k = 256, rows = 40;
  std::vector<uint16_t> whole(rows * k), again(rows * k), split(rows * k), other(rows * k);
  SynthesizeRows(11, 0, rows, k, whole.data());
  SynthesizeRows(11, 0, rows, k, again.data());
  SynthesizeRows(11, 0, 13, k, split.data());
  SynthesizeRows(11, 13, 1, k, split.data() + 13 * k);
  SynthesizeRows(11, 14, rows - 14, k, split.data() + 14 * k);
  SynthesizeRows(12, 0, rows, k, other.data());
  EXPECT_EQ(whole, again);
  EXPECT_EQ(whole, split);
  int64_t same = 0;
  for (int64_t i = 0; i < rows * k; ++i) same += whole[i] == other[i];
  EXPECT_LT(same, rows * k / 20);  // another seed is other weights
  // Odd k works and agrees with itself.
  std::vector<uint16_t> odd(3 * 33), odd2(3 * 33);
  SynthesizeRows(5, 7, 3, 33, odd.data());
  SynthesizeRows(5, 7, 3, 33, odd2.data());
  EXPECT_EQ(odd, odd2);
}

TEST(SynthesizeTest, GaussianRowsWithVaryingScalesAndOutliers) {
  const int64_t k = 4096, rows = 256;
  std::vector<uint16_t> w(rows * k);
  SynthesizeRows(3, 1000, rows, k, w.data());
  std::vector<double> rms(rows, 0.0);
  std::vector<double> col_norm(k, 0.0);  // per column: mean of (w / row rms)^2
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> v(k);
    for (int64_t c = 0; c < k; ++c) {
      v[c] = Bf16ToFloat(w[r * k + c]);
      ASSERT_TRUE(std::isfinite(v[c]));
    }
    // Robust scale: median |w| / 0.6745 (the outlier columns do not move it).
    std::vector<double> a(k);
    for (int64_t c = 0; c < k; ++c) a[c] = std::fabs(v[c]);
    std::nth_element(a.begin(), a.begin() + k / 2, a.end());
    rms[r] = a[k / 2] / 0.6745;
    for (int64_t c = 0; c < k; ++c) col_norm[c] += (v[c] / rms[r]) * (v[c] / rms[r]) / rows;
  }
  const double lo = *std::min_element(rms.begin(), rms.end());
  const double hi = *std::max_element(rms.begin(), rms.end());
  EXPECT_GT(hi / lo, 15.0);  // ~1.5 decades of row scales
  EXPECT_LT(hi / lo, 40.0);
  double log_mean = 0;
  for (double x : rms) log_mean += std::log10(x) / rows;
  EXPECT_NEAR(log_mean, std::log10(0.02), 0.15);  // around 0.02

  int outliers = 0;
  double within1 = 0, count = 0;
  for (int64_t c = 0; c < k; ++c) {
    if (col_norm[c] > 16.0) {
      ++outliers;
      EXPECT_NEAR(std::sqrt(col_norm[c]), 8.0, 1.5) << "column " << c;
      continue;
    }
    EXPECT_LT(col_norm[c], 2.0) << "column " << c;
    for (int64_t r = 0; r < rows; ++r) {
      within1 += std::fabs(Bf16ToFloat(w[r * k + c]) / rms[r]) < 1.0;
      count += 1;
    }
  }
  EXPECT_GE(outliers, 6);
  EXPECT_LE(outliers, 8);
  EXPECT_NEAR(within1 / count, 0.6827, 0.01);  // Gaussian: 68.3% within one sigma
}

TEST(WeightsTest, ProbeSyntheticConfig) {
  auto s = ProbeHeadShape(Synthetic(7, 64, 100));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->hidden, 64);
  EXPECT_EQ(s->rows, 100);
  EXPECT_EQ(s->source, "synthetic(seed=7)");
  EXPECT_FALSE(ProbeHeadShape(Synthetic(7, 48, 100)).ok());
  EXPECT_FALSE(ProbeHeadShape(Synthetic(7, 0, 100)).ok());
  EXPECT_FALSE(ProbeHeadShape(Synthetic(7, 64, 0)).ok());
  EXPECT_FALSE(ProbeHeadShape(WeightsConfig{}).ok());  // neither weights nor seed
}

TEST(WeightsTest, SyntheticShardIsZeroPaddedAndReportsProgress) {
  const int64_t k = 64, rows = 100;
  const WeightsConfig cfg = Synthetic(9, k, rows);
  std::vector<uint16_t> all(rows * k);
  SynthesizeRows(9, 0, rows, k, all.data());
  for (int r = 0; r < 3; ++r) {
    const ShardGeometry geo = ShardGeometry::Make(3, r, k, rows, rows);
    ASSERT_EQ(geo.shard_rows, 34);
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    auto w = LoadShardWeights(cfg, geo, false,
                              [&](uint64_t d, uint64_t t) { calls.push_back({d, t}); });
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(w->bf16.size(), static_cast<size_t>(34 * k));
    EXPECT_TRUE(w->codes.empty());
    const int64_t present = geo.rows_present();
    EXPECT_EQ(present, r < 2 ? 34 : 32);
    for (int64_t i = 0; i < 34 * k; ++i) {
      const uint16_t want = i < present * k ? all[geo.row_begin() * k + i] : 0;
      ASSERT_EQ(w->bf16[i], want) << "rank " << r << " element " << i;
    }
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back().first, calls.back().second);
    EXPECT_EQ(calls.back().second, 34u * k * 2);
    for (size_t i = 1; i < calls.size(); ++i) EXPECT_GE(calls[i].first, calls[i - 1].first);
  }
}

struct CheckpointFixture {
  TempDir dir;
  std::string path = dir.File("model.safetensors");
  std::vector<uint16_t> w;
  CheckpointFixture(int64_t rows, int64_t k, const std::string& dtype = "BF16") : w(PatternBf16(rows, k)) {
    testutil::WriteFile(path, testutil::BuildFile({{"lm_head.weight", dtype, {rows, k}, Bytes(w)}}));
  }
  WeightsConfig Config() const {
    WeightsConfig cfg;
    cfg.weights = path;
    cfg.threads = 2;
    return cfg;
  }
};

TEST(WeightsTest, CheckpointShardsReadOnlyTheirRowsZeroPadded) {
  const int64_t rows = 100, k = 64;
  CheckpointFixture ck(rows, k);
  auto shape = ProbeHeadShape(ck.Config());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rows, rows);
  EXPECT_EQ(shape->hidden, k);
  EXPECT_EQ(shape->source, ck.path);
  for (int r = 0; r < 3; ++r) {
    const ShardGeometry geo = ShardGeometry::Make(3, r, k, rows, 90);
    auto w = LoadShardWeights(ck.Config(), geo, true);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int64_t i = 0; i < geo.shard_rows * k; ++i) {
      const uint16_t want = i < geo.rows_present() * k ? ck.w[geo.row_begin() * k + i] : 0;
      ASSERT_EQ(w->bf16[i], want) << "rank " << r << " element " << i;
    }
  }
  // A geometry that does not fit the checkpoint.
  EXPECT_FALSE(LoadShardWeights(ck.Config(), ShardGeometry::Make(3, 0, 32, rows, rows), true).ok());
  EXPECT_FALSE(LoadShardWeights(ck.Config(), ShardGeometry::Make(3, 3, k, rows, rows), true).ok());
}

TEST(WeightsTest, ConfiguredShapeMismatchesNameFileAndTensor) {
  CheckpointFixture ck(100, 64);
  WeightsConfig cfg = ck.Config();
  cfg.hidden_size = 128;
  absl::Status s = ProbeHeadShape(cfg).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(ck.path), std::string::npos) << s;
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
  cfg = ck.Config();
  cfg.padded_vocab = 128;
  s = ProbeHeadShape(cfg).status();
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
  cfg = ck.Config();
  cfg.tensor = "model.embed";
  s = ProbeHeadShape(cfg).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model.embed"), std::string::npos) << s;
}

TEST(WeightsTest, HeadMustBe2dBf16WithKMultipleOf32) {
  struct Case {
    std::string what, dtype;
    std::vector<int64_t> shape;
  };
  for (const Case& c : std::vector<Case>{{"F32 head", "F32", {4, 32}},
                                         {"K not a multiple of 32", "BF16", {4, 48}},
                                         {"3-D head", "BF16", {2, 2, 32}},
                                         {"no rows", "BF16", {0, 32}}}) {
    TempDir dir;
    const std::string path = dir.File("h.safetensors");
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const int64_t esize = c.dtype == "F32" ? 4 : 2;
    testutil::WriteFile(path, testutil::BuildFile(
                                  {{"lm_head.weight", c.dtype, c.shape, std::string(n * esize, 0)}}));
    WeightsConfig cfg;
    cfg.weights = path;
    absl::Status s = ProbeHeadShape(cfg).status();
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.message().find(path), std::string::npos) << c.what << ": " << s;
    EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << c.what << ": " << s;
  }
}

TEST(WeightsTest, MalformedCheckpointErrorsNameFileAndTensor) {
  TempDir dir;
  const std::string path = dir.File("m.safetensors");
  std::string bytes = testutil::BuildFile(
      {{"lm_head.weight", "BF16", {4, 32}, Bytes(PatternBf16(4, 32))}});
  bytes.resize(bytes.size() - 10);  // truncated
  testutil::WriteFile(path, bytes);
  WeightsConfig cfg;
  cfg.weights = path;
  absl::Status s = ProbeHeadShape(cfg).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
  // The same through a directory (found as its only *.safetensors).
  cfg.weights = dir.path();
  s = ProbeHeadShape(cfg).status();
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
  // An empty directory: no file to name, but the tensor is.
  TempDir empty;
  cfg.weights = empty.path();
  s = ProbeHeadShape(cfg).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find(empty.path()), std::string::npos) << s;
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
}

TEST(WeightsTest, NonFiniteWeightsAreRejectedWithTheGlobalRow) {
  const int64_t rows = 100, k = 64;
  for (uint16_t bad : {uint16_t{0x7fc0}, uint16_t{0xff80}}) {  // NaN, -inf
    TempDir dir;
    const std::string path = dir.File("nan.safetensors");
    std::vector<uint16_t> w = PatternBf16(rows, k);
    w[71 * k + 5] = bad;
    testutil::WriteFile(path, testutil::BuildFile({{"lm_head.weight", "BF16", {rows, k}, Bytes(w)}}));
    WeightsConfig cfg;
    cfg.weights = path;
    cfg.threads = 2;
    // Rank 0 never reads row 71.
    EXPECT_TRUE(LoadShardWeights(cfg, ShardGeometry::Make(3, 0, k, rows, rows), true).ok());
    absl::Status s = LoadShardWeights(cfg, ShardGeometry::Make(3, 2, k, rows, rows), true).status();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(path), std::string::npos) << s;
    EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
    EXPECT_NE(s.message().find("row 71,"), std::string::npos) << s;
    EXPECT_NE(s.message().find("column 5"), std::string::npos) << s;
  }
}

TEST(WeightsTest, TwinMetadataNamesTheLayout) {
  const ShardGeometry geo = ShardGeometry::Make(4, 0, 5120, 129280, 129280);
  WeightsConfig cfg;
  cfg.weights = "/ckpt";
  std::map<std::string, std::string> m = TwinMetadata(cfg, geo);
  EXPECT_EQ(m.at("tp"), "4");
  EXPECT_EQ(m.at("hidden"), "5120");
  EXPECT_EQ(m.at("padded_vocab"), "129280");
  EXPECT_EQ(m.at("shard_rows"), "32320");
  EXPECT_EQ(m.at("tensor"), "lm_head.weight");
  EXPECT_EQ(m.count("synthetic_seed"), 0u);
  EXPECT_EQ(TwinCodesTensor(3), "shard.3.e4m3");
  EXPECT_EQ(TwinExpTensor(0), "shard.0.exp");
}

}  // namespace
}  // namespace drafthead
