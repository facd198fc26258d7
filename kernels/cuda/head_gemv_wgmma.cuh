// The fp8 GEMV on wgmma (issue 23): the warpgroup MMA of sm_90a with the dequantized weights as
// the register operand A and x^T from shared memory as B, for the buckets where mma.sync is
// issue-bound (M > 16: 64 HMMA + 16 LDS.128 per warp and 2 KB step at M = 64; here 8 wgmma and no
// x loads). Same codes (fragment order, PackFp8Codes), same dequantization, same k16 groups in the
// same order and K in the same two halves as the mma.sync kernels of head_gemv_kernel.cuh, so a
// row's outputs match theirs bit for bit (measured: `CudaGemv.WgmmaRowsAreBatchInvariant`, H100
// 2026-12-05). Production for 17..64 rows (head_gemv.cu); the other configurations (depth 4, wgmma
// below 17 rows) are variants 800-815 of experimental/head_gemv_variants.cu. Internal to
// kernels/cuda (included after head_gemv_kernel.cuh, whose helpers it uses).
//
// Work: 8 warps (2 warpgroups) a CTA; a warp owns a 32-row unit (two 16-row tiles, one exponent
// block) over all of K, as in PackedLarge. wgmma's A is 64 rows: warp w of a warpgroup supplies
// rows 16w..16w+15 of it, which may be any 16 vocabulary rows, so each warp keeps its own unit and
// the four warps issue each wgmma together (inactive warps of the last round compute on a clamped
// unit and store nothing). Per 64-column step and tile: 4 wgmma m64nNk16 (N = 8 * NB >= M).
//
// x in shared memory: wgmma reads B as 8 x 16-byte "core matrices" (K-major, no swizzle). The
// mma.sync kernels pair physical columns with k slots as 16t + 4j + {0,1} -> slots 2t + {0,1} and
// 16t + 4j + {2,3} -> 2t + 8 + {0,1} (head_gemv_kernel.cuh), so x is staged permuted: the 4-byte
// word w = 8t + 2j + h of a batch row's 64-column step goes to slice j (the step's k16 group j),
// core matrix h (k slots 8h..8h+7), 16-byte row (batch row & 7), word t. Offsets: core matrices
// 144 bytes apart along K (LBO), 288 along N (SBO), slices SliceBytes(NB) apart (= 32 mod 128):
// a warp stages one batch row's step (128 contiguous bytes, one cp.async of 4 bytes a lane) into 32
// distinct banks. x whole when it fits, else double-buffered chunks cycling over K (the next
// chunk's steps staged one a step while the current one is computed; the chunk after the last is
// the first again, for the CTA's next round).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/head_gemv_kernel.cuh"

