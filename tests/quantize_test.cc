// drafthead-quantize end to end: run the built binary, load its output back as a rank's --twin and
// compare with MakeTwin on the same shard bytes; and the twin file's checks (shapes, metadata,
// codes) when the server loads it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/numeric.h"
#include "server/weights/shard_weights.h"
#include "st_test_util.h"

namespace drafthead {
namespace {

using testutil::Bytes;
using testutil::TempDir;

std::string QuantizeBinary() {
  const char* bin = std::getenv("DRAFTHEAD_BIN_DIR");
  return bin ? std::string(bin) + "/tools/drafthead-quantize" : std::string();
}

int RunQuantize(const std::string& args) {
  const std::string bin = QuantizeBinary();
  if (bin.empty()) {
    ADD_FAILURE() << "DRAFTHEAD_BIN_DIR is not set (run through ctest)";
    return -1;
  }
  const int rc = std::system((bin + " " + args).c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Gaussian-ish bf16 weights with a wide dynamic range, so the blocks get different exponents.
std::vector<uint16_t> RandomHead(int64_t rows, int64_t k) {
  std::vector<uint16_t> w(rows * k);
  for (int64_t i = 0; i < rows * k; ++i) {
    const uint64_t h = Mix64(static_cast<uint64_t>(i) + 12345);
    const float u = static_cast<float>(h >> 40) * 0x1p-24f - 0.5f;
    const float scale = std::ldexp(1.0f, static_cast<int>((i / k) % 20) - 12);
    w[i] = FloatToBf16(u * scale);
  }
  return w;
}

void ExpectTwinMatches(const WeightsConfig& cfg, const ShardGeometry& geo) {
  auto w = LoadShardWeights(cfg, geo, /*need_bf16=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  const int64_t s = geo.shard_rows, k = geo.hidden;
  ASSERT_EQ(w->bf16.size(), static_cast<size_t>(s * k));
  ASSERT_EQ(w->codes.size(), static_cast<size_t>(s * k));
  ASSERT_EQ(w->exps.size(), static_cast<size_t>(cpu::TwinExpRows(s) * k / 32));
  std::vector<uint8_t> codes(s * k), exps(cpu::TwinExpRows(s) * k / 32);
  cpu::ThreadPool pool(2);
  cpu::MakeTwin(w->bf16.data(), s, k, codes.data(), exps.data(), pool);
  EXPECT_EQ(w->codes, codes) << "rank " << geo.rank;
  EXPECT_EQ(w->exps, exps) << "rank " << geo.rank;
  // Not all zeros: the comparison means something.
  EXPECT_GT(std::count_if(codes.begin(), codes.end(), [](uint8_t c) { return c != 0; }), s * k / 4);
  // Twin only: no bf16 read.
  auto t = LoadShardWeights(cfg, geo, /*need_bf16=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->bf16.empty());
  EXPECT_EQ(t->codes, codes);
}

TEST(QuantizeTest, CheckpointTwinRoundTrips) {
  TempDir dir;
  const int64_t rows = 100, k = 64;
  const std::string ckpt = dir.File("model.safetensors"), twin = dir.File("twin.safetensors");
  testutil::WriteFile(ckpt, testutil::BuildFile(
                                {{"lm_head.weight", "BF16", {rows, k}, Bytes(RandomHead(rows, k))}}));
  ASSERT_EQ(RunQuantize("--weights=" + ckpt + " --tensor=lm_head.weight --tp=3 --threads=2 --out=" +
                        twin),
            0);
  WeightsConfig cfg;
  cfg.weights = ckpt;
  cfg.twin = twin;
  cfg.threads = 2;
  for (int r = 0; r < 3; ++r) ExpectTwinMatches(cfg, ShardGeometry::Make(3, r, k, rows, rows));

  // The same twin does not fit another split or another tensor name.
  absl::Status s = LoadShardWeights(cfg, ShardGeometry::Make(2, 0, k, rows, rows), false).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(twin), std::string::npos) << s;
  WeightsConfig synth;
  synth.synthetic_seed = 1;
  synth.hidden_size = k;
  synth.padded_vocab = rows;
  synth.twin = twin;
  s = LoadShardWeights(synth, ShardGeometry::Make(3, 0, k, rows, rows), false).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s;
}

TEST(QuantizeTest, SyntheticTwinRoundTrips) {
  TempDir dir;
  const std::string twin = dir.File("twin.safetensors");
  ASSERT_EQ(RunQuantize("--synthetic=5 --hidden-size=96 --padded-vocab=70 --tp=2 --out=" + twin), 0);
  WeightsConfig cfg;
  cfg.synthetic_seed = 5;
  cfg.hidden_size = 96;
  cfg.padded_vocab = 70;
  cfg.twin = twin;
  cfg.threads = 2;
  for (int r = 0; r < 2; ++r) ExpectTwinMatches(cfg, ShardGeometry::Make(2, r, 96, 70, 70));
  cfg.synthetic_seed = 6;  // another seed's weights
  EXPECT_FALSE(LoadShardWeights(cfg, ShardGeometry::Make(2, 0, 96, 70, 70), false).ok());
}

TEST(QuantizeTest, BadInvocationsFailWithoutOutput) {
  TempDir dir;
  const std::string out = dir.File("twin.safetensors");
  EXPECT_EQ(RunQuantize("--synthetic=5 --hidden-size=96 --padded-vocab=70 --out=" + out), 2);
  EXPECT_EQ(RunQuantize("--synthetic=5 --hidden-size=96 --padded-vocab=70 --tp=2"), 2);
  EXPECT_EQ(RunQuantize("--tp=2 --out=" + out), 2);
  EXPECT_EQ(RunQuantize("--weights=" + dir.File("missing") + " --tp=2 --out=" + out), 1);
  EXPECT_EQ(RunQuantize("--synthetic=5 --hidden-size=100 --padded-vocab=70 --tp=2 --out=" + out), 1);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// A twin written by hand: the loader checks shapes, metadata and the codes themselves.
TEST(QuantizeTest, LoaderValidatesTwinFiles) {
  TempDir dir;
  const int64_t k = 32, rows = 40;  // tp 1: S = 40, exps [2, 1]
  WeightsConfig cfg;
  cfg.synthetic_seed = 1;
  cfg.hidden_size = k;
  cfg.padded_vocab = rows;
  cfg.twin = dir.File("t.safetensors");
  cfg.threads = 1;
  const ShardGeometry geo = ShardGeometry::Make(1, 0, k, rows, rows);
  auto write = [&](const std::string& codes, const std::vector<int64_t>& code_shape,
                   const std::string& exps, const std::string& meta) {
    testutil::WriteFile(cfg.twin, testutil::BuildFile({{"shard.0.e4m3", "F8_E4M3", code_shape, codes},
                                                      {"shard.0.exp", "U8", {2, 1}, exps}},
                                                     meta));
  };
  const std::string good_codes(rows * k, '\x11'), good_exps("\x70\x71", 2);
  write(good_codes, {rows, k}, good_exps, "\"tp\":\"1\",\"hidden\":\"32\"");
  auto ok = LoadShardWeights(cfg, geo, false);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->exps, (std::vector<uint8_t>{0x70, 0x71}));

  auto expect_error = [&](const std::string& what, const std::string& needle) {
    absl::Status s = LoadShardWeights(cfg, geo, false).status();
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(cfg.twin), std::string::npos) << what << ": " << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s;
  };
  write(good_codes.substr(0, (rows - 1) * k), {rows - 1, k}, good_exps, "");
  expect_error("short shard", "shard.0.e4m3");
  write(good_codes, {rows, k}, good_exps, "\"tp\":\"4\"");
  expect_error("metadata tp", "tp=4");
  write(good_codes, {rows, k}, good_exps, "\"shard_rows\":\"41\"");
  expect_error("metadata shard_rows", "shard_rows=41");
  std::string nan_codes = good_codes;
  nan_codes[33 * k + 7] = '\x7f';
  write(nan_codes, {rows, k}, good_exps, "");
  expect_error("NaN code", "shard row 33");
  write(good_codes, {rows, k}, std::string("\x70\xff", 2), "");
  expect_error("exponent 255", "shard.0.exp");
}

}  // namespace
}  // namespace drafthead
