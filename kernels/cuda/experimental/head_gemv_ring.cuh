// The fp8 GEMV for M <= 16 on a shared-memory ring fed by the bulk tensor copy engine (issue 12).
// An experiment (drafthead_kernels_cuda_experimental only; instantiated by head_gemv_variants.cu);
// include after kernels/cuda/head_gemv_kernel.cuh (its dequantization and mma helpers).
// Same contract as HeadGemvFp8 (kernels/cuda/head_gemv.cuh); LaunchRing returns
// cudaErrorNotSupported where the ring does not fit (x too large for shared memory beside >= 2
// stages), so callers fall back.
//
// Why: the register pipeline of head_gemv_kernel.cuh holds D x 32 B a lane in flight and spends
// issue slots on it; here one thread per CTA keeps S stages of 16 KB (128 columns x 8 units of 16
// rows) in flight through TMA (cp.async.bulk.tensor.2d, completing on an mbarrier), at no register
// cost, and the consumer warps dequantize from shared memory with the same exact prmt + bf16
// multiply and mma.sync as the register kernel.
//
// Layout: the tensor map is the twin's codes [n, k] as they are (no repack), box 128 columns x 16
// rows, 128-byte swizzle (16-byte chunk c of row r lands at chunk c ^ (r & 7)). Lane (g, t) of a
// consumer warp reads, for half h of a 128-column stage, the logical chunk 2t + h of rows g, g + 8:
// with the swizzle the 8 lanes of a quarter-warp hit 8 distinct chunk positions (conflict-free).
// So lane t's 16 columns are physical 32t + 16h + (0..15): one 32-column exponent block per lane
// per stage, and x in shared memory is stored permuted within each 128-column group (physical
// column 32t + 16h + i at position 64h + 16t + i) so that its B fragments keep the register
// kernel's conflict-free 32-byte pattern.
// Work: grid = min(SMs, units), one CTA per SM; CTA b owns the contiguous 16-row units
// [b U / G, (b + 1) U / G) and walks them 8 at a time (one per consumer warp), all of K per tile.
#pragma once

#include <cudaTypedefs.h>

#include "kernels/cuda/dependent_launch.cuh"

namespace drafthead::cuda {
namespace {

constexpr int kRingBox = 16 * 128;  // one unit's stage: 16 rows x 128 columns
constexpr int kRingSmemMax = 227 * 1024;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
template <bool EVICT_FIRST>
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar, uint64_t policy) {
  if constexpr (EVICT_FIRST) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
  }
}

struct RingArgs {
  const uint16_t* x;
  const uint8_t* exps;
  float* y;
  int64_t k, n, ldy;
  int m;
  int kstages;    // ceil(k / 128)
  int row_bytes;  // shared-memory stride of one x row (16 mod 128)
  int stages;     // ring depth S
  int64_t units;  // ceil(n / 16)
};

