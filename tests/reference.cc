#include "reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/numeric.h"  // SampleKey / GumbelNoise only: the SAMPLE generator is the contract

namespace drafthead::ref {
namespace {

float Bf16AsFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even fp32 -> bf16 written out arithmetically (no bit carry trick).
uint16_t FloatToBf16Rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t hi = u >> 16, lo = u & 0xffffu;
  uint32_t r = hi;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) r = hi + 1;
  return static_cast<uint16_t>(r);
}

// The 128 magnitudes by code 0..127, ascending (e4m3 codes are monotonic in magnitude). Code
// 0x7f is NaN; for rounding it stands for "480", the value past 448 that rounds to NaN.
const std::array<double, 128>& Magnitudes() {
  static const std::array<double, 128> t = [] {
    std::array<double, 128> a{};
    for (int c = 0; c < 127; ++c) a[c] = RefE4m3Value(static_cast<uint8_t>(c));
    a[127] = 480.0;
    return a;
  }();
  return t;
}

template <class W>
RefGemv GemvCols(const uint16_t* x, int m, int64_t k, const std::vector<int64_t>& cols, W&& weight) {
  RefGemv r;
  r.m = m;
  r.n = static_cast<int64_t>(cols.size());
  r.y.assign(static_cast<size_t>(m) * r.n, 0.0);
  r.abs.assign(static_cast<size_t>(m) * r.n, 0.0);
  std::vector<double> xd(static_cast<size_t>(m) * k), wd(k);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = RefBf16Value(x[i]);
  for (int64_t jj = 0; jj < r.n; ++jj) {
    for (int64_t c = 0; c < k; ++c) wd[c] = weight(cols[jj], c);
    for (int i = 0; i < m; ++i) {
      const double* xr = xd.data() + i * k;
      double s = 0, a = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = xr[c] * wd[c];
        s += p;
        a += std::fabs(p);
      }
      r.y[i * r.n + jj] = s;
      r.abs[i * r.n + jj] = a;
    }
  }
  return r;
}

std::vector<int64_t> AllCols(int64_t n) {
  std::vector<int64_t> c(n);
  std::iota(c.begin(), c.end(), 0);
  return c;
}

}  // namespace

// ---- random ------------------------------------------------------------------------------------

std::vector<uint16_t> RandomBf16(size_t count, uint64_t seed, double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, stddev);
  std::vector<uint16_t> v(count);
  for (auto& b : v) b = FloatToBf16Rne(static_cast<float>(g(rng)));
  return v;
}

std::vector<uint16_t> RandomBf16Bits(size_t count, uint64_t seed, int min_exp, int max_exp) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  const uint32_t span = static_cast<uint32_t>(max_exp - min_exp + 1);
  std::vector<uint16_t> v(count);
  for (auto& b : v) {
    s ^= s << 13;  // xorshift64: plenty for test data, fast for 100M+ elements
    s ^= s >> 7;
    s ^= s << 17;
    const uint32_t r = static_cast<uint32_t>(s >> 32);
    // Biased exponent field, clamped to the finite range (0 gives bf16 subnormals).
    const int field = std::clamp(min_exp + 127 + static_cast<int>((r >> 8) % span), 0, 254);
    const uint32_t e = static_cast<uint32_t>(field);
    b = static_cast<uint16_t>(((r & 1u) << 15) | (e << 7) | ((r >> 1) & 0x7fu));
  }
  return v;
}

std::vector<uint8_t> RandomTwinCodes(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(count);
  for (size_t i = 0; i < count; i += 8) {
    uint64_t r = rng();
    for (size_t j = i; j < std::min(count, i + 8); ++j, r >>= 8) {
      uint8_t c = static_cast<uint8_t>(r);
      if ((c & 0x7f) == 0x7f) c ^= 0x01;  // NaN -> 448 (0x7e)
      v[j] = c;
    }
  }
  return v;
}

std::vector<uint8_t> RandomTwinExps(size_t count, uint64_t seed, int lo, int hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(count);
  for (auto& e : v) e = static_cast<uint8_t>(d(rng));
  return v;
}

// ---- formats -----------------------------------------------------------------------------------

double RefBf16Value(uint16_t bits) { return static_cast<double>(Bf16AsFloat(bits)); }

double RefE4m3Value(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

uint8_t RefFloatToE4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7f;
  const double a = std::fabs(static_cast<double>(f));
  const auto& t = Magnitudes();
  if (a >= t[127]) return sign | 0x7f;
  // t[lo] <= a < t[lo + 1]; decide against the exact midpoint (exact in double: few bits).
  const int hi = static_cast<int>(std::upper_bound(t.begin(), t.end(), a) - t.begin());
  const int lo = hi - 1;
  const double mid = 0.5 * (t[lo] + t[hi]);
  int c;
  if (a < mid) {
    c = lo;
  } else if (a > mid) {
    c = hi;
  } else {
    c = (lo % 2 == 0) ? lo : hi;  // tie: the even code (even mantissa)
  }
  return static_cast<uint8_t>(sign | c);
}

