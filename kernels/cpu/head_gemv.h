// The LM-head GEMV on the CPU: y[m, n] = sum_k x[m, k] * W[n, k] for a batch of M bf16 rows
// against one shard, fp32 accumulation. Two weight formats: the fp8 twin (e4m3 codes with one
// power-of-two exponent per 32x32 block, dequantized exactly) and plain bf16.
//
// Vectorized with AVX2/FMA where the CPU has it (checked at run time), portable scalar code
// otherwise; both read each weight byte once per call whatever M is (rows are blocked inside).
// Threads: work is split over output rows n on `pool`. Inputs are not modified; y must not alias.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace drafthead::cpu {

// x: bf16 bits [m, k] row-major; codes: e4m3 [n, k]; exps: biased exponents [ceil(n/32), k/32];
// y: fp32 [m, ldy], columns [0, n) written. k must be a multiple of 32.
void HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                 int64_t n, float* y, int64_t ldy, ThreadPool& pool);

// Same with bf16 weights w [n, k].
void HeadGemvBf16(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n, float* y,
                  int64_t ldy, ThreadPool& pool);

// Which implementation HeadGemv* use on this machine ("avx2" or "scalar").
const char* HeadGemvIsa();

}  // namespace drafthead::cpu
