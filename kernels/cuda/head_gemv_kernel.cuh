// The fp8 GEMV's tensor-core kernel template and its host-side launch (head_gemv.cuh has the
// contract). Internal to kernels/cuda: head_gemv.cu instantiates the production configurations
// (DispatchPacked<2, 2>: codes in fragment order); a GemvConfig names a kernel's knobs, and the
// measured alternatives of docs/cuda.md (row-major codes with the L2 hint, other depths, the f16
// dequantization, prefetch, PDL) are configurations that only
// kernels/cuda/experimental/head_gemv_variants.cu instantiates, for the bench and tests.
// Everything here has internal linkage (one copy per including .cu: no kernel ODR across TUs).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/head_gemv.cuh"
#include "kernels/numeric.h"

namespace drafthead::cuda {
namespace {

// A warp owns RT 16-row mma tiles (RT = 1: 16 rows, RT = 2: one 32-row exponent block) at a time.
// Small M uses RT = 1 so that many warps per SM share the shard (latency hiding); large M uses
// RT = 2 so each x fragment read from shared memory feeds two tiles (shared-memory bandwidth).
constexpr int kSmemBudget = 200 * 1024;     // x buffers (H200: 227 KB per block at most)

// ---- PTX helpers ---------------------------------------------------------------------------
// Streaming 16-byte load: the weights are read once, so keep them out of L1; the L2::256B hint
// makes L2 fetch the whole 256-byte span of the row (the next steps' loads), so DRAM sees long
// contiguous bursts although one warp instruction touches 8 rows x 64 bytes.
template <bool HINT = true>
__device__ __forceinline__ uint4 LdgStream(const void* p) {
  uint4 r;
  if constexpr (HINT) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  }
  return r;
}

// Bulk L2 prefetch of `bytes` (a multiple of 16, 16-byte aligned) at p: no registers, no
// completion to wait for; the later loads find the lines in L2.
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* g, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(g), "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Dequantization of 4 e4m3 codes (one 32-bit word) into two bf16x2 registers equal to
// code value * 2^e, exactly. Two routes (template parameter CONV):
//  kConvPrmt (default): byte permute with sign replication puts each code's sign at bit 15 and
//   its exponent/mantissa at bits 4..10 of a bf16: that bf16 is value * 2^-120 (e4m3 subnormals
//   become bf16 subnormals), then one bf16 multiply by 2^(e+120) (needs e <= 7). 4 ops a pair.
//  kConvF16: the hardware e4m3x2 -> f16x2 convert (exact, all normal), the f16 bits moved down to
//   bf16 (value * 2^-112), times 2^(e+112). 5 ops a pair; kept as the cross-check.
constexpr int kConvPrmt = 0, kConvF16 = 1;

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d) : "r"(a), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t Hmul2Bf16(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

template <int CONV>
__device__ __forceinline__ void DequantWord(uint32_t w, uint32_t scale2, uint32_t& lo,
                                            uint32_t& hi) {
  if constexpr (CONV == kConvPrmt) {
    // [sign(c1) c1 sign(c0) c0] and [sign(c3) c3 sign(c2) c2]
    const uint32_t p01 = Prmt(w, 0x9180u), p23 = Prmt(w, 0xB3A2u);
    lo = Hmul2Bf16((p01 << 4) & 0x87f087f0u, scale2);
    hi = Hmul2Bf16((p23 << 4) & 0x87f087f0u, scale2);
  } else {
    uint32_t h0, h1;
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(h0), "=r"(h1)
        : "r"(w));
    lo = Hmul2Bf16(((h0 & 0x7fff7fffu) >> 3) | (h0 & 0x80008000u), scale2);
    hi = Hmul2Bf16(((h1 & 0x7fff7fffu) >> 3) | (h1 & 0x80008000u), scale2);
  }
}

// The 16 codes of one lane's 16-byte load (one row) -> the 8 A-fragment registers: af[2j] =
// codes 4j, 4j+1; af[2j+1] = codes 4j+2, 4j+3.
template <int CONV>
__device__ __forceinline__ void DequantRow16(const uint4& w, uint32_t scale2, uint32_t (&af)[8]) {
  DequantWord<CONV>(w.x, scale2, af[0], af[1]);
  DequantWord<CONV>(w.y, scale2, af[2], af[3]);
  DequantWord<CONV>(w.z, scale2, af[4], af[5]);
  DequantWord<CONV>(w.w, scale2, af[6], af[7]);
}