// MT: 8-row batch tiles of x (1 or 2). C: consumer warps (one 16-row unit each; a stage is
// C x 2 KB); the producer is warp C. EQ: how many stages ahead each lane loads its block exponent
// (run 1 of round 3 had 1: every stage then waited ~1 us for that load). PDL: programmatic
// dependent launch (the producer starts the weight stream before the previous kernel in the stream
// has finished; x and y wait). EVICT_FIRST: L2 evict-first policy on the copies.
template <int MT, int C, int EQ, bool PDL, bool EVICT_FIRST>
__global__ void __launch_bounds__((C + 1) * 32, 1)
    GemvFp8RingKernel(const __grid_constant__ CUtensorMap map, const RingArgs a) {
  constexpr int kRingConsumers = C, kRingStage = C * kRingBox;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // TMA's 128-byte swizzle repeats every 1024 bytes: stage buffers start 1024-aligned.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint8_t* xs = smem + a.stages * kRingStage;
  const uint32_t bars = SmemAddr(xs + MT * 8 * a.row_bytes);  // full[S], then empty[S]
  const uint32_t ring = SmemAddr(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = a.stages;
  const int64_t G = gridDim.x;
  const int64_t u_begin = a.units * blockIdx.x / G, u_end = a.units * (blockIdx.x + 1) / G;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(bars + 8 * s, 1);
      MbarInit(bars + 8 * (S + s), kRingConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if constexpr (PDL) LetDependentsLaunch();

  if (warp == kRingConsumers) {  // producer: one thread issues every stage
    if (lane != 0) return;
    uint64_t policy = 0;
    if constexpr (EVICT_FIRST)
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    int64_t q = 0;
    for (int64_t tb = u_begin; tb < u_end; tb += kRingConsumers) {
      const int nu = static_cast<int>(min(static_cast<int64_t>(kRingConsumers), u_end - tb));
      for (int ks = 0; ks < a.kstages; ++ks, ++q) {
        const int slot = static_cast<int>(q % S);
        if (q >= S) MbarWait(bars + 8 * (S + slot), static_cast<uint32_t>((q / S - 1) & 1));
        const uint32_t full = bars + 8 * slot;
        MbarExpectTx(full, static_cast<uint32_t>(nu * kRingBox));
        for (int u = 0; u < nu; ++u)
          TmaLoad2d<EVICT_FIRST>(ring + slot * kRingStage + u * kRingBox, &map, ks * 128,
                                 static_cast<int>((tb + u) * 16), full, policy);
      }
    }
    return;
  }

  // Consumers: x into shared memory, permuted within each 128-column group (see the top).
  if constexpr (PDL) WaitForPrerequisites();
  {
    const int pieces = a.kstages * 16;  // 16-byte pieces (8 columns) per row
    for (int i = threadIdx.x; i < MT * 8 * pieces; i += kRingConsumers * 32) {
      const int row = i / pieces, p = i - row * pieces;
      const int grp = p >> 4, pc = p & 15;  // physical piece pc = 4t + 2h + u
      const int t = pc >> 2, h = (pc >> 1) & 1, u = pc & 1;
      const int64_t col = static_cast<int64_t>(p) * 8;
      const bool ok = row < a.m && col < a.k;  // else zero-filled
      CpAsync16(SmemAddr(xs + row * a.row_bytes + grp * 256 + (8 * h + 2 * t + u) * 16),
                ok ? a.x + row * a.k + col : a.x, ok ? 16u : 0u);
    }
    CpAsyncCommit();  // all of x in flight at once (a plain load-store loop waits per piece)
    CpAsyncWait<0>();
    asm volatile("bar.sync 1, %0;" ::"n"(kRingConsumers * 32) : "memory");
  }

  const int g = lane >> 2, t = lane & 3;
  const int64_t kblocks = a.k / 32;
  int64_t q = 0;
  for (int64_t tb = u_begin; tb < u_end; tb += kRingConsumers) {
    const int64_t unit = tb + warp;
    const bool active = unit < u_end;
    const uint8_t* ep = a.exps + (min(unit, a.units - 1) * 16 / 32) * kblocks;
    float acc[MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;
    uint32_t eq[EQ];
#pragma unroll
    for (int d = 0; d < EQ; ++d)
      eq[d] = active ? __ldg(ep + min(static_cast<int64_t>(4 * d + t), kblocks - 1)) : 0;
    for (int ks0 = 0; ks0 < a.kstages; ks0 += EQ)
#pragma unroll
    for (int d = 0; d < EQ; ++d) {
      const int ks = ks0 + d;
      if (ks >= a.kstages) break;  // warp-uniform
      const int slot = static_cast<int>(q % S);
      const uint32_t e_cur = eq[d];
      if (active && ks + EQ < a.kstages)
        eq[d] = __ldg(ep + min(static_cast<int64_t>(4 * (ks + EQ) + t), kblocks - 1));
      MbarWait(bars + 8 * slot, static_cast<uint32_t>((q / S) & 1));
      if (active) {
        const uint32_t scale2 = ScalePair<kConvPrmt>(e_cur);
        const uint8_t* wbuf = smem + slot * kRingStage + warp * kRingBox;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int chunk = ((2 * t + h) ^ g) * 16;  // rows g and g + 8 share r & 7 == g
          const uint4 w0 = *reinterpret_cast<const uint4*>(wbuf + g * 128 + chunk);
          const uint4 w1 = *reinterpret_cast<const uint4*>(wbuf + (g + 8) * 128 + chunk);
          uint32_t af[2][8];
          DequantRow16<kConvPrmt>(w0, scale2, af[0]);
          DequantRow16<kConvPrmt>(w1, scale2, af[1]);
          const uint8_t* xrow = xs + ks * 256 + h * 128 + 32 * t;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const XFrag xf = LoadXFrag(xrow + (mt * 8 + g) * a.row_bytes);
            const uint32_t* b = xf.b;
#pragma unroll
            for (int j = 0; j < 4; ++j)
              Mma(acc[mt], af[0][2 * j], af[1][2 * j], af[0][2 * j + 1], af[1][2 * j + 1],
                  b[2 * j], b[2 * j + 1]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) MbarArrive(bars + 8 * (S + slot));
      ++q;
    }
    if (!active) continue;
    const int64_t r0 = unit * 16;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t nn = r0 + g + ((c & 2) ? 8 : 0);
        const int mm = mt * 8 + 2 * t + (c & 1);
        if (mm < a.m && nn < a.n) a.y[mm * a.ldy + nn] = acc[mt][c];
      }
  }
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// One launch for m <= 16 rows. max_stages caps the ring depth (bench variants).
template <int MT, int C = 8, int EQ = 4, bool PDL = false, bool EVICT_FIRST = false>
cudaError_t LaunchRing(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                       const uint8_t* exps, int64_t n, float* y, int64_t ldy, int max_stages,
                       cudaStream_t stream) {
  if (m > MT * 8 || n > (int64_t{1} << 31) - 16 || k > (int64_t{1} << 31)) return cudaErrorNotSupported;
  RingArgs a{x, exps, y, k, n, ldy, m, 0, 0, 0, 0};
  a.kstages = static_cast<int>((k + 127) / 128);
  a.row_bytes = a.kstages * 256 + 16;
  a.units = (n + 15) / 16;
  const size_t fixed = 1024 + static_cast<size_t>(MT) * 8 * a.row_bytes;  // align slack + x
  constexpr int kRingStage = C * kRingBox;
  const int fit = static_cast<int>((kRingSmemMax - fixed - 16 * max_stages) / kRingStage);
  a.stages = std::min(max_stages, fit);
  if (a.stages < 2) return cudaErrorNotSupported;
  const size_t smem = fixed + static_cast<size_t>(a.stages) * (kRingStage + 16);
  const auto encode = TensorMapEncoder();
  if (!encode) return cudaErrorNotSupported;
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {128, 16}, estr[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(codes), dims, strides,
             box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  auto kernel = GemvFp8RingKernel<MT, C, EQ, PDL, EVICT_FIRST>;
  DH_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(smem)));
  int dev = 0, sms = 0;
  DH_CUDA_TRY(cudaGetDevice(&dev));
  DH_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int grid = static_cast<int>(std::min<int64_t>(a.units, sms));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3((C + 1) * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = PDL ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DH_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, map, a));
  return cudaGetLastError();
}

}  // namespace
}  // namespace drafthead::cuda