namespace drafthead::cuda {
namespace {

constexpr int kWgmmaWarps = 8;
constexpr uint32_t kXCoreLbo = 144, kXCoreSbo = 288;
__host__ __device__ constexpr int SliceBytes(int nb) {
  return nb * 288 + ((32 - nb * 288) % 128 + 128) % 128;
}
__host__ __device__ constexpr int XStepBytes(int nb) { return 4 * SliceBytes(nb); }

// wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading (K) and stride (N) byte offsets, each >> 4; no swizzle, base offset 0.
__device__ __forceinline__ uint64_t SmemDescriptor(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// After a wait: the accumulators are read (stores) or rewritten only after this point.
template <int L>
__device__ __forceinline__ void FenceAccumulators(float (&r)[L]) {
#pragma unroll
  for (int i = 0; i < L; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The thread's cp.async writes to shared memory made visible to the async proxy (wgmma's reads).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void CpAsync4(uint32_t smem, const void* g, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem), "l"(g), "r"(src_bytes));
}

// wgmma.mma_async m64nNk16, f32 += bf16 x bf16, A from registers ({a0..a3}: the mma.sync
// m16n8k16 A fragment of the warp's 16 rows), B K-major from the descriptor; d: N / 2 floats
// (d[4i + c]: the m16n8 C fragment c of batch columns 8i..8i+7).
template <int N>
struct Wgmma;
template <>
struct Wgmma<8> {
  __device__ __forceinline__ static void Run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3"
                 "}, {%4, %5, %6, %7}, %8, 1, 1, 1, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};
template <>
struct Wgmma<16> {
  __device__ __forceinline__ static void Run(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7"
                 "}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};
template <>
struct Wgmma<32> {
  __device__ __forceinline__ static void Run(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};
template <>
struct Wgmma<64> {
  __device__ __forceinline__ static void Run(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
                   "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

// Stages one 64-column step of x (global step `step`) for every batch row into the slices of
// local step `ls` of the buffer at `buf` (the layout above); rows past m and columns past k are
// zeros. Warp w of W stages rows w, w + W, ...: one batch row's 128 bytes a cp.async instruction.
template <int NB, int W>
__device__ __forceinline__ void StageXStep(const GemvArgs& a, uint32_t buf, int step, int ls) {
  // 8 warps: production's code as measured (docs/cuda.md round 5); more warps (round 7) index x in
  // 32 bits (LaunchWgmma's bound), which keeps the 128-register kernels from spilling.
  using Index = std::conditional_t<W == 8, int64_t, int>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = lane >> 3, j = (lane >> 1) & 3, h = lane & 1;
  const Index col = static_cast<Index>(step) * 64 + 2 * lane, kk = static_cast<Index>(a.k);
  const uint32_t dst0 = buf + (ls * 4 + j) * SliceBytes(NB) + h * kXCoreLbo + t * 4;
#pragma unroll
  for (int it = 0; it < (8 * NB + W - 1) / W; ++it) {
    const int row = warp + W * it;  // core-matrix row row / 8, 16-byte row row % 8
    if (8 * NB % W != 0 && row >= 8 * NB) break;  // warp-uniform
    const int core = W == 8 ? it : row >> 3, row16 = W == 8 ? warp : row & 7;
    const bool ok = row < a.m && col < kk;
    CpAsync4(dst0 + core * kXCoreSbo + row16 * 16, ok ? a.x + row * kk + col : a.x, ok ? 4u : 0u);
  }
}

// NB: N / 8 (batch rows padded to N); D: register pipeline depth of the weight loads (as in
// GemvFp8Kernel); PDL: programmatic dependent launch (the first weight loads before the wait);
// OVERLAP: a step's wgmmas run while the next step dequantizes (two sets of A registers live), else
// each step waits for its own (one set: registers for D = 4); PF > 0 (a multiple of 4, experiment):
// lane 0 prefetches each tile's stream into L2 in 4 KB pieces PF steps ahead of the loads (more
// bytes in flight without registers: at N = 64 the kernel holds 2 warps a scheduler and D = 2);
// W warps a CTA, each owning RT 16-row tiles (a unit): 8 x 2 (production) or 16 x 1 (round 7: half
// the accumulators and A registers a warp, for twice the warps and D = 4 at N = 64).
template <int NB, int D, bool PDL, bool OVERLAP = true, int PF = 0, int W = kWgmmaWarps, int RT = 2>
__global__ void __launch_bounds__(W * 32, 1) GemvFp8WgmmaKernel(const GemvArgs a) {
  constexpr int N = NB * 8, kAcc = N / 2;
  static_assert((RT == 1 || RT == 2) && W % 4 == 0, "units of one or two tiles; whole warpgroups");
  static_assert(kPackStepAlign / 2 % D == 0, "each half of the padded steps a whole number of rounds");
  static_assert(PF == 0 || (PF % 4 == 0 && PF > D), "4 KB prefetch pieces, beyond the register pipeline");
  extern __shared__ __align__(128) uint8_t wgmma_smem[];  // its own name: head_gemv_kernel.cuh declares smem[] 16-aligned
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int S = a.steps, C = a.chunk_steps;
  const int nchunks = (S + C - 1) / C;
  const int64_t nblk = (a.n + 16 * RT - 1) / (16 * RT);  // units
  const int64_t kblocks = a.k / 32, last_kb = kblocks - 1;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(wgmma_smem));
  const uint32_t buf_bytes = static_cast<uint32_t>(C) * XStepBytes(NB);

  if constexpr (PDL) LetDependentsLaunch();
  int cq = -1;  // sequence number of the chunk being computed (its buffer: cq & 1)
  const int64_t first = static_cast<int64_t>(blockIdx.x) * W;
  for (int64_t base = first; base < nblk; base += static_cast<int64_t>(gridDim.x) * W) {
    const int64_t blk = base + warp;
    const bool active = blk < nblk;
    const int64_t bc = min(blk, nblk - 1);
    const uint8_t* rowp[2 * RT];
#pragma unroll
    for (int i = 0; i < 2 * RT; ++i)
      rowp[i] = a.codes + ((bc * RT + i / 2) * a.pack_steps * 2 + (i & 1)) * 512 + lane * 16;
    const uint8_t* ep = a.exps + (bc * RT >> 1) * kblocks;  // the unit's 32-row exponent block
    uint4 wq[D][2 * RT];
    uint32_t eq[D];
    auto load = [&](int s, int slot) {
      if (s >= S) return;  // uniform
#pragma unroll
      for (int i = 0; i < 2 * RT; ++i) wq[slot][i] = LdgStream<false>(rowp[i] + static_cast<int64_t>(s) * 1024);
      eq[slot] = __ldg(ep + min(static_cast<int64_t>(2 * s + (t >> 1)), last_kb));
    };
    // PF: tile T's stream starts at tile_base(T); the steps between the first loads and the first
    // in-loop prefetch go at once.
    auto tile_base = [&](int T) { return a.codes + (bc * RT + T) * a.pack_steps * 1024; };
    auto prefetch = [&](int s) {
      if (active && lane == 0 && s + 4 <= S) {
#pragma unroll
        for (int T = 0; T < RT; ++T) PrefetchL2(tile_base(T) + static_cast<int64_t>(s) * 1024, 4096);
      }
    };
    if constexpr (PF > 0) {
      if (active && lane == 0 && S > D) {
#pragma unroll
        for (int T = 0; T < RT; ++T)
          PrefetchL2(tile_base(T) + D * 1024, static_cast<uint32_t>(min(PF - D, S - D)) * 1024u);
      }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) load(d, d);
    if (base == first) {  // chunk 0 into buffer 0 (later rounds find it staged by the previous one)
      if constexpr (PDL) WaitForPrerequisites();
      for (int ls = 0; ls < min(C, S); ++ls) StageXStep<NB, W>(a, smem0, ls, ls);
      CpAsyncCommit();
    }

    float acc[RT][kAcc];
#pragma unroll
    for (int T = 0; T < RT; ++T)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[T][i] = 0.f;
    // acc[T][4i + c] is the mma.sync C fragment c of batch columns 8i..: row 16T + g (+8 for
    // c >= 2), batch row 8i + 2t + (c & 1).
    auto for_outputs = [&](auto&& f) {
      if (!active) return;
#pragma unroll
      for (int T = 0; T < RT; ++T)
#pragma unroll
        for (int i = 0; i < NB; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int64_t nn = blk * 16 * RT + 16 * T + g + ((c & 2) ? 8 : 0);
            const int mm = i * 8 + 2 * t + (c & 1);
            if (mm < a.m && nn < a.n) f(a.y + mm * a.ldy + nn, acc[T][4 * i + c]);
          }
    };

    uint32_t xbuf = smem0, next_buf = smem0;
    int chunk_step0 = 0, cur_len = 0, next_q = 0, next_len = 0;
    for (int s0 = 0; s0 < S; s0 += D) {
      if (s0 == S / 2) {
        // K in two halves, as every mma.sync kernel adds them: the first half's sums wait in y
        // and the second is added there by a `red.add` at the end.
        WgmmaWait<0>();
#pragma unroll
        for (int T = 0; T < RT; ++T) FenceAccumulators(acc[T]);
        for_outputs([](float* yp, float& v) { *yp = v; });
#pragma unroll
        for (int T = 0; T < RT; ++T)
#pragma unroll
          for (int i = 0; i < kAcc; ++i) acc[T][i] = 0.f;
      }
      if (s0 % C == 0) {
        // Chunk s0 / C begins: its cp.asyncs are done and visible to wgmma, and every wgmma of
        // the previous chunk (whose buffer the next chunk goes to) is done.
        WgmmaWait<0>();
        CpAsyncWait<0>();
        FenceProxyAsyncShared();
        __syncthreads();
        ++cq;
        const int q = s0 / C;
        chunk_step0 = s0;
        cur_len = min(C, S - s0);
        xbuf = smem0 + (nchunks > 1 ? (cq & 1) * buf_bytes : 0u);
        next_buf = smem0 + ((cq + 1) & 1) * buf_bytes;
        next_q = q + 1 < nchunks ? q + 1 : 0;
        next_len = nchunks > 1 ? min(C, S - next_q * C) : 0;
      }
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int s = s0 + d, ls = s - chunk_step0;
        if (ls < next_len) {
          // One step of the next chunk a step of this one; all the rest at this chunk's last step
          // (the last chunk may be shorter than the first, which follows it).
          const int upto = ls == cur_len - 1 ? next_len : ls + 1;
          for (int j = ls; j < upto; ++j) StageXStep<NB, W>(a, next_buf, next_q * C + j, j);
          CpAsyncCommit();
        }
        const uint32_t scale2 = ScalePair<kConvPrmt>(eq[d]);
        uint32_t af[2 * RT][8];  // as in GemvFp8Kernel: af[i][2j] codes 4j, 4j+1 of row i, ...
#pragma unroll
        for (int i = 0; i < 2 * RT; ++i) DequantRow16<kConvPrmt>(wq[d][i], scale2, af[i]);
        load(s + D, d);
        if constexpr (PF > 0) {
          if ((s & 3) == 0) prefetch(s + PF);
        }
        WgmmaFence();
        const uint32_t step_addr = xbuf + ls * XStepBytes(NB);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint64_t desc = SmemDescriptor(step_addr + j * SliceBytes(NB), kXCoreLbo, kXCoreSbo);
#pragma unroll
          for (int T = 0; T < RT; ++T)
            Wgmma<N>::Run(acc[T], af[2 * T][2 * j], af[2 * T + 1][2 * j], af[2 * T][2 * j + 1],
                          af[2 * T + 1][2 * j + 1], desc);
        }
        WgmmaCommit();
        if constexpr (OVERLAP) {
          WgmmaWait<1>();  // the previous step's wgmmas are done with their A registers
        } else {
          WgmmaWait<0>();
        }
      }
    }
    WgmmaWait<0>();
#pragma unroll
    for (int T = 0; T < RT; ++T) FenceAccumulators(acc[T]);
    for_outputs([](float* yp, float& v) { atomicAdd(yp, v); });  // a `red`: only this thread writes yp
  }
  CpAsyncWait<0>();  // the chunk staged for a round that did not come
}

// m <= 64 rows in one launch: N = the smallest of 8, 16, 32, 64 that holds m; 1 CTA an SM.
template <int NB, int D, bool PDL, bool OVERLAP, int PF = 0, int W = kWgmmaWarps, int RT = 2>
cudaError_t LaunchWgmma(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                        int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  auto kernel = GemvFp8WgmmaKernel<NB, D, PDL, OVERLAP, PF, W, RT>;
  static std::atomic<uint64_t> prepared{0};
  int sms = 0;
  DH_CUDA_TRY(PrepareKernel(kernel, prepared, &sms));
  // StageXStep's 32-bit offsets into x beyond 8 warps (round 7).
  if (W != 8 && static_cast<int64_t>(m) * k >= (int64_t{1} << 31) - 64) return cudaErrorInvalidValue;
  GemvArgs a{x, codes, exps, y, k, n, ldy, m, 0, 0, 0, 0, PackedSteps(k)};
  a.steps = static_cast<int>(a.pack_steps);
  const size_t step_bytes = XStepBytes(NB);
  size_t smem = a.steps * step_bytes;
  if (smem <= static_cast<size_t>(kSmemBudget)) {
    a.chunk_steps = a.steps;
  } else {
    a.chunk_steps = static_cast<int>(kSmemBudget / (2 * step_bytes)) / D * D;
    if (a.chunk_steps < D) return cudaErrorInvalidValue;
    smem = 2 * a.chunk_steps * step_bytes;
  }
  const int64_t units = (n + 16 * RT - 1) / (16 * RT);
  const int grid = static_cast<int>(std::min<int64_t>((units + W - 1) / W, sms));
  if constexpr (PDL) {
    DH_CUDA_TRY(LaunchDependent(kernel, dim3(grid), dim3(W * 32), smem, stream, a));
  } else {
    kernel<<<grid, W * 32, smem, stream>>>(a);
  }
  return cudaGetLastError();
}

// SMALL: buckets 1-2 (m <= 16) on wgmma too (N = 8 / 16), else on the production mma.sync kernel.
// D32: the depth for N <= 32 (N = 64 at depth 4 spills registers; N = 32 does not); PF: the L2
// prefetch distance (experiment; 0: none); W, RT: warps a CTA and tiles a warp (the kernel's).
template <int D, bool PDL, bool SMALL, bool OVERLAP = true, int D32 = D, int PF = 0, int W = kWgmmaWarps,
          int RT = 2>
cudaError_t DispatchWgmma(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                          int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  if (m <= 16 && !SMALL) return DispatchPacked<2, 2, PDL>(x, m, k, codes, exps, n, y, ldy, stream);
  if (m <= 8) return LaunchWgmma<1, D32, PDL, OVERLAP, PF, W, RT>(x, m, k, codes, exps, n, y, ldy, stream);
  if (m <= 16) return LaunchWgmma<2, D32, PDL, OVERLAP, PF, W, RT>(x, m, k, codes, exps, n, y, ldy, stream);
  if (m <= 32) return LaunchWgmma<4, D32, PDL, OVERLAP, PF, W, RT>(x, m, k, codes, exps, n, y, ldy, stream);
  if (m <= 64) return LaunchWgmma<8, D, PDL, OVERLAP, PF, W, RT>(x, m, k, codes, exps, n, y, ldy, stream);
  return cudaErrorInvalidValue;
}

// The production configuration (HeadGemvFp8; docs/cuda.md round 5): mma.sync up to 16 rows, wgmma
// at depth 4 for 17..32 and 2 for 33..64, all with PDL. PF: the prefetch experiments (820-822).
template <int PF = 0>
cudaError_t DispatchProduction(const uint16_t* x, int m, int64_t k, const uint8_t* codes, const uint8_t* exps,
                               int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  return DispatchWgmma<2, true, false, true, 4, PF>(x, m, k, codes, exps, n, y, ldy, stream);
}

}  // namespace
}  // namespace drafthead::cuda