// A lane's B fragments (x^T, 16 columns of one batch row) from its 32 contiguous bytes at p.
struct XFrag {
  uint32_t b[8];
};
__device__ __forceinline__ XFrag LoadXFrag(const uint8_t* p) {
  const uint4 b01 = *reinterpret_cast<const uint4*>(p);
  const uint4 b23 = *reinterpret_cast<const uint4*>(p + 16);
  return {{b01.x, b01.y, b01.z, b01.w, b23.x, b23.y, b23.z, b23.w}};
}

// bf16x2 of 2^(e + bias) for the biased block exponent byte (e = byte - 127).
template <int CONV>
__device__ __forceinline__ uint32_t ScalePair(uint32_t exp_byte) {
  const uint32_t f = (exp_byte + (CONV == kConvPrmt ? 120u : 112u)) << 7;
  return f | (f << 16);
}

// a + b rounded to nearest with subnormal inputs and result flushed to signed zero: the
// arithmetic of `red.global.add.f32`, which the packed 1-way kernels use for the same sum.
__device__ __forceinline__ float AddFtz(float a, float b) {
  float r;
  asm("add.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- the tensor-core kernel ----------------------------------------------------------------
// Work unit: one warp x RT 16-row mma tiles (16 or 32 rows, inside one exponent block) x all of
// K, in steps of 64 columns. Lane (g = lane/4, t = lane%4) loads 16 bytes of rows g, g+8
// (, g+16, g+24) at column 64s + 16t. The dot product does not care which physical column feeds which mma k-slot as long
// as A (weights) and B (x) agree, so slot pairs {2t,2t+1} / {2t+8,2t+9} of k16 substep j are
// physical columns 16t + 4j + {0,1} / {2,3}: every lane's weights and x are contiguous, one
// 16-byte load each, and the lane's 16 columns share one block exponent.
// x lives in shared memory: all of it when it fits (loaded once per CTA), else in double-buffered
// column chunks that the CTA's warps walk in lock step. The weight loads run D steps ahead in
// registers (D * 4 * 16 bytes in flight per lane) across chunk boundaries.
struct GemvArgs {
  const uint16_t* x;
  const uint8_t* codes;
  const uint8_t* exps;
  float* y;
  int64_t k, n, ldy;
  int m;
  int steps;        // 64-column steps, a multiple of D (columns past k are zeros)
  int chunk_steps;  // steps per x chunk (== steps when x fits whole), a multiple of D
  int row_bytes;    // shared-memory stride of one x row: 16 mod 128 keeps B loads conflict-free
  int red_off;      // KS > 1: byte offset of the split-K partial sums in shared memory
  int64_t pack_steps;  // PACK: 64-column steps a 16-row tile holds in the packed codes
};

template <int MT, int NT>
__device__ __forceinline__ void LoadXChunk(const GemvArgs& a, uint8_t* buf, int step0, int nsteps) {
  const int cols16 = nsteps * 8;  // 16-byte pieces per row (8 bf16 each)
  const int total = MT * 8 * cols16;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(buf));
  for (int i = threadIdx.x; i < total; i += NT) {
    const int row = i / cols16, c = i - row * cols16;
    const int64_t col = static_cast<int64_t>(step0) * 64 + c * 8;
    const bool ok = row < a.m && col < a.k;
    const uint16_t* src = ok ? a.x + row * a.k + col : a.x;
    CpAsync16(base + row * a.row_bytes + c * 16, src, ok ? 16u : 0u);
  }
  CpAsyncCommit();
}

// W warps a CTA; KS > 1 (round 2, whole-x mode and RT = 1 only): the CTA's W / KS work units are
// each split over KS warps along K (warp w: unit w % (W/KS), K part w / (W/KS)), so W = 32 puts
// 32 warps (64 registers each) on an SM with half the stream each; the partial accumulators are
// added through shared memory (fixed order: deterministic). HINT: the L2::256B load hint.
// PFD > 0 (round 2 variant): lanes t == 0 also issue bulk L2 prefetches of their two rows, 512
// bytes (8 steps) at a time, PFD steps ahead of the loads, so DRAM sees 512-byte row bursts.
// PDL (issue 12): launched with programmatic stream serialization, the kernel lets the next
// kernel in the stream launch early and waits for the previous one (griddepcontrol.wait) only
// before it reads x; the first D weight loads are issued before that wait.
// PACK (issue 23): codes in the fragment order of head_gemv.cuh (PackFp8Codes): a lane's 16 bytes
// of one row and step sit at tile * pack_steps * 1024 + step * 1024 + half * 512 + lane * 16, so
// each warp load reads 512 contiguous bytes and a warp's tile is one contiguous stream; no row or
// column clamps (the packing zero-pads rows and steps). PFD > 0 then means: lane 0 prefetches the
// tile's stream into L2 in 4 KB pieces PFD steps ahead of the loads.
// A kernel's knobs (above): depth D, RT 16-row tiles a warp, W warps a CTA, K split KS ways,
// packed codes, the L2::256B hint (row-major codes only), prefetch distance, PDL, dequantization.
// BAL (experiment): CTA b takes the contiguous units [b U / G, (b + 1) U / G) (G = the SMs), kUnits
// at a time, instead of every G-th group of kUnits: each SM's share of the tail within one unit.
template <int D_, int RT_, int W_, int KS_, bool PACK_, bool HINT_ = !PACK_, int PFD_ = 0,
          bool PDL_ = false, int CONV_ = kConvPrmt, bool BAL_ = false>
struct GemvConfig {
  static constexpr bool BAL = BAL_;
  static constexpr int D = D_, RT = RT_, W = W_, KS = KS_, PFD = PFD_, CONV = CONV_;
  static constexpr bool PACK = PACK_, HINT = HINT_, PDL = PDL_;
};

template <int MT, class C>
__global__ void __launch_bounds__(C::W * 32, 1) GemvFp8Kernel(const GemvArgs a) {
  constexpr int D = C::D, CONV = C::CONV, RT = C::RT, W = C::W, KS = C::KS, PFD = C::PFD;
  constexpr bool HINT = C::HINT, PDL = C::PDL, PACK = C::PACK, BAL = C::BAL;
  static_assert(!PACK || (kPackStepAlign / 2 % D == 0 && PFD % 4 == 0 && KS <= 2),
                "packed codes: each half of the padded steps a whole number of pipeline rounds "
                "(the 1-way kernels switch halves on a round boundary); 4 KB prefetch pieces; K in "
                "two halves");
  static_assert(KS == 1 || RT == 1, "split K: 16-row units only");
  constexpr int kWarps = W, kThreads = kWarps * 32, kRows = 16 * RT, kUnits = W / KS;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const bool single = a.chunk_steps >= a.steps;
  const int64_t nblk = (a.n + kRows - 1) / kRows;  // work units of kRows rows
  const int64_t kblocks = a.k / 32;
  const int buf_bytes = MT * 8 * a.row_bytes;  // buffer b starts at smem + b * buf_bytes

  // Whole-x mode: x is issued first but waited for only after the first weight loads are in
  // flight (they do not depend on it).
  if constexpr (PDL) {
    LetDependentsLaunch();
    if (!single) WaitForPrerequisites();
  }
  if (single && !PDL) LoadXChunk<MT, kThreads>(a, smem, 0, a.steps);
  bool x_ready = !single;

  const int unit = warp % kUnits, kpart = warp / kUnits;
  const int part_steps = a.steps / KS;  // a.steps is a multiple of D * KS
  const int s_begin = kpart * part_steps, s_end = s_begin + part_steps;
  const int64_t first = BAL ? nblk * blockIdx.x / gridDim.x : static_cast<int64_t>(blockIdx.x) * kUnits;
  const int64_t lim = BAL ? nblk * (blockIdx.x + 1) / gridDim.x : nblk;
  const int64_t stride = BAL ? kUnits : static_cast<int64_t>(gridDim.x) * kUnits;
  for (int64_t base = first; base < lim; base += stride) {
    const int64_t blk = base + unit;
    const bool active = blk < lim;
    if (KS == 1 && single && !active && x_ready) break;  // no barriers below in this mode
    const int64_t r0 = blk * kRows;
    // Loads are never predicated (that costs selects and moves in the hot loop): rows past n read
    // row n-1 (their outputs are not stored) and columns past k read the last 16 columns (x is
    // zero there). Codes are always finite (the twin never makes the NaN code), so the garbage
    // weights contribute exactly 0.
    const uint8_t* rowp[2 * RT];
    const int64_t bc = min(blk, nblk - 1);
#pragma unroll
    for (int i = 0; i < 2 * RT; ++i) {
      if constexpr (PACK) {
        rowp[i] = a.codes + ((bc * RT + i / 2) * a.pack_steps * 2 + (i & 1)) * 512 + lane * 16;
      } else {
        const int64_t r = min(r0 + g + 8 * i, a.n - 1);
        rowp[i] = a.codes + r * a.k;
      }
    }
    const uint8_t* ep = a.exps + (bc * kRows / 32) * kblocks;
    const int64_t last_col = a.k - 16;
    const int64_t last_kb = kblocks - 1;

    uint4 wq[D][2 * RT];
    uint32_t eq[D];
    auto load = [&](int s, int slot) {
      if (!active || s >= s_end) return;  // warp-uniform
      const int64_t col = PACK ? static_cast<int64_t>(s) * 1024
                               : min(static_cast<int64_t>(s) * 64 + 16 * t, last_col);
#pragma unroll
      for (int i = 0; i < 2 * RT; ++i) wq[slot][i] = LdgStream<HINT>(rowp[i] + col);
      eq[slot] = __ldg(ep + min(static_cast<int64_t>(2 * s + (t >> 1)), last_kb));
    };
    // PACK: tile T's stream starts at tile_base(T); 4 KB pieces (4 steps) PFD steps ahead.
    auto tile_base = [&](int T) { return a.codes + (bc * RT + T) * a.pack_steps * 1024; };
    auto prefetch_packed = [&](int s) {
      if (active && lane == 0 && s + 4 <= a.pack_steps) {
#pragma unroll
        for (int T = 0; T < RT; ++T) PrefetchL2(tile_base(T) + static_cast<int64_t>(s) * 1024, 4096);
      }
    };
    if constexpr (PACK && PFD > D) {
      const int64_t steps = min(static_cast<int64_t>(PFD - D), a.pack_steps - s_begin - D);
      if (active && lane == 0 && steps > 0) {  // the steps between the first loads and the first in-loop prefetch
#pragma unroll
        for (int T = 0; T < RT; ++T)
          PrefetchL2(tile_base(T) + (s_begin + D) * 1024, static_cast<uint32_t>(steps * 1024));
      }
    }
    if constexpr (PFD > 0 && !PACK) {
      if (active && t == 0) {
        const int64_t end = min(static_cast<int64_t>(PFD + 8) * 64, a.k);
#pragma unroll
        for (int i = 0; i < 2 * RT; ++i) PrefetchL2(rowp[i], static_cast<uint32_t>(end));
      }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) load(s_begin + d, d);
    if (!x_ready) {  // every warp of the CTA runs its first round, so all reach this barrier
      if constexpr (PDL) {
        WaitForPrerequisites();
        LoadXChunk<MT, kThreads>(a, smem, 0, a.steps);
      }
      CpAsyncWait<0>();
      __syncthreads();
      x_ready = true;
    }
    if (KS == 1 && single && !active) break;

    float acc[RT][MT][4];
#pragma unroll
    for (int T = 0; T < RT; ++T)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[T][j][c] = 0.f;

    const int nchunks = single ? 1 : (a.steps + a.chunk_steps - 1) / a.chunk_steps;
    if (!single) {
      __syncthreads();  // the previous round's readers are done with buffer 0
      LoadXChunk<MT, kThreads>(a, smem, 0, min(a.chunk_steps, a.steps));
    }
    int chunk_step0 = 0;
    const uint8_t* xs = smem;
    for (int s0 = s_begin; s0 < s_end; s0 += D) {
      if constexpr (PACK && KS == 1) {
        // K in two halves as the K-split kernels add them (first + second), so that every bucket
        // gives a row the same bits: the first half's sums wait in y (this thread's own outputs)
        // and the second is added there by a fire-and-forget `red.add.f32` (round to nearest,
        // subnormals flushed: the K-split kernels add with AddFtz to match).
        if (active && s0 == a.steps / 2) {
#pragma unroll
          for (int T = 0; T < RT; ++T)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const int64_t nn = r0 + 16 * T + g + ((c & 2) ? 8 : 0);
                const int mm = mt * 8 + 2 * t + (c & 1);
                if (mm < a.m && nn < a.n) a.y[mm * a.ldy + nn] = acc[T][mt][c];
                acc[T][mt][c] = 0.f;
              }
        }
      }
      if (!single && s0 % a.chunk_steps == 0) {
        const int q = s0 / a.chunk_steps;
        __syncthreads();  // everyone is done with the buffer chunk q+1 goes to
        if (q + 1 < nchunks) {
          const int next0 = (q + 1) * a.chunk_steps;
          LoadXChunk<MT, kThreads>(a, smem + ((q + 1) & 1) * buf_bytes, next0, min(a.chunk_steps, a.steps - next0));
          CpAsyncWait<1>();
        } else {
          CpAsyncWait<0>();
        }
        __syncthreads();  // chunk q is visible to every warp
        chunk_step0 = s0;
        xs = smem + (q & 1) * buf_bytes;
      }
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int s = s0 + d;
        if constexpr (PFD > 0 && PACK) {
          if ((s & 3) == 0) prefetch_packed(s + PFD);
        } else if constexpr (PFD > 0) {
          if (active && t == 0 && (s & 7) == 0) {
            const int64_t off = static_cast<int64_t>(s + PFD + 8) * 64;
            if (off < a.k) {
              const uint32_t bytes = static_cast<uint32_t>(min(static_cast<int64_t>(512), a.k - off));
#pragma unroll
              for (int i = 0; i < 2 * RT; ++i) PrefetchL2(rowp[i] + off, bytes);
            }
          }
        }
        if (active) {
          const uint32_t scale2 = ScalePair<CONV>(eq[d]);
          // A fragments: af[i][2j] = codes 4j,4j+1 of row i; af[i][2j+1] = codes 4j+2,4j+3.
          uint32_t af[2 * RT][8];
#pragma unroll
          for (int i = 0; i < 2 * RT; ++i) DequantRow16<CONV>(wq[d][i], scale2, af[i]);
          // The slot is free once converted: refill it D steps ahead before the mma work.
          load(s + D, d);
          const uint8_t* xrow = xs + (s - chunk_step0) * 128 + 32 * t;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const XFrag xf = LoadXFrag(xrow + (mt * 8 + g) * a.row_bytes);
            const uint32_t* b = xf.b;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
              for (int T = 0; T < RT; ++T)
                Mma(acc[T][mt], af[2 * T][2 * j], af[2 * T + 1][2 * j], af[2 * T][2 * j + 1],
                    af[2 * T + 1][2 * j + 1], b[2 * j], b[2 * j + 1]);
            }
          }
        }
      }
    }
    if constexpr (KS > 1) {
      // Partial sums of K parts 1.. to shared memory, added by the part-0 warp in part order.
      float* red = reinterpret_cast<float*>(smem + a.red_off);
      constexpr int kPer = MT * 4 * 32;  // floats per warp
      __syncthreads();  // the previous round's readers are done
      if (kpart > 0 && active) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            red[((kpart - 1) * kUnits + unit) * kPer + (mt * 4 + c) * 32 + lane] = acc[0][mt][c];
      }
      __syncthreads();
      if (kpart > 0) continue;
      if (active) {
#pragma unroll
        for (int q = 1; q < KS; ++q)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              acc[0][mt][c] = PACK ? AddFtz(acc[0][mt][c], red[((q - 1) * kUnits + unit) * kPer + (mt * 4 + c) * 32 + lane])
                                   : acc[0][mt][c] + red[((q - 1) * kUnits + unit) * kPer + (mt * 4 + c) * 32 + lane];
      }
    }
    if (!active) continue;
    // C fragment: c0,c1 = (row g, cols 2t, 2t+1), c2,c3 = (row g+8, ...): rows are vocab
    // entries n, cols are batch rows m.
