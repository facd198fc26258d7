// The LM-head GEMV on the GPU: y[m, n] = sum_k x[m, k] * dequant(W)[n, k], bf16 x, fp32
// accumulation, for M = 1..64 rows in ONE pass over the weights (M > 64 runs one pass per 64 rows).
//
// fp8 twin path: the e4m3 codes, rearranged once at load into the kernel's fragment order
// (PackFp8Codes, below), stream from HBM with 16-byte loads into a register pipeline, each warp
// load 512 contiguous bytes; they are dequantized exactly to bf16 in registers (a byte permute puts
// the code into bf16 bits, times the block's power of two) and multiplied on the tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulators) against x held in shared memory. K is summed in two
// halves (first + second) by every kernel, so a row's outputs do not depend on its batch. One
// kernel per bucket of ceil(M / 8); see docs/cuda.md for the design and measurements. The kernels
// are in head_gemv_kernel.cuh; their measured alternatives in kernels/cuda/experimental/ (bench and
// tests only).
// The fast path needs every block exponent e <= 7 (exp byte <= 134, |w| < 448 * 2^7); shards
// with larger blocks go to the exact CUDA-core HeadGemvFp8Exact on the row-major codes (callers
// learn which with Fp8TwinFitsFastPath). Blocks with e < -117 (|w| < 2^-108) may lose bits below
// bf16's subnormal range; every realistic LM head is far from both limits.
//
// All pointers are device memory, calls are asynchronous on `stream`, nothing is allocated.
// Refused with cudaErrorInvalidValue: k not a positive multiple of 32, m < 1, n < 1, ldy < n,
// misaligned pointers (x, codes: 16 bytes).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace drafthead::cuda {

inline constexpr int kGemvMaxRowsPerPass = 64;

// packed: PackFp8Codes(codes [n, k]) (fragment order); exps [ceil(n/32), k/32] biased, every byte
// <= 134 (Fp8TwinFitsFastPath); x bf16 [m, k]; y fp32 [m, ldy].
cudaError_t HeadGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* packed,
                        const uint8_t* exps, int64_t n, float* y, int64_t ldy, cudaStream_t stream);

// The exact CUDA-core fallback for any exponent: codes [n, k] e4m3 row-major (the twin's order).
// Several times slower; for twins that fail Fp8TwinFitsFastPath.
cudaError_t HeadGemvFp8Exact(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                             const uint8_t* exps, int64_t n, float* y, int64_t ldy,
                             cudaStream_t stream);

// Host-side check of a twin's exponents for the fast path (all bytes <= 134).
bool Fp8TwinFitsFastPath(const uint8_t* exps_host, int64_t count);

// ---- fragment order (issue 23) ---------------------------------------------------------------
// The codes rearranged so that each warp load of the tensor-core kernel reads 512 contiguous
// bytes and a warp's 16-row tile is one contiguous stream (the twin's row-major [n, k] order
// makes every load touch 8 rows x 64 bytes). Tile T (rows 16T..16T+15), 64-column step s, half h
// (rows +0 / +8), lane l = 4g + t: the 16 codes of row 16T + 8h + g, columns 64s + 16t .. +15,
// sit at byte ((T * PackedSteps(k) + s) * 2 + h) * 512 + 16 l. Rows past n and columns past k are
// zero codes; tiles are padded to pairs (32-row exponent blocks) and steps to kPackStepAlign.
inline constexpr int kPackStepAlign = 8;
__host__ __device__ constexpr int64_t PackedSteps(int64_t k) {
  return ((k + 63) / 64 + kPackStepAlign - 1) / kPackStepAlign * kPackStepAlign;
}
__host__ __device__ constexpr int64_t PackedTiles(int64_t n) { return (n + 31) / 32 * 2; }
constexpr int64_t Fp8PackedCodesBytes(int64_t n, int64_t k) {
  return PackedTiles(n) * PackedSteps(k) * 1024;
}

// Writes the fragment order of codes [n, k] into packed (Fp8PackedCodesBytes(n, k) bytes, device
// memory, 16-byte aligned, not overlapping codes). Asynchronous on stream; cudaErrorInvalidValue
// for k not a positive multiple of 32, n < 1 or misaligned pointers.
cudaError_t PackFp8Codes(const uint8_t* codes, int64_t n, int64_t k, uint8_t* packed,
                         cudaStream_t stream);

}  // namespace drafthead::cuda
