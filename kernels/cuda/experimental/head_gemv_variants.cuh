// The fp8 GEMV's measured alternatives (docs/cuda.md), for drafthead-bench-cuda and
// cuda_kernels_test only: built into drafthead_kernels_cuda_experimental, never into the server.
// Same contract as HeadGemvFp8 (kernels/cuda/head_gemv.cuh) with the configuration chosen by
// `variant`.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace drafthead::cuda {

// Row-major codes (the twin's order; the production kernel of rounds 1-3 and its alternatives):
// variant = pipeline depth (register stages of 64 columns): 2, 4, 8 (8: M <= 16 only), -1 = the
// exact fallback (HeadGemvFp8Exact), 100 = depth 4 with the f16-convert dequantization; round 2
// (M <= 16 only, else cudaErrorInvalidValue): 200 = depth 4 without the L2::256B hint; 302 / 304 =
// 32 warps a CTA with K split in 2 across warp pairs, depth 2 / 4; 314 = 16 warps, K split in 2;
// 408 / 416 / 432 = the default plus bulk L2 prefetches of each row 8 / 16 / 32 steps ahead.
// Issue 12 (M <= 16; cudaErrorNotSupported where x does not fit beside 2 stages): the TMA ring of
// head_gemv_ring.cuh, 8 consumer warps, block exponents 4 stages ahead, at most 4 / 6 / 8 stages
// of 16 KB = 504 / 506 / 508; 518 = 508 launched with programmatic dependent launch; 528 = 508
// with an L2 evict-first policy on the copies; 538 = both; 548 / 588 = 508 with exponents 1 / 8
// stages ahead (548 is round 3's run-1 kernel); 564 = 16 consumer warps, 4 stages of 32 KB; 574 =
// 564 with PDL; 604 = the depth-4 kernel (every M) launched with programmatic dependent launch.
// Issue 23, codes in fragment order (`codes` must then be PackFp8Codes's output): 700 = the
// row-major buckets (16 warps x 16 rows up to M = 16, no K split) on packed codes, 702 = depth 2
// (depth 8, run 1's 708, is gone: a half of the padded steps must be whole rounds), 740 / 741 = 700 with
// lane 0 prefetching the tile's stream into L2 8 / 16 steps ahead, 750 = 700 with PDL, 760 = 32
// warps a CTA with K split in 2, depth 2 (M <= 16); 770 = the mma.sync dispatch
// (production until wgmma; DispatchPacked<2, 2>: 760 for M <= 16, 8 warps x 32 rows at depth 2 above), 771 = 770 with PDL, 773 = 770 with the 8-step L2 prefetch for
// M <= 16, 774 = 770 at depth 4 above M = 16, 780 = 760 with balanced contiguous unit ranges
// on every SM (GemvConfig's BAL; M <= 16). Issue 23, wgmma (head_gemv_wgmma.cuh, packed codes):
// 800 = mma.sync for M <= 16, wgmma above (N = 32 / 64, depth 2), 801 = 800 with
// PDL (production since 2026-12-05, at depth 4 for N = 32), 804 = 800 at depth 4, 805 = 804 with each step waiting for its own wgmmas (one set of A
// registers); 810 / 814 / 815 = wgmma for every M (N = 8, 16, 32, 64) as 800 / 804 / 805;
// 820 / 821 / 822 = the production dispatch with the wgmma kernels' L2 prefetch 8 / 16 / 32 steps ahead.
// Round 7 (16 warps a CTA, each owning one 16-row tile: half the accumulators and A registers a
// warp, twice the warps an SM): 830 = the production dispatch so (depth 2 at N = 64, 4 at N <= 32),
// 831 = depth 4 at N = 64 too, 832 = 831 with each step waiting for its own wgmmas, 833 / 834 =
// wgmma for every M (N = 8, 16, 32, 64) at depth 4 / 2, 835 = 830 with each step waiting for its
// own wgmmas; 836 / 837 = 12 warps a CTA (170 registers a thread) at depth 4 / 2 for N = 64.
// Every packed kernel adds K in the same two halves.
// Unknown variants: cudaErrorInvalidValue.
// Whether `variant` reads the codes in fragment order (PackFp8Codes's output) rather than row-major.
bool HeadGemvFp8VariantTakesPackedCodes(int variant);

cudaError_t HeadGemvFp8Variant(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                               const uint8_t* exps, int64_t n, float* y, int64_t ldy, int variant,
                               cudaStream_t stream);

}  // namespace drafthead::cuda