#pragma unroll
    for (int T = 0; T < RT; ++T) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t nn = r0 + 16 * T + g + ((c & 2) ? 8 : 0);
          const int mm = mt * 8 + 2 * t + (c & 1);
          if (mm < a.m && nn < a.n) {
            float* yp = a.y + mm * a.ldy + nn;
            if constexpr (PACK && KS == 1) {
              atomicAdd(yp, acc[T][mt][c]);  // a `red`: no round trip; only this thread writes yp
            } else {
              *yp = acc[T][mt][c];
            }
          }
        }
      }
    }
  }
}

// ---- dispatch -------------------------------------------------------------------------------
// What a launch needs from the device, set up once per (kernel, device): the shared-memory opt-in
// (cudaFuncSetAttribute) and the SM count. The current device is read per launch (a thread-local
// read in the runtime) so that one process may drive several devices.
inline cudaError_t DeviceSms(int dev, int* sms) {
  static std::atomic<int> cache[kMaxDevices] = {};
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    DH_CUDA_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    cache[dev].store(v, std::memory_order_relaxed);
  }
  *sms = v;
  return cudaSuccess;
}
// `prepared`: one bit a device, one per kernel (a static of the caller's instantiation).
inline cudaError_t PrepareKernel(void (*kernel)(GemvArgs), std::atomic<uint64_t>& prepared, int* sms) {
  int dev = 0;
  DH_CUDA_TRY(cudaGetDevice(&dev));
  DH_CUDA_TRY(DeviceSms(dev, sms));  // refuses dev >= kMaxDevices
  return OptInSharedMemory(kernel, kSmemBudget, prepared);
}

