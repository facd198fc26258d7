// Helpers shared by the server tests: random bf16 data, the float64 reference of the per-shard
// twin, and exact reductions over a row of fp32 logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/candidate.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/numeric.h"

namespace drafthead::testing {

inline std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = FloatToBf16(nd(rng));
  return v;
}

// Float64 logits [m, vocab] of the per-shard twin of w [rows, k] at tp ranks, cropped to vocab;
// also sum |x w| per entry (the scale of fp32 accumulation error).
struct RefLogits {
  std::vector<double> y, mag;
};
inline RefLogits ReferenceTwinLogits(const std::vector<uint16_t>& w, int64_t rows, int64_t k,
                                     int tp, int64_t vocab, const std::vector<uint16_t>& x, int m,
                                     bool bf16_head = false) {
  const int64_t S = (rows + tp - 1) / tp;
  cpu::ThreadPool pool(1);
  RefLogits ref;
  ref.y.assign(static_cast<size_t>(m) * vocab, 0);
  ref.mag.assign(static_cast<size_t>(m) * vocab, 0);
  for (int r = 0; r < tp; ++r) {
    std::vector<uint16_t> shard(static_cast<size_t>(S) * k, 0);
    const int64_t present = std::clamp<int64_t>(rows - r * S, 0, S);
    std::copy(w.begin() + r * S * k, w.begin() + (r * S + present) * k, shard.begin());
    std::vector<uint8_t> codes(shard.size()), exps(cpu::TwinExpRows(S) * (k / 32));
    cpu::MakeTwin(shard.data(), S, k, codes.data(), exps.data(), pool);
    for (int64_t n = 0; n < S; ++n) {
      const int64_t id = r * S + n;
      if (id >= vocab) break;
      for (int i = 0; i < m; ++i) {
        double acc = 0, mag = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double wv = bf16_head ? Bf16ToFloat(shard[n * k + c])
                                      : std::ldexp(static_cast<double>(E4m3ToFloat(codes[n * k + c])),
                                                   exps[(n / 32) * (k / 32) + c / 32] - 127);
          const double p = static_cast<double>(Bf16ToFloat(x[i * k + c])) * wv;
          acc += p;
          mag += std::fabs(p);
        }
        ref.y[i * vocab + id] = acc;
        ref.mag[i * vocab + id] = mag;
      }
    }
  }
  return ref;
}

// The exact top k of one fp32 row (ties to the smaller id), keyed by `key`.
inline std::vector<Candidate> TopKOfRow(const std::vector<float>& key, const std::vector<float>& logit,
                                        uint32_t k) {
  std::vector<Candidate> c(key.size());
  for (size_t i = 0; i < key.size(); ++i) c[i] = Candidate{static_cast<int32_t>(i), key[i], logit[i]};
  std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return CandidateBefore(a, b); });
  c.resize(std::min<size_t>(k, c.size()));
  return c;
}

}  // namespace drafthead::testing
