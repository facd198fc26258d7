#include "kernels/cpu/twin.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/numeric.h"

namespace drafthead::cpu {

void MakeTwinBand(const uint16_t* w, int64_t n, int64_t k, int64_t band, uint8_t* codes,
                  uint8_t* exps) {
  const int64_t r0 = band * 32;
  const int64_t r1 = std::min(n, r0 + 32);
  const int64_t kb = k / 32;
  // amax per column block over the band's rows (bf16 magnitude order equals its bit order).
  uint16_t amax_bits[1024];
  uint16_t* amax = amax_bits;
  std::vector<uint16_t> big;
  if (kb > 1024) {
    big.resize(kb);
    amax = big.data();
  }
  std::fill(amax, amax + kb, 0);
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* row = w + r * k;
    for (int64_t b = 0; b < kb; ++b) {
      uint16_t m = amax[b];
      for (int j = 0; j < 32; ++j) m = std::max<uint16_t>(m, row[b * 32 + j] & 0x7fffu);
      amax[b] = m;
    }
  }
  float inv_scale[1024];
  std::vector<float> inv_big;
  float* inv = inv_scale;
  if (kb > 1024) {
    inv_big.resize(kb);
    inv = inv_big.data();
  }
  for (int64_t b = 0; b < kb; ++b) {
    const float a = std::max(Bf16ToFloat(amax[b]), BitsFloat(0x00800000u));  // >= 2^-126
    const int e = TwinBlockExponent(a);
    exps[band * kb + b] = static_cast<uint8_t>(e + 127);
    // w / 2^e == w * 2^-e exactly (both are the correctly rounded w * 2^-e); 2^-e is a normal or
    // subnormal fp32 for e in [-127, 127].
    inv[b] = std::ldexp(1.0f, -e);
  }
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* row = w + r * k;
    uint8_t* out = codes + r * k;
    for (int64_t c = 0; c < k; ++c) out[c] = FloatToE4m3(Bf16ToFloat(row[c]) * inv[c >> 5]);
  }
}

void MakeTwin(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, uint8_t* exps,
              ThreadPool& pool) {
  const int64_t bands = TwinExpRows(n);
  pool.ParallelFor(bands, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) MakeTwinBand(w, n, k, b, codes, exps);
  });
}

}  // namespace drafthead::cpu
