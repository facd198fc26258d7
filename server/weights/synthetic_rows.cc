// The synthetic head (shard_weights.h, SynthesizeRows): a pure function of (seed, row, column),
// written so that its inner loop vectorizes (built at -O3 without errno-setting sqrt; see
// CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/numeric.h"
#include "server/weights/shard_weights.h"

namespace drafthead {
namespace {

constexpr int kOutliers = 8;
constexpr float kOutlierGain = 8.0f;

// A 32-bit integer hash (Wellons' lowbias32): cheap in SIMD lanes, unlike 64-bit multiplies.
inline uint32_t Hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

uint64_t RowKey(uint64_t seed, int64_t row) {
  return Mix64(Mix64(seed ^ 0x6a09e667f3bcc909ull) + static_cast<uint64_t>(row));
}

// Log-uniform over 1.5 decades around 0.02: 0.02 * 10^[-0.75, 0.75).
float RowScale(uint64_t seed, int64_t row) {
  const uint64_t h = Mix64(RowKey(seed, row) ^ 0xbb67ae8584caa73bull);
  const double u = static_cast<double>(h >> 11) * 0x1p-53;
  return static_cast<float>(0.02 * std::pow(10.0, 1.5 * (u - 0.5)));
}

// ln(u) for u in (0, 1], branch-free (selects, no libm) so it vectorizes; the same series as
// numeric.h's DetLog: u = m * 2^e, m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh((m - 1) / (m + 1)).
inline float FastLog(float u) {
  // Integer selects only: a conditional FP multiply would not be if-converted (it may trap).
  const uint32_t bits = FloatBits(u);
  const uint32_t man = bits & 0x7fffffu;
  const uint32_t big = man > 0x3504f3u;  // m in [1, 2) above sqrt(2): use m / 2 and e + 1
  const float m = BitsFloat(man | (0x3f800000u - (big << 23)));
  const float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127 +
                                     static_cast<int32_t>(big));
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float p = 1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9))));
  return e * 0.693147180559945309f + 2.0f * s * p;
}

// Two standard normals from one pair index (Box-Muller). Polynomial sin/cos and FastLog keep the
// loop free of libm calls and branches so it vectorizes; bf16 output needs ~3 digits, these give
// ~6. Integer-to-float conversions go through int32 (all values < 2^24) for the same reason.
inline void NormalPair(uint32_t pair, uint32_t k1, uint32_t k2, float* z0, float* z1) {
  const uint32_t a = Hash32(pair * 0x9e3779b9u + k1);
  const uint32_t b = Hash32(a ^ k2);
  const float u1 = static_cast<float>(static_cast<int32_t>((a >> 8) + 1)) * 0x1p-24f;  // (0, 1]
  const float radius = std::sqrt(-2.0f * FastLog(u1))  /* FastLog(u1) <= 0 */;
  // theta = 2 pi t with t in [-1/2, 1/2); x = theta / 2 in [-pi/2, pi/2).
  const float t = static_cast<float>(static_cast<int32_t>(b >> 8)) * 0x1p-24f - 0.5f;
  const float x = t * 3.14159265f;
  const float x2 = x * x;
  const float sn =
      x * (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 + x2 * (1.0f / 362880)))));
  const float cs =
      1.0f + x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 +
                                                                      x2 * (-1.0f / 3628800)))));
  *z0 = radius * (1.0f - 2.0f * sn * sn);  // cos(theta)
  *z1 = radius * (2.0f * sn * cs);         // sin(theta)
}

}  // namespace

void SynthesizeRows(uint64_t seed, int64_t row0, int64_t nrows, int64_t k, uint16_t* dst) {
  if (k <= 0 || nrows <= 0) return;
  int64_t outlier[kOutliers];
  for (int j = 0; j < kOutliers; ++j)
    outlier[j] = static_cast<int64_t>(Mix64(seed ^ (0x3c6ef372fe94f82bull * (j + 1))) %
                                      static_cast<uint64_t>(k));
  std::vector<float> z(static_cast<size_t>(k + 1));
  constexpr uint32_t kBlock = 16;  // fixed trip count: vectorizes even at -O2
  const uint32_t pairs = static_cast<uint32_t>((k + 1) / 2);
  for (int64_t i = 0; i < nrows; ++i) {
    const int64_t row = row0 + i;
    const uint64_t key = RowKey(seed, row);
    const uint32_t k1 = static_cast<uint32_t>(key), k2 = static_cast<uint32_t>(key >> 32);
    uint32_t p = 0;
    for (; p + kBlock <= pairs; p += kBlock) {
      float c[kBlock], s[kBlock];
      for (uint32_t j = 0; j < kBlock; ++j) NormalPair(p + j, k1, k2, &c[j], &s[j]);
      for (uint32_t j = 0; j < kBlock; ++j) {
        z[2 * (p + j)] = c[j];
        z[2 * (p + j) + 1] = s[j];
      }
    }
    for (; p < pairs; ++p) NormalPair(p, k1, k2, &z[2 * p], &z[2 * p + 1]);
    const float scale = RowScale(seed, row);
    uint16_t* out = dst + i * k;
    for (int64_t c = 0; c < k; ++c) out[c] = FloatToBf16(z[c] * scale);
    // Outliers after the bulk pass (a repeated column is scaled once).
    for (int j = 0; j < kOutliers; ++j) {
      bool seen = false;
      for (int q = 0; q < j; ++q) seen |= outlier[q] == outlier[j];
      if (!seen) out[outlier[j]] = FloatToBf16(z[outlier[j]] * scale * kOutlierGain);
    }
  }
}

}  // namespace drafthead