template <int MT, class C>
cudaError_t LaunchFast(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                       const uint8_t* exps, int64_t n, float* y, int64_t ldy,
                       cudaStream_t stream) {
  constexpr int D = C::D, RT = C::RT, W = C::W, KS = C::KS;
  constexpr bool PDL = C::PDL, PACK = C::PACK;
  auto kernel = GemvFp8Kernel<MT, C>;
  static std::atomic<uint64_t> prepared{0};
  int sms = 0;
  DH_CUDA_TRY(PrepareKernel(kernel, prepared, &sms));
  GemvArgs a{x, codes, exps, y, k, n, ldy, m, 0, 0, 0, 0, PackedSteps(k)};
  const int raw_steps = static_cast<int>((k + 63) / 64);
  // Packed codes: every kernel walks the padded steps (zeros past k), split in two equal halves.
  a.steps = PACK ? static_cast<int>(a.pack_steps) : (raw_steps + D * KS - 1) / (D * KS) * (D * KS);
  const int rows = MT * 8;
  auto bytes_for = [&](int chunk_steps, int bufs) {
    return static_cast<size_t>(bufs) * rows * (chunk_steps * 128 + 16);
  };
  if (bytes_for(a.steps, 1) <= static_cast<size_t>(kSmemBudget)) {
    a.chunk_steps = a.steps;
  } else {
    const int per_row = kSmemBudget / (2 * rows) - 16;
    a.chunk_steps = per_row / 128 / D * D;
    if (a.chunk_steps < D) return cudaErrorInvalidValue;
  }
  a.row_bytes = a.chunk_steps * 128 + 16;
  size_t smem = bytes_for(a.chunk_steps, a.chunk_steps >= a.steps ? 1 : 2);
  if constexpr (KS > 1) {
    if (a.chunk_steps < a.steps) return cudaErrorNotSupported;  // x must fit whole
    a.red_off = static_cast<int>((smem + 15) / 16 * 16);
    smem = a.red_off + static_cast<size_t>(KS - 1) * (W / KS) * MT * 4 * 32 * 4;
    if (smem > static_cast<size_t>(kSmemBudget)) return cudaErrorNotSupported;
  }
  constexpr int kUnits = W / KS;
  const int64_t nblk = (n + 16 * RT - 1) / (16 * RT);
  const int64_t ctas = (nblk + kUnits - 1) / kUnits;
  const int grid = static_cast<int>(std::min<int64_t>(C::BAL ? nblk : ctas, sms));
  if constexpr (PDL) {
    DH_CUDA_TRY(LaunchDependent(kernel, dim3(grid), dim3(W * 32), smem, stream, a));
  } else {
    kernel<<<grid, W * 32, smem, stream>>>(a);
  }
  return cudaGetLastError();
}

