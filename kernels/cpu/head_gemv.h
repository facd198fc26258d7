// The LM-head GEMV on the CPU: y[m, n] = sum_k x[m, k] * W[n, k] for a batch of M bf16 rows
// against one shard, fp32 accumulation. Two weight formats: the fp8 twin (e4m3 codes with one
// power-of-two exponent per 32x32 block, dequantized exactly) and plain bf16.
//
// Vectorized with AVX-512 BF16 (vdpbf16ps, fp8 twin only) or AVX2/FMA where the CPU has them
// (checked at run time), portable scalar code otherwise; all read each weight byte once per call
// whatever M is (rows are blocked inside).
// Threads: work is split over output rows n on `pool`. Inputs are not modified; y must not alias.
//
// HeadGemv* take the widest path this CPU has; to force another (tests, the bench's and the
// server's --isa), call HeadGemv*With with an explicit GemvIsa.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/cpu/thread_pool.h"

namespace drafthead::cpu {

// x: bf16 bits [m, k] row-major; codes: e4m3 [n, k]; exps: biased exponents [ceil(n/32), k/32];
// y: fp32 [m, ldy], columns [0, n) written. k must be a multiple of 32.
// The codes must come from a twin (never the NaN codes 0x7f / 0xff). Products are formed as
// x * 2^(exp-119) times (e4m3 * 2^-8), both exact, so the result is the fp32-accumulated sum of
// the exact products except where a product itself is outside the fp32 range.
void HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                 int64_t n, float* y, int64_t ldy, ThreadPool& pool);

// Same with bf16 weights w [n, k].
void HeadGemvBf16(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                  int64_t ldy, ThreadPool& pool);

// Which implementation HeadGemvFp8 uses on this machine ("avx512bf16", "avx2" or "scalar").
const char* HeadGemvIsa();

// ---- explicit implementation choice (tests, benchmarks, the server's --isa) --------------------
// kAvx512Bf16 applies to the fp8 twin; HeadGemvBf16 runs its AVX2 kernel under it.
enum class GemvIsa { kAuto, kScalar, kAvx2, kAvx512Bf16 };

// True when `isa` can run here (kAuto and kScalar always; kAvx2 needs AVX2, FMA and F16C;
// kAvx512Bf16 needs those and AVX-512 F/BW/VBMI/BF16).
bool GemvIsaAvailable(GemvIsa isa);

// "auto", "scalar", "avx2", "avx512bf16" <-> GemvIsa; ParseGemvIsa is false for other names.
bool ParseGemvIsa(std::string_view name, GemvIsa* isa);
const char* GemvIsaName(GemvIsa isa);

// HeadGemv* with the implementation forced; kAuto is what HeadGemv* do. Calling with an
// unavailable isa aborts (check GemvIsaAvailable first).
void HeadGemvFp8With(GemvIsa isa, const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                     const uint8_t* exps, int64_t n, float* y, int64_t ldy, ThreadPool& pool);
void HeadGemvBf16With(GemvIsa isa, const uint16_t* x, int m, int64_t k, const uint16_t* w,
                      int64_t n, float* y, int64_t ldy, ThreadPool& pool);

namespace internal {
// Output rows are processed in bands of 32 (one twin exponent row each). These run bands
// [b0, b1) single-threaded; HeadGemv* spread bands over the pool.
void Fp8BandsScalar(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                    int64_t n, float* y, int64_t ldy, int64_t b0, int64_t b1);
void Bf16BandsScalar(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                     int64_t ldy, int64_t b0, int64_t b1);
#if defined(__x86_64__) || defined(__i386__)
// head_gemv_avx2.cc (built with -mavx2 -mfma -mf16c); call only when GemvIsaAvailable(kAvx2).
void Fp8BandsAvx2(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                  int64_t n, float* y, int64_t ldy, int64_t b0, int64_t b1);
void Bf16BandsAvx2(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                   int64_t ldy, int64_t b0, int64_t b1);
// head_gemv_avx512.cc (built with AVX-512 BF16 flags); call only when
// GemvIsaAvailable(kAvx512Bf16). Bands it cannot take exactly go to Fp8BandsAvx2.
void Fp8BandsAvx512(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                    int64_t n, float* y, int64_t ldy, int64_t b0, int64_t b1);
#endif
}  // namespace internal

}  // namespace drafthead::cpu