int RefTwinExponent(float amax) {
  const float r = amax / 448.0f;
  int p;
  const float m = std::frexp(r, &p);  // r = m * 2^p, m in [0.5, 1)
  int e = (m == 0.5f) ? p - 1 : p;
  return std::clamp(e, -127, 127);
}

// ---- twin ---------------------------------------------------------------------------------------

RefTwin ReferenceTwin(const uint16_t* w, int64_t n, int64_t k) {
  RefTwin t;
  t.n = n;
  t.k = k;
  const int64_t nb = (n + 31) / 32, kb = k / 32;
  t.codes.assign(static_cast<size_t>(n) * k, 0);
  t.exps.assign(static_cast<size_t>(nb) * kb, 0);
  const float floor_amax = std::ldexp(1.0f, -126);
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t bj = 0; bj < kb; ++bj) {
      float amax = 0.0f;  // padding rows are zeros: they never raise amax
      for (int64_t r = bi * 32; r < std::min(n, bi * 32 + 32); ++r)
        for (int64_t c = bj * 32; c < bj * 32 + 32; ++c)
          amax = std::max(amax, std::fabs(Bf16AsFloat(w[r * k + c])));
      amax = std::max(amax, floor_amax);
      const int e = RefTwinExponent(amax);
      t.exps[bi * kb + bj] = static_cast<uint8_t>(e + 127);
      for (int64_t r = bi * 32; r < std::min(n, bi * 32 + 32); ++r) {
        for (int64_t c = bj * 32; c < bj * 32 + 32; ++c) {
          // w / 2^e: exact in double, then one rounding to fp32 (as the fp32 division does).
          const float q = static_cast<float>(RefBf16Value(w[r * k + c]) * std::ldexp(1.0, -e));
          t.codes[r * k + c] = RefFloatToE4m3(q);
        }
      }
    }
  }
  return t;
}

double RefDequant(uint8_t code, uint8_t exp) {
  return RefE4m3Value(code) * std::ldexp(1.0, static_cast<int>(exp) - 127);
}

// ---- GEMV ---------------------------------------------------------------------------------------

double RefGemv::RowTolerance(int i, double rel, double abs_floor) const {
  double t = 0;
  for (int64_t j = 0; j < n; ++j) t = std::max(t, Tolerance(i, j, rel, abs_floor));
  return t;
}

RefGemv ReferenceGemvFp8Cols(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                             const uint8_t* exps, const std::vector<int64_t>& cols) {
  const int64_t kb = k / 32;
  return GemvCols(x, m, k, cols, [&](int64_t r, int64_t c) {
    return RefDequant(codes[r * k + c], exps[(r / 32) * kb + c / 32]);
  });
}

RefGemv ReferenceGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                         const uint8_t* exps, int64_t n) {
  return ReferenceGemvFp8Cols(x, m, k, codes, exps, AllCols(n));
}

RefGemv ReferenceGemvBf16Cols(const uint16_t* x, int m, int64_t k, const uint16_t* w,
                              const std::vector<int64_t>& cols) {
  return GemvCols(x, m, k, cols, [&](int64_t r, int64_t c) { return RefBf16Value(w[r * k + c]); });
}

RefGemv ReferenceGemvBf16(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n) {
  return ReferenceGemvBf16Cols(x, m, k, w, AllCols(n));
}

RefGemv ReferenceTwinLogits(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int m) {
  const RefTwin t = ReferenceTwin(w, n, k);
  return ReferenceGemvFp8(x, m, k, t.codes.data(), t.exps.data(), n);
}

RefGemv ReferenceBf16Logits(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int m) {
  return ReferenceGemvBf16(x, m, k, w, n);
}

RefGemv ReferenceLogits(const uint16_t* w, int64_t rows, int64_t k, int tp, const uint16_t* x,
                        int m, int64_t vocab_size, RefHead head) {
  const int64_t s = (rows + tp - 1) / tp;
  RefGemv out;
  out.m = m;
  out.n = vocab_size;
  out.y.assign(static_cast<size_t>(m) * vocab_size, 0.0);
  out.abs.assign(static_cast<size_t>(m) * vocab_size, 0.0);
  for (int r = 0; r < tp; ++r) {
    const int64_t r0 = r * s;
    if (r0 >= vocab_size) break;
    // The shard, zero-padded to s rows when it is the short last one.
    std::vector<uint16_t> shard(static_cast<size_t>(s) * k, 0);
    const int64_t have = std::max<int64_t>(0, std::min(s, rows - r0));
    std::copy(w + r0 * k, w + (r0 + have) * k, shard.begin());
    const RefGemv g = head == RefHead::kFp8Twin ? ReferenceTwinLogits(shard.data(), s, k, x, m)
                                                : ReferenceBf16Logits(shard.data(), s, k, x, m);
    for (int i = 0; i < m; ++i) {
      for (int64_t j = 0; j < s && r0 + j < vocab_size; ++j) {
        out.y[i * vocab_size + r0 + j] = g.y[i * s + j];
        out.abs[i * vocab_size + r0 + j] = g.abs[i * s + j];
      }
    }
  }
  return out;
}