// Codes in fragment order (head_gemv.cuh), m <= 64 (production: DS = DL = 2): buckets 1-2 (m <= 16) on 32 warps a CTA with
// K split in two across warp pairs (depth DS): a shard's ~2000 16-row tiles then keep 32 warps a
// SM busy (docs/cuda.md round 4); where x does not fit whole in shared memory beside the partial
// sums (k above ~6000 at m > 8), on 16 warps x 16 rows; buckets 3-8 on 8 warps x 32 rows (depth
// DL). Every kernel adds K in the same two halves, so a row's outputs do not depend on its batch.
// PFD: lane 0's L2 prefetch distance for buckets 1-2.
// The production configurations (depth D): m <= 16 on 32 warps with K split in two, or on 16
// warps where x does not fit beside the partial sums; m > 16 on 8 warps x 32 rows.
template <int D, bool PDL = false, int PFD = 0>
using PackedSmall = GemvConfig<D, 1, 32, 2, true, false, PFD, PDL>;
template <int D, bool PDL = false, int PFD = 0>
using PackedSmallWholeK = GemvConfig<D, 1, 16, 1, true, false, PFD, PDL>;
template <int D, bool PDL = false>
using PackedLarge = GemvConfig<D, 2, 8, 1, true, false, 0, PDL>;

