// The LM-head GEMV on the GPU: y[m, n] = sum_k x[m, k] * dequant(W)[n, k], bf16 x, fp32
// accumulation, for M = 1..64 rows in ONE pass over the weights (M > 64 runs one pass per 64 rows).
//
// fp8 twin path: the e4m3 codes stream from HBM with 16-byte loads into a register pipeline,
// are dequantized exactly to bf16 in registers (e4m3 -> f16 by the hardware convert, the exponent
// moved into bf16 bits, times the block's power of two), and multiplied on the tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulators) against x held in shared memory. One kernel per
// bucket of ceil(M / 8) (1..8); see docs/cuda.md for the design and measurements. The kernel is
// in head_gemv_kernel.cuh; its measured alternatives are in kernels/cuda/experimental/ (bench and
// tests only).
// The fast path needs every block exponent e <= 7 (exp byte <= 134, |w| < 448 * 2^7); shards
// with larger blocks go to an exact CUDA-core fallback (callers learn which with
// Fp8TwinFitsFastPath). Blocks with e < -117 (|w| < 2^-108) may lose bits below bf16's
// subnormal range; every realistic LM head is far from both limits.
//
// All pointers are device memory, calls are asynchronous on `stream`, nothing is allocated.
// Refused with cudaErrorInvalidValue: k not a positive multiple of 32, m < 1, n < 1, ldy < n,
// misaligned pointers (x, codes: 16 bytes).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace drafthead::cuda {

inline constexpr int kGemvMaxRowsPerPass = 64;

// codes [n, k] e4m3; exps [ceil(n/32), k/32] biased; x bf16 [m, k]; y fp32 [m, ldy].
// fast_path: false forces the exact CUDA-core fallback (required when the twin has exps > 134).
cudaError_t HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                        const uint8_t* exps, int64_t n, float* y, int64_t ldy, bool fast_path,
                        cudaStream_t stream);

// Host-side check of a twin's exponents for the fast path (all bytes <= 134).
bool Fp8TwinFitsFastPath(const uint8_t* exps_host, int64_t count);

}  // namespace drafthead::cuda