// ---- reductions ---------------------------------------------------------------------------------

namespace {
template <class V>
std::vector<int32_t> TopKOf(const V& value, int64_t v, int k) {
  std::vector<int32_t> ids(v);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return value(a) > value(b); });  // stable: id ties
  ids.resize(std::min<int64_t>(k, v));
  return ids;
}
}  // namespace

std::vector<int32_t> RefTopK(const float* row, int64_t v, int k) {
  return TopKOf([&](int32_t i) { return row[i]; }, v, k);
}

std::vector<int32_t> RefTopK(const std::vector<double>& row, int k) {
  return TopKOf([&](int32_t i) { return row[i]; }, static_cast<int64_t>(row.size()), k);
}

int32_t RefArgmax(const float* row, int64_t v) {
  const auto t = RefTopK(row, v, 1);
  return t.empty() ? -1 : t[0];
}

std::vector<double> RefSoftmax(const std::vector<double>& row, double temperature) {
  double mx = -std::numeric_limits<double>::infinity();
  for (double z : row) mx = std::max(mx, z / temperature);
  std::vector<double> p(row.size());
  double sum = 0;
  for (size_t i = 0; i < row.size(); ++i) sum += (p[i] = std::exp(row[i] / temperature - mx));
  for (double& q : p) q /= sum;
  return p;
}

std::vector<double> RefSoftmax(const float* row, int64_t v, double temperature) {
  return RefSoftmax(std::vector<double>(row, row + v), temperature);
}

int32_t RefSample(const float* row, int64_t v, float temperature, uint64_t seed,
                  uint32_t row_index) {
  int32_t best = -1;
  float best_key = 0;
  for (int64_t j = 0; j < v; ++j) {
    const float key = SampleKey(row[j], temperature, seed, row_index, static_cast<uint32_t>(j));
    if (best < 0 || key > best_key) {  // strict: ties keep the smaller id
      best = static_cast<int32_t>(j);
      best_key = key;
    }
  }
  return best;
}

std::string CheckTopK(const std::vector<double>& ref_row, const int32_t* ids, const float* values,
                      int k, double tol) {
  const int64_t v = static_cast<int64_t>(ref_row.size());
  const int want = static_cast<int>(std::min<int64_t>(k, v));
  std::vector<char> seen(v, 0);
  double min_ref = std::numeric_limits<double>::infinity();
  for (int i = 0; i < want; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= v) return "slot " + std::to_string(i) + ": id " + std::to_string(id) + " out of range";
    if (seen[id]) return "slot " + std::to_string(i) + ": id " + std::to_string(id) + " repeated";
    seen[id] = 1;
    if (std::fabs(values[i] - ref_row[id]) > tol)
      return "slot " + std::to_string(i) + ": value " + std::to_string(values[i]) + " vs reference " +
             std::to_string(ref_row[id]);
    if (i > 0 && values[i] > values[i - 1])
      return "slot " + std::to_string(i) + ": values not in descending order";
    min_ref = std::min(min_ref, ref_row[id]);
  }
  for (int64_t j = 0; j < v; ++j) {
    if (!seen[j] && ref_row[j] > min_ref + 2 * tol)
      return "id " + std::to_string(j) + " (reference " + std::to_string(ref_row[j]) +
             ") belongs in the top " + std::to_string(k);
  }
  return "";
}

std::string CheckArgmax(const std::vector<double>& ref_row, int32_t id, float value, double tol) {
  return CheckTopK(ref_row, &id, &value, 1, tol);
}

std::string CheckSample(const std::vector<double>& ref_row, int32_t id, float temperature,
                        uint64_t seed, uint32_t row_index, double tol) {
  const int64_t v = static_cast<int64_t>(ref_row.size());
  if (id < 0 || id >= v) return "id " + std::to_string(id) + " out of range";
  double best = -std::numeric_limits<double>::infinity();
  int64_t best_id = -1;
  for (int64_t j = 0; j < v; ++j) {
    const double key = ref_row[j] / temperature +
                       GumbelNoise(seed, row_index, static_cast<uint32_t>(j));
    if (key > best) best = key, best_id = j;
  }
  const double got = ref_row[id] / temperature + GumbelNoise(seed, row_index, static_cast<uint32_t>(id));
  // 2 tol / T for the logits, plus fp32 rounding of logit / T + g in the server.
  if (got < best - 2 * tol / temperature - 1e-6 * (std::fabs(best) + 1))
    return "sampled id " + std::to_string(id) + " has key " + std::to_string(got) + ", id " +
           std::to_string(best_id) + " has " + std::to_string(best);
  return "";
}

}  // namespace drafthead::ref
