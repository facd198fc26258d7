// The softmax partial of one row with AVX-512F (kernels/cpu/shard_reduce.h; built with
// -mavx512f, called only where the CPU has it): 16 logits / T a step for the max, 8 exponentials in
// double a step for the sum, where the portable loop calls libm's exp once a column (~5.8 ns).
// exp(x), x = logit / T - max <= 0: x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite, two-part ln2), e^r by
// its Taylor series to r^13 (truncation < 1e-17 relative), times 2^n by vscalefpd (exact, and
// underflowing to 0 below 2^-1074). Within ~2 ulp of libm's exp; the partial sums are 8 lanes
// added at the end, so sum_exp may differ from the portable loop's in its last bit.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/shard_reduce.h"
#include "kernels/cpu/x86_intrinsics.h"

namespace drafthead::cpu::internal {
namespace {

__m512d ExpNonPositive(__m512d x) {
  // Below -746 e^x is 0 in double; max keeps a NaN (vmaxpd returns its second operand then).
  x = _mm512_max_pd(_mm512_set1_pd(-746.0), x);
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);  // ln2 hi
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);          // ln2 lo
  static constexpr double kInvFact[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
                                        1.0 / 3628800.0,    1.0 / 362880.0,    1.0 / 40320.0,
                                        1.0 / 5040.0,       1.0 / 720.0,       1.0 / 120.0,
                                        1.0 / 24.0,         1.0 / 6.0,         0.5,
                                        1.0,                1.0};
  __m512d p = _mm512_set1_pd(kInvFact[0]);
  for (int i = 1; i < 14; ++i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[i]));
  return _mm512_scalef_pd(p, n);
}

}  // namespace

SoftmaxPartial SoftmaxPartialAvx512(const float* y, int64_t n, float temperature) {
  const __m512 t = _mm512_set1_ps(temperature);
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) vmax = _mm512_max_ps(_mm512_div_ps(_mm512_loadu_ps(y + j), t), vmax);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (int i = 1; i < 16; ++i) mx = std::max(mx, lanes[i]);
  for (; j < n; ++j) mx = std::max(mx, y[j] / temperature);  // NaN ignored, as the max above
  SoftmaxPartial part{mx, 0.f};
  if (n == 0 || !std::isfinite(mx)) return part;
  const __m512d dmx = _mm512_set1_pd(mx);
  __m512d sum = _mm512_setzero_pd();
  for (j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512 s = _mm512_div_ps(_mm512_maskz_loadu_ps(m, y + j), t);  // logit / T in fp32, as the portable loop
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s));
    const __m512d hi = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_shuffle_f32x4(s, s, 0xee)));
    sum = _mm512_mask_add_pd(sum, static_cast<__mmask8>(m), sum, ExpNonPositive(_mm512_sub_pd(lo, dmx)));
    sum = _mm512_mask_add_pd(sum, static_cast<__mmask8>(m >> 8), sum, ExpNonPositive(_mm512_sub_pd(hi, dmx)));
  }
  alignas(64) double sums[8];
  _mm512_store_pd(sums, sum);
  double total = 0.0;
  for (double v : sums) total += v;
  part.sum_exp = static_cast<float>(total);
  return part;
}

}  // namespace drafthead::cpu::internal
