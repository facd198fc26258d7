#include "kernels/cuda/experimental/head_gemv_variants.cuh"

#include "kernels/cuda/head_gemv_kernel.cuh"
#include "kernels/cuda/head_gemv_wgmma.cuh"
#include "kernels/cuda/experimental/head_gemv_ring.cuh"

namespace drafthead::cuda {
namespace {

// The row-major kernels of rounds 1-3 (production until issue 23): 16 warps x 16 rows for m <= 16,
// 8 warps x 32 rows above, the L2::256B hint, depth D.
constexpr int RtFor(int mt) { return mt <= 2 ? 1 : 2; }
constexpr int WarpsFor(int rt) { return rt == 1 ? 16 : 8; }
constexpr int kRowMajorDepth = 4;
template <int MT, int D, int CONV, bool PDL, bool PACK, int PFD>
using BucketConfig = GemvConfig<D, RtFor(MT), WarpsFor(RtFor(MT)), 1, PACK, !PACK, PFD, PDL, CONV>;

// One launch for m <= 64 rows: the kernel for bucket ceil(m / 8); PACK: the same on packed codes
// (no hint).
template <int D, int CONV = kConvPrmt, bool PDL = false, bool PACK = false, int PFD = 0>
cudaError_t DispatchByBucket(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                             const uint8_t* exps, int64_t n, float* y, int64_t ldy,
                             cudaStream_t stream) {
  switch ((m + 7) / 8) {
    case 1: return LaunchFast<1, BucketConfig<1, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 2: return LaunchFast<2, BucketConfig<2, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 3: return LaunchFast<3, BucketConfig<3, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 4: return LaunchFast<4, BucketConfig<4, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 5: return LaunchFast<5, BucketConfig<5, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 6: return LaunchFast<6, BucketConfig<6, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 7: return LaunchFast<7, BucketConfig<7, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 8: return LaunchFast<8, BucketConfig<8, D, CONV, PDL, PACK, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
    default: return cudaErrorInvalidValue;
  }
}

// One configuration C for m <= 16 (buckets 1-2; 16-row units), else cudaErrorInvalidValue.
template <class C>
cudaError_t SmallM(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                   int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  switch ((m + 7) / 8) {
    case 1: return LaunchFast<1, C>(x, m, k, codes, exps, n, y, ldy, stream);
    case 2: return LaunchFast<2, C>(x, m, k, codes, exps, n, y, ldy, stream);
    default: return cudaErrorInvalidValue;
  }
}
// Round 2 (row-major codes): W warps, K split KS ways, the L2 hint, row-wise bulk prefetch.
template <int D, int W, int KS, bool HINT = true, int PFD = 0>
using RowMajorSmall = GemvConfig<D, 1, W, KS, false, HINT, PFD>;

// Issue 12: the TMA ring (head_gemv_ring.cuh), M <= 16. C consumer warps, exponents EQ stages
// ahead.
template <int C, int EQ, bool PDL, bool EVICT_FIRST>
cudaError_t Ring(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                 int64_t n, float* y, int64_t ldy, int stages, cudaStream_t stream) {
  switch ((m + 7) / 8) {
    case 1: return LaunchRing<1, C, EQ, PDL, EVICT_FIRST>(x, m, k, codes, exps, n, y, ldy, stages, stream);
    case 2: return LaunchRing<2, C, EQ, PDL, EVICT_FIRST>(x, m, k, codes, exps, n, y, ldy, stages, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool HeadGemvFp8VariantTakesPackedCodes(int variant) { return variant >= 700 && variant < 900; }

cudaError_t HeadGemvFp8Variant(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                               const uint8_t* exps, int64_t n, float* y, int64_t ldy, int variant,
                               cudaStream_t stream) {
  if (variant == -1) return HeadGemvFp8Exact(x, m, k, codes, exps, n, y, ldy, stream);
  DH_CUDA_TRY(ValidateGemv(x, m, k, codes, exps, n, y, ldy));
  return ByPasses(x, m, k, y, ldy, [&](const uint16_t* xp, int mm, float* yp) -> cudaError_t {
    switch (variant) {
      case 4: return DispatchByBucket<kRowMajorDepth>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 2: return DispatchByBucket<2>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 604:
        return DispatchByBucket<kRowMajorDepth, kConvPrmt, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 8:
        if ((mm + 7) / 8 > 2) return cudaErrorInvalidValue;  // registers: small M only
        return DispatchByBucket<8>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 100:
        return DispatchByBucket<kRowMajorDepth, kConvF16>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 200: return SmallM<RowMajorSmall<4, 16, 1, false>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 302: return SmallM<RowMajorSmall<2, 32, 2>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 304: return SmallM<RowMajorSmall<4, 32, 2>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 314: return SmallM<RowMajorSmall<4, 16, 2>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 408: return SmallM<RowMajorSmall<4, 16, 1, true, 8>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 416: return SmallM<RowMajorSmall<4, 16, 1, true, 16>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 432: return SmallM<RowMajorSmall<4, 16, 1, true, 32>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 700: return DispatchByBucket<kRowMajorDepth, kConvPrmt, false, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 702: return DispatchByBucket<2, kConvPrmt, false, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 740: return DispatchByBucket<kRowMajorDepth, kConvPrmt, false, true, 8>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 741: return DispatchByBucket<kRowMajorDepth, kConvPrmt, false, true, 16>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 750: return DispatchByBucket<kRowMajorDepth, kConvPrmt, true, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 760: return SmallM<PackedSmall<2>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 770: return DispatchPacked<2, 2>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 780:
        return SmallM<GemvConfig<2, 1, 32, 2, true, false, 0, false, kConvPrmt, true>>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 771: return DispatchPacked<2, 2, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 773: return DispatchPacked<2, 2, false, 8>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 774: return DispatchPacked<2, 4>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 800: return DispatchWgmma<2, false, false>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 801: return DispatchWgmma<2, true, false>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 804: return DispatchWgmma<4, false, false>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 805: return DispatchWgmma<4, false, false, false>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 810: return DispatchWgmma<2, false, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 814: return DispatchWgmma<4, false, true>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 815: return DispatchWgmma<4, false, true, false>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 820: return DispatchProduction<8>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 821: return DispatchProduction<16>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 822: return DispatchProduction<32>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      // Round 7: 16 warps x 1 tile (W = 16, RT = 1).
      case 830: return DispatchWgmma<2, true, false, true, 4, 0, 16, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 831: return DispatchWgmma<4, true, false, true, 4, 0, 16, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 832: return DispatchWgmma<4, true, false, false, 4, 0, 16, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 833: return DispatchWgmma<4, true, true, true, 4, 0, 16, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 834: return DispatchWgmma<2, true, true, true, 2, 0, 16, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 835: return DispatchWgmma<2, true, false, false, 4, 0, 16, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 836: return DispatchWgmma<4, true, false, true, 4, 0, 12, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 837: return DispatchWgmma<2, true, false, true, 4, 0, 12, 1>(xp, mm, k, codes, exps, n, yp, ldy, stream);
      case 504: return Ring<8, 4, false, false>(xp, mm, k, codes, exps, n, yp, ldy, 4, stream);
      case 506: return Ring<8, 4, false, false>(xp, mm, k, codes, exps, n, yp, ldy, 6, stream);
      case 508: return Ring<8, 4, false, false>(xp, mm, k, codes, exps, n, yp, ldy, 8, stream);
      case 518: return Ring<8, 4, true, false>(xp, mm, k, codes, exps, n, yp, ldy, 8, stream);
      case 528: return Ring<8, 4, false, true>(xp, mm, k, codes, exps, n, yp, ldy, 8, stream);
      case 538: return Ring<8, 4, true, true>(xp, mm, k, codes, exps, n, yp, ldy, 8, stream);
      case 548: return Ring<8, 1, false, false>(xp, mm, k, codes, exps, n, yp, ldy, 8, stream);
      case 588: return Ring<8, 8, false, false>(xp, mm, k, codes, exps, n, yp, ldy, 8, stream);
      case 564: return Ring<16, 4, false, false>(xp, mm, k, codes, exps, n, yp, ldy, 4, stream);
      case 574: return Ring<16, 4, true, false>(xp, mm, k, codes, exps, n, yp, ldy, 4, stream);
      default: return cudaErrorInvalidValue;
    }
  });
}

}  // namespace drafthead::cuda