template <int MT, int DS, bool PDL, int PFD>
cudaError_t LaunchPackedSmall(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                              const uint8_t* exps, int64_t n, float* y, int64_t ldy,
                              cudaStream_t stream) {
  const cudaError_t e =
      LaunchFast<MT, PackedSmall<DS, PDL, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
  if (e != cudaErrorNotSupported) return e;
  return LaunchFast<MT, PackedSmallWholeK<DS, PDL, PFD>>(x, m, k, codes, exps, n, y, ldy, stream);
}

template <int DS, int DL, bool PDL = false, int PFD = 0>
cudaError_t DispatchPacked(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                           const uint8_t* exps, int64_t n, float* y, int64_t ldy,
                           cudaStream_t stream) {
  switch ((m + 7) / 8) {
    case 1: return LaunchPackedSmall<1, DS, PDL, PFD>(x, m, k, codes, exps, n, y, ldy, stream);
    case 2: return LaunchPackedSmall<2, DS, PDL, PFD>(x, m, k, codes, exps, n, y, ldy, stream);
    case 3: return LaunchFast<3, PackedLarge<DL, PDL>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 4: return LaunchFast<4, PackedLarge<DL, PDL>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 5: return LaunchFast<5, PackedLarge<DL, PDL>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 6: return LaunchFast<6, PackedLarge<DL, PDL>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 7: return LaunchFast<7, PackedLarge<DL, PDL>>(x, m, k, codes, exps, n, y, ldy, stream);
    case 8: return LaunchFast<8, PackedLarge<DL, PDL>>(x, m, k, codes, exps, n, y, ldy, stream);
    default: return cudaErrorInvalidValue;
  }
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The argument checks of head_gemv.cuh (cudaErrorInvalidValue).
inline cudaError_t ValidateGemv(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                                const uint8_t* exps, int64_t n, float* y, int64_t ldy) {
  if (m < 1 || n < 1 || k < 32 || k % 32 != 0 || ldy < n) return cudaErrorInvalidValue;
  if (!x || !codes || !exps || !y || !Aligned16(x) || !Aligned16(codes)) return cudaErrorInvalidValue;
  if (n > (int64_t{1} << 40)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// Runs `pass` over chunks of at most 64 rows.
template <typename F>
cudaError_t ByPasses(const uint16_t* x, int m, int64_t k, float* y, int64_t ldy, F&& pass) {
  for (int r = 0; r < m; r += kGemvMaxRowsPerPass) {
    const int mm = std::min(kGemvMaxRowsPerPass, m - r);
    DH_CUDA_TRY(pass(x + static_cast<int64_t>(r) * k, mm, y + static_cast<int64_t>(r) * ldy));
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace drafthead::cuda
