#include "kernels/cuda/shard_reduce.cuh"

#include <algorithm>

#include "kernels/candidate.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/numeric.h"

namespace drafthead::cuda {
namespace {

constexpr float kNegInf = -__builtin_huge_valf();

// ---- FULL_LOGITS ------------------------------------------------------------------------------
__global__ void __launch_bounds__(256) FullLogitsKernel(const float* __restrict__ y, int64_t ldy,
                                                        int64_t n, const ReduceRow* __restrict__ rows,
                                                        uint8_t* __restrict__ payload) {
  const ReduceRow r = rows[blockIdx.y];
  if (r.mode != static_cast<uint8_t>(ReduceMode::kFullLogits)) return;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (j >= n) return;
  if (r.out_bf16) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(payload + r.out_offset);
    if (j + 4 <= n) {
      const float4 v = *reinterpret_cast<const float4*>(src + j);
      uint2 o;
      o.x = FloatToBf16(v.x) | (static_cast<uint32_t>(FloatToBf16(v.y)) << 16);
      o.y = FloatToBf16(v.z) | (static_cast<uint32_t>(FloatToBf16(v.w)) << 16);
      if ((j & 3) == 0 && ((r.out_offset & 7) == 0)) {
        *reinterpret_cast<uint2*>(dst + j) = o;
        return;
      }
    }
    for (int64_t c = j; c < n && c < j + 4; ++c) dst[c] = FloatToBf16(src[c]);
  } else {
    float* dst = reinterpret_cast<float*>(payload + r.out_offset);
    if (j + 4 <= n) {
      *reinterpret_cast<float4*>(dst + j) = *reinterpret_cast<const float4*>(src + j);
      return;
    }
    for (int64_t c = j; c < n; ++c) dst[c] = src[c];
  }
}

// ---- helpers ----------------------------------------------------------------------------------
__device__ __forceinline__ void WriteRecord(uint8_t* out, SoftmaxPartial p, const Candidate& c,
                                            uint32_t i) {
  if (i == 0) {
    float* pf = reinterpret_cast<float*>(out);
    pf[0] = p.max_scaled;
    pf[1] = p.sum_exp;
  }
  uint32_t* cw = reinterpret_cast<uint32_t*>(out + sizeof(SoftmaxPartial) + i * sizeof(Candidate));
  cw[0] = static_cast<uint32_t>(c.id);
  cw[1] = __float_as_uint(c.key);
  cw[2] = __float_as_uint(c.logit);
}

__device__ __forceinline__ Candidate ShflCand(const Candidate& c, int off) {
  Candidate o;
  o.id = __shfl_xor_sync(0xffffffffu, c.id, off);
  o.key = __shfl_xor_sync(0xffffffffu, c.key, off);
  o.logit = __shfl_xor_sync(0xffffffffu, c.logit, off);
  return o;
}

// ---- ARGMAX / SAMPLE --------------------------------------------------------------------------
constexpr int kBestThreads = 512;

__global__ void __launch_bounds__(kBestThreads) BestKernel(const float* __restrict__ y, int64_t ldy,
                                                           int64_t n_valid, int32_t id_base,
                                                           const ReduceRow* __restrict__ rows,
                                                           uint8_t* __restrict__ payload) {
  const ReduceRow r = rows[blockIdx.x];
  const bool sample = r.mode == static_cast<uint8_t>(ReduceMode::kSample);
  if (!sample && r.mode != static_cast<uint8_t>(ReduceMode::kArgmax)) return;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  Candidate best{-1, kNegInf, 0.f};
  for (int64_t j = threadIdx.x; j < n_valid; j += kBestThreads) {
    const uint32_t id = static_cast<uint32_t>(id_base + j);
    const float v = src[j];
    float key = v;
    if (sample) {
      key = SampleKey(v, r.temperature, r.seed, r.row_in_request, id);
      // x86 propagates a NaN operand's payload (quieted); the GPU makes a canonical NaN.
      if (key != key && v != v) key = __uint_as_float(__float_as_uint(v) | 0x00400000u);
    }
    const Candidate c{static_cast<int32_t>(id), key, v};
    if (CandidateBefore(c, best)) best = c;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Candidate o = ShflCand(best, off);
    if (CandidateBefore(o, best)) best = o;
  }
  __shared__ Candidate warp_best[kBestThreads / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < kBestThreads / 32 ? warp_best[lane] : Candidate{-1, kNegInf, 0.f};
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const Candidate o = ShflCand(best, off);
      if (CandidateBefore(o, best)) best = o;
    }
    if (lane == 0) WriteRecord(payload + r.out_offset, SoftmaxPartial{0.f, 0.f}, best, 0);
  }
}

// ---- TOP_K ------------------------------------------------------------------------------------
constexpr int kTopKThreads = 1024;

// Unique sort key: larger is better. High word: the candidate order of the logit (NaN as -inf,
// -0 as +0 so they tie as the CPU's float compare does); low word: ~id, so ties go to smaller ids.
__device__ __forceinline__ uint64_t TopKKey(float v, uint32_t id) {
  float f = OrderKey(v);
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(ord) << 32) | (0xffffffffu - id);
}

__device__ __forceinline__ double BlockSumDouble(double v, double* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += scratch[w];
  return s;  // valid in thread 0
}

// Row values are staged in dynamic shared memory when they fit (a tp >= 3 shard of the default
// vocabulary), so the select passes read shared memory; longer rows are re-read from global/L2.
constexpr int kTopKSmemFloats = 40960;  // 160 KB

// The CPU's running std::max keeps the first of equal values (it matters for -0 vs +0): reduce
// (value, index) pairs, larger value first, then the smaller index; NaN never wins.
struct MaxAt {
  float v;
  int64_t j;
};
__device__ __forceinline__ MaxAt Better(MaxAt a, MaxAt b) {
  if (b.v > a.v || (b.v == a.v && b.j < a.j)) return b;
  return a;
}

// Rows longer than the shared-memory stage are cut into segments (blockIdx.y): each segment's
// CTA writes its own record (partial + k candidates) to scratch, and TopKMerge combines them.
constexpr size_t kSegRecord = (sizeof(SoftmaxPartial) + kMaxTopK * sizeof(Candidate) + 15) & ~size_t{15};
constexpr int kMergeMaxKeys = 16384;  // segments x k the merge can hold (128 KB of keys)

__global__ void __launch_bounds__(kTopKThreads, 1) TopKKernel(const float* __restrict__ y, int64_t ldy,
                                                           int64_t n_valid_row, int32_t id_base_row,
                                                           const ReduceRow* __restrict__ rows,
                                                           uint8_t* __restrict__ payload,
                                                           int smem_floats, int64_t seg_len,
                                                           uint8_t* __restrict__ scratch,
                                                           uint32_t min_k) {
  const ReduceRow r = rows[blockIdx.x];
  if (r.mode != static_cast<uint8_t>(ReduceMode::kTopK) || r.k < min_k || r.k == 0 || r.k > kMaxTopK)
    return;
  extern __shared__ float staged[];
  const int segs = gridDim.y, seg = blockIdx.y;
  const int64_t c0 = seg * seg_len;
  const int64_t rest = n_valid_row - c0;
  const int64_t n_valid = rest < 0 ? 0 : (rest < seg_len ? rest : seg_len);
  const int32_t id_base = id_base_row + static_cast<int32_t>(c0);
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy + c0;
  const bool in_smem = n_valid <= smem_floats;
  const uint32_t k = r.k;
  const float T = r.temperature;

  __shared__ uint32_t hist[256];
  __shared__ uint32_t whist[kTopKThreads / 32][256];
  __shared__ uint64_t keys[kMaxTopK];
  __shared__ MaxAt red[kTopKThreads / 32];
  __shared__ double dred[kTopKThreads / 32];
  __shared__ uint64_t s_prefix, s_mask;
  __shared__ uint32_t s_need, s_done, s_count;
  __shared__ float s_max;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // Softmax max of v / T (fp32 division), staging the row on the way.
  MaxAt best{kNegInf, INT64_MAX};
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < n_valid; j += kTopKThreads) {
    const float v = src[j];
    if (in_smem) staged[j] = v;
    best = Better(best, MaxAt{v / T, j});
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    MaxAt o;
    o.v = __shfl_xor_sync(0xffffffffu, best.v, off);
    o.j = __shfl_xor_sync(0xffffffffu, best.j, off);
    best = Better(best, o);
  }
  if (lane == 0) red[warp] = best;
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_need = k;
    s_done = n_valid <= static_cast<int64_t>(k);  // everything is selected
    s_count = 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxAt m{kNegInf, INT64_MAX};
    for (int w = 0; w < kTopKThreads / 32; ++w) m = Better(m, red[w]);
    s_max = m.v;
  }
  const float* vals = in_smem ? staged : src;

  // Radix select, 8 bits at a time from the top, until the elements matching the prefix are
  // exactly the ones still needed.
  for (int pass = 0; pass < 8; ++pass) {
    __syncthreads();
    if (s_done) break;
    const int shift = 56 - 8 * pass;
    const uint64_t prefix = s_prefix, mask = s_mask;
    // Per-warp histograms: early passes put most elements in a few digits, and shared atomics
    // on one address from the whole block serialize.
    for (int i = threadIdx.x; i < 32 * 256; i += kTopKThreads) (&whist[0][0])[i] = 0;
    __syncthreads();
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < n_valid; j += kTopKThreads) {
      const uint64_t key = TopKKey(vals[j], static_cast<uint32_t>(id_base + j));
      if ((key & mask) == prefix) atomicAdd(&whist[warp][(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 256) {
      uint32_t h = 0;
      for (int w = 0; w < kTopKThreads / 32; ++w) h += whist[w][threadIdx.x];
      hist[threadIdx.x] = h;
    }
    __syncthreads();
    if (warp == 0) {
      // lane l owns digits 255 - 8l .. 248 - 8l (descending); find where the count from the top
      // reaches `need`.
      const uint32_t need = s_need;
      uint32_t local = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) local += hist[255 - 8 * lane - i];
      uint32_t incl = local;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const uint32_t o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
      }
      const uint32_t excl = incl - local;
      const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
      const int owner = __ffs(hit) - 1;  // need <= total, so some lane reaches it
      if (lane == owner) {
        uint32_t cum = excl;
        int d = 255 - 8 * lane;
        for (int i = 0; i < 8; ++i, --d) {
          const uint32_t h = hist[d];
          if (cum + h >= need) break;
          cum += h;
        }
        s_need = need - cum;  // still needed inside digit d
        s_prefix = prefix | (static_cast<uint64_t>(d) << shift);
        s_mask = mask | (uint64_t{255} << shift);
        s_done = hist[d] == need - cum;
      }
    }
  }
  __syncthreads();

  // Collect the winners (exactly min(k, n_valid) of them) and the sum of exponentials.
  const uint64_t prefix = s_prefix, mask = s_mask;
  const float gmax = s_max;
  const bool finite_max = n_valid > 0 && isfinite(gmax);
  double sum = 0.0;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < n_valid; j += kTopKThreads) {
    const float v = vals[j];
    const uint64_t key = TopKKey(v, static_cast<uint32_t>(id_base + j));
    if ((key & mask) >= prefix) {
      const uint32_t pos = atomicAdd(&s_count, 1u);
      if (pos < kMaxTopK) keys[pos] = key;
    }
    if (finite_max) sum += exp(static_cast<double>(v / T) - static_cast<double>(gmax));
  }
  const double total = BlockSumDouble(sum, dred);
  __syncthreads();
  const uint32_t cnt = min(s_count, kMaxTopK);
  uint32_t p2 = 1;
  while (p2 < cnt) p2 <<= 1;
  for (uint32_t i = cnt + threadIdx.x; i < p2; i += kTopKThreads) keys[i] = 0;  // sorts last
  __syncthreads();
  // Bitonic sort, descending.
  for (uint32_t size = 2; size <= p2; size <<= 1) {
    for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (uint32_t i = threadIdx.x; i < p2; i += kTopKThreads) {
        const uint32_t jx = i ^ stride;
        if (jx > i) {
          const bool desc = (i & size) == 0;
          const uint64_t a = keys[i], b = keys[jx];
          if (desc ? (a < b) : (a > b)) {
            keys[i] = b;
            keys[jx] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  uint8_t* out = segs == 1 ? payload + r.out_offset
                           : scratch + (static_cast<size_t>(blockIdx.x) * segs + seg) * kSegRecord;
  for (uint32_t i = threadIdx.x; i < k; i += kTopKThreads) {
    Candidate c{-1, kNegInf, 0.f};
    if (i < cnt) {
      const uint32_t id = 0xffffffffu - static_cast<uint32_t>(keys[i] & 0xffffffffu);
      const float v = vals[static_cast<int64_t>(id) - id_base];  // the logit itself (NaN kept)
      c = Candidate{static_cast<int32_t>(id), v, v};
    }
    uint32_t* cw =
        reinterpret_cast<uint32_t*>(out + sizeof(SoftmaxPartial) + i * sizeof(Candidate));
    cw[0] = static_cast<uint32_t>(c.id);
    cw[1] = __float_as_uint(c.key);
    cw[2] = __float_as_uint(c.logit);
  }
  if (threadIdx.x == 0) {
    float* pf = reinterpret_cast<float*>(out);
    pf[0] = gmax;
    pf[1] = finite_max ? static_cast<float>(total) : 0.f;
  }
}

// Combines a row's segment records: the softmax partials (the first segment with the largest
// max wins ties, as the CPU's running max; the sums rescaled in double) and the candidates (all
// segments' lists sorted together by the same 64-bit key, the best k kept).
__global__ void __launch_bounds__(kTopKThreads, 1) TopKMerge(const float* __restrict__ y, int64_t ldy,
                                                          int32_t id_base,
                                                          const ReduceRow* __restrict__ rows,
                                                          uint8_t* __restrict__ payload, int segs,
                                                          const uint8_t* __restrict__ scratch,
                                                          uint32_t min_k) {
  const ReduceRow r = rows[blockIdx.x];
  if (r.mode != static_cast<uint8_t>(ReduceMode::kTopK) || r.k < min_k || r.k == 0 || r.k > kMaxTopK)
    return;
  extern __shared__ uint64_t mkeys[];
  __shared__ uint32_t s_count;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  const uint32_t k = r.k;
  const uint8_t* rec0 = scratch + static_cast<size_t>(blockIdx.x) * segs * kSegRecord;
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < segs * static_cast<int>(k); i += kTopKThreads) {
    const int sg = i / k, q = i - sg * k;
    const uint32_t* cw = reinterpret_cast<const uint32_t*>(rec0 + sg * kSegRecord +
                                                           sizeof(SoftmaxPartial) + q * sizeof(Candidate));
    const int32_t id = static_cast<int32_t>(cw[0]);
    if (id >= 0) {
      const uint32_t pos = atomicAdd(&s_count, 1u);
      mkeys[pos] = TopKKey(__uint_as_float(cw[2]), static_cast<uint32_t>(id));
    }
  }
  __syncthreads();
  const uint32_t cnt = s_count;
  uint32_t p2 = 1;
  while (p2 < cnt) p2 <<= 1;
  for (uint32_t i = cnt + threadIdx.x; i < p2; i += kTopKThreads) mkeys[i] = 0;
  __syncthreads();
  for (uint32_t size = 2; size <= p2; size <<= 1) {
    for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (uint32_t i = threadIdx.x; i < p2; i += kTopKThreads) {
        const uint32_t jx = i ^ stride;
        if (jx > i) {
          const bool desc = (i & size) == 0;
          const uint64_t a = mkeys[i], b = mkeys[jx];
          if (desc ? (a < b) : (a > b)) {
            mkeys[i] = b;
            mkeys[jx] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  uint8_t* out = payload + r.out_offset;
  for (uint32_t i = threadIdx.x; i < k; i += kTopKThreads) {
    Candidate c{-1, kNegInf, 0.f};
    if (i < cnt) {
      const uint32_t id = 0xffffffffu - static_cast<uint32_t>(mkeys[i] & 0xffffffffu);
      const float v = src[static_cast<int64_t>(id) - id_base];
      c = Candidate{static_cast<int32_t>(id), v, v};
    }
    uint32_t* cw = reinterpret_cast<uint32_t*>(out + sizeof(SoftmaxPartial) + i * sizeof(Candidate));
    cw[0] = static_cast<uint32_t>(c.id);
    cw[1] = __float_as_uint(c.key);
    cw[2] = __float_as_uint(c.logit);
  }
  if (threadIdx.x == 0) {
    float best = kNegInf;
    for (int sg = 0; sg < segs; ++sg) {
      const float m = reinterpret_cast<const float*>(rec0 + sg * kSegRecord)[0];
      if (m > best) best = m;  // strict: the first of equal maxima, as the CPU
    }
    double sum = 0.0;
    if (isfinite(best)) {
      for (int sg = 0; sg < segs; ++sg) {
        const float* pf = reinterpret_cast<const float*>(rec0 + sg * kSegRecord);
        if (pf[1] > 0.f || pf[1] != pf[1])
          sum += static_cast<double>(pf[1]) * exp(static_cast<double>(pf[0]) - static_cast<double>(best));
      }
    }
    float* pf = reinterpret_cast<float*>(out);
    pf[0] = best;
    pf[1] = isfinite(best) ? static_cast<float>(sum) : 0.f;
  }
}

// ---- split reductions (TOP_K k <= kSmallTopK, ARGMAX, SAMPLE) ---------------------------------
// Each row is cut into chunks of `chunk` columns (blockIdx.x), one 256-thread CTA each, so a row
// is spread over many SMs; every CTA writes a small record to scratch and SplitMerge (one CTA per
// row) combines them. The candidate orders are total (unique ids), so the result does not depend on
// how the row was cut: bit-identical to the CPU.
//
// TOP_K inside a CTA: each thread's largest key is a lower bound for its own elements; the k-th
// largest of the 256 thread maxima, t, is a lower bound for the chunk's k-th largest key (k distinct
// elements are >= t), and only the k threads with maxima >= t can hold keys >= t: at most
// k x (elements per thread) candidates, ranked by counting (keys are unique).
constexpr uint32_t kSmallTopK = 64;
constexpr int kSplitThreads = 256;
constexpr int kSplitMaxChunk = 4096;   // columns per CTA (staged: 16 KB)
constexpr int kSplitMaxChunks = 128;   // chunks per row
constexpr size_t kSplitRec = 16 + kSmallTopK * 8;  // {max f32, pad, sum f64} + k keys (or a Candidate)
constexpr int kSplitMergeCand = kSmallTopK * ((kSplitMaxChunks * kSmallTopK + kSplitThreads - 1) / kSplitThreads);

__device__ __forceinline__ bool SmallTopKRow(const ReduceRow& r) {
  return r.mode == static_cast<uint8_t>(ReduceMode::kTopK) && r.k >= 1 && r.k <= kSmallTopK;
}
__device__ __forceinline__ bool BestRow(const ReduceRow& r) {
  return r.mode == static_cast<uint8_t>(ReduceMode::kArgmax) ||
         r.mode == static_cast<uint8_t>(ReduceMode::kSample);
}

// A thread's elements of its chunk: columns 4 (threadIdx.x + 256 i) + {0..3}, i < kSplitIt, all
// loads issued before any is used (the chunk is in L2: one round trip instead of kSplitIt).
constexpr int kSplitIt = kSplitMaxChunk / (kSplitThreads * 4);
__device__ __forceinline__ void LoadChunk(const float* __restrict__ src, int len,
                                          float (&v)[kSplitIt][4]) {
#pragma unroll
  for (int it = 0; it < kSplitIt; ++it) {
    const int j = (threadIdx.x + it * kSplitThreads) * 4;
    if (j + 4 <= len) {
      const float4 q = *reinterpret_cast<const float4*>(src + j);
      v[it][0] = q.x, v[it][1] = q.y, v[it][2] = q.z, v[it][3] = q.w;
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u) v[it][u] = j + u < len ? src[j + u] : 0.f;
    }
  }
}

__device__ __forceinline__ MaxAt ShflMaxAt(MaxAt a, int off) {
  MaxAt o;
  o.v = __shfl_xor_sync(0xffffffffu, a.v, off);
  o.j = __shfl_xor_sync(0xffffffffu, a.j, off);
  return o;
}

// Block-wide best candidate (valid in every thread). `red` holds kSplitThreads / 32 entries.
__device__ __forceinline__ Candidate BlockBestCandidate(Candidate best, Candidate* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Candidate o = ShflCand(best, off);
    if (CandidateBefore(o, best)) best = o;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = best;
  __syncthreads();
  best = red[0];
  for (int w = 1; w < kSplitThreads / 32; ++w)
    if (CandidateBefore(red[w], best)) best = red[w];
  return best;
}

// Sorts a warp's 32 keys, descending: lane l gets the l-th largest (bitonic, shuffles).
__device__ __forceinline__ uint64_t WarpSortDesc(uint64_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const uint64_t o = __shfl_xor_sync(0xffffffffu, v, stride);
      const bool lower = (lane & stride) == 0;
      const bool desc = (lane & size) == 0;  // size == 32: the whole warp descending
      const bool keep_max = lower == desc;
      v = keep_max ? (v > o ? v : o) : (v < o ? v : o);
    }
  }
  return v;
}

// The threshold t of the comment above: the k-th largest of the 256 thread maxima tm (0 = none),
// or 1 (every real key) when fewer than k threads hold elements. Each warp sorts its 32 maxima
// into s_sorted; a thread's rank is the sum over the 8 lists of a binary search (count of
// larger keys). Sets *s_t (thread 0 must have set it to 1 before the first barrier here).
__device__ __forceinline__ void ThresholdFromMaxima(uint64_t (*s_sorted)[32], uint64_t tm,
                                                    uint32_t k, uint64_t* s_t) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  s_sorted[warp][lane] = WarpSortDesc(tm);
  __syncthreads();
  if (tm == 0) return;
  uint32_t above = 0;
#pragma unroll
  for (int w = 0; w < kSplitThreads / 32; ++w) {
    const uint64_t* l = s_sorted[w];
    int pos = 0;
#pragma unroll
    for (int step = 16; step > 0; step >>= 1)
      if (l[pos + step - 1] > tm) pos += step;
    if (pos == 31 && l[31] > tm) pos = 32;
    above += pos;
  }
  if (above == k - 1) *s_t = tm;  // unique keys: one thread at most
}

// Ranks the cnt unique candidates by counting and writes the best k (rank order) with put(rank, key).
template <typename Put>
__device__ __forceinline__ void RankCandidates(const uint64_t* cand, uint32_t cnt, uint32_t k, Put put) {
  for (uint32_t i = threadIdx.x; i < cnt; i += kSplitThreads) {
    const uint64_t key = cand[i];
    uint32_t rank = 0, j = 0;
    for (; j + 8 <= cnt && rank < k; j += 8) {
#pragma unroll
      for (int u = 0; u < 8; ++u) rank += cand[j + u] > key;
    }
    for (; j < cnt && rank < k; ++j) rank += cand[j] > key;
    if (rank < k) put(rank, key);
  }
}

__global__ void __launch_bounds__(kSplitThreads) SplitKernel(const float* __restrict__ y, int64_t ldy,
                                                             int64_t n_valid, int32_t id_base,
                                                             const ReduceRow* __restrict__ rows,
                                                             int chunk, uint8_t* __restrict__ scratch) {
  const ReduceRow r = rows[blockIdx.y];
  const bool best_row = BestRow(r);
  if (!best_row && !SmallTopKRow(r)) return;
  const int nchunks = gridDim.x;
  uint8_t* rec = scratch + (static_cast<size_t>(blockIdx.y) * nchunks + blockIdx.x) * kSplitRec;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t rest = n_valid - c0;
  const int len = rest <= 0 ? 0 : (rest < chunk ? static_cast<int>(rest) : chunk);
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy + c0;
  const uint32_t idb = static_cast<uint32_t>(id_base + static_cast<int32_t>(c0));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ Candidate cred[kSplitThreads / 32];

  if (best_row) {
    const bool sample = r.mode == static_cast<uint8_t>(ReduceMode::kSample);
    Candidate best{-1, kNegInf, 0.f};
    float vv[kSplitIt][4];
    LoadChunk(src, len, vv);
#pragma unroll
    for (int it = 0; it < kSplitIt; ++it) {
      const int j = (threadIdx.x + it * kSplitThreads) * 4;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (j + u < len) {
          const uint32_t id = idb + static_cast<uint32_t>(j + u);
          const float v = vv[it][u];
          float key = v;
          if (sample) {
            key = SampleKey(v, r.temperature, r.seed, r.row_in_request, id);
            if (key != key && v != v) key = __uint_as_float(__float_as_uint(v) | 0x00400000u);
          }
          const Candidate c{static_cast<int32_t>(id), key, v};
          if (CandidateBefore(c, best)) best = c;
        }
      }
    }
    best = BlockBestCandidate(best, cred);
    if (threadIdx.x == 0) {
      uint32_t* cw = reinterpret_cast<uint32_t*>(rec);
      cw[0] = static_cast<uint32_t>(best.id);
      cw[1] = __float_as_uint(best.key);
      cw[2] = __float_as_uint(best.logit);
    }
    return;
  }

  extern __shared__ __align__(16) unsigned char split_smem[];
  float* sv = reinterpret_cast<float*>(split_smem);
  uint64_t* cand = reinterpret_cast<uint64_t*>(split_smem + static_cast<size_t>(chunk) * 4);
  __shared__ uint64_t s_sorted[kSplitThreads / 32][32];
  __shared__ MaxAt mred[kSplitThreads / 32];
  __shared__ double dred[kSplitThreads / 32];
  __shared__ uint64_t s_t;
  __shared__ uint32_t s_cnt;
  const uint32_t k = r.k;
  const float T = r.temperature;

  // Pass 1: stage, keys, thread maximum key, max of v / T (first of equals).
  uint64_t tm = 0;
  MaxAt best{kNegInf, INT64_MAX};
  {
    float vv[kSplitIt][4];
    LoadChunk(src, len, vv);
#pragma unroll
    for (int it = 0; it < kSplitIt; ++it) {
      const int j = (threadIdx.x + it * kSplitThreads) * 4;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (j + u < len) {
          sv[j + u] = vv[it][u];
          const uint64_t key = TopKKey(vv[it][u], idb + static_cast<uint32_t>(j + u));
          tm = key > tm ? key : tm;
          best = Better(best, MaxAt{vv[it][u] / T, j + u});
        }
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) best = Better(best, ShflMaxAt(best, off));
  if (lane == 0) mred[warp] = best;
  if (threadIdx.x == 0) {
    s_t = 1;
    s_cnt = 0;
  }
  ThresholdFromMaxima(s_sorted, tm, k, &s_t);  // its barrier also publishes mred
  MaxAt m = mred[0];
  for (int w = 1; w < kSplitThreads / 32; ++w) m = Better(m, mred[w]);
  const float gmax = m.v;

  // Sum of exp relative to the chunk's max (own staged elements: no barrier needed).
  const bool finite_max = len > 0 && isfinite(gmax);
  double sum = 0.0;
  bool has_nan = false;
  for (int j = threadIdx.x * 4; j < len; j += kSplitThreads * 4) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (j + u < len) {
        const float v = sv[j + u];
        if (finite_max)
          sum += exp(static_cast<double>(v / T) - static_cast<double>(gmax));
        else
          has_nan |= v != v;
      }
    }
  }
  const double total = BlockSumDouble(sum, dred);  // syncs: s_t is final afterwards
  const bool any_nan = __syncthreads_or(has_nan);
  const uint64_t t = s_t;
  for (int j = threadIdx.x * 4; j < len; j += kSplitThreads * 4) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (j + u < len) {
        const uint64_t key = TopKKey(sv[j + u], idb + static_cast<uint32_t>(j + u));
        if (key >= t) cand[atomicAdd(&s_cnt, 1u)] = key;
      }
    }
  }
  __syncthreads();
  const uint32_t cnt = s_cnt;
  uint64_t* out_keys = reinterpret_cast<uint64_t*>(rec + 16);
  RankCandidates(cand, cnt, k, [&](uint32_t rank, uint64_t key) { out_keys[rank] = key; });
  for (uint32_t i = cnt + threadIdx.x; i < k; i += kSplitThreads) out_keys[i] = 0;
  if (threadIdx.x == 0) {
    reinterpret_cast<float*>(rec)[0] = gmax;
    reinterpret_cast<double*>(rec)[1] =
        finite_max ? total : (any_nan ? __longlong_as_double(0x7ff8000000000000ll) : 0.0);
  }
}

__global__ void __launch_bounds__(kSplitThreads) SplitMerge(const float* __restrict__ y, int64_t ldy,
                                                            int32_t id_base,
                                                            const ReduceRow* __restrict__ rows,
                                                            uint8_t* __restrict__ payload, int nchunks,
                                                            const uint8_t* __restrict__ scratch) {
  const ReduceRow r = rows[blockIdx.x];
  const bool best_row = BestRow(r);
  if (!best_row && !SmallTopKRow(r)) return;
  const uint8_t* recs = scratch + static_cast<size_t>(blockIdx.x) * nchunks * kSplitRec;
  uint8_t* out = payload + r.out_offset;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ Candidate cred[kSplitThreads / 32];
  if (best_row) {
    Candidate best{-1, kNegInf, 0.f};
    for (int c = threadIdx.x; c < nchunks; c += kSplitThreads) {
      const uint32_t* cw = reinterpret_cast<const uint32_t*>(recs + static_cast<size_t>(c) * kSplitRec);
      const Candidate o{static_cast<int32_t>(cw[0]), __uint_as_float(cw[1]), __uint_as_float(cw[2])};
      if (CandidateBefore(o, best)) best = o;
    }
    best = BlockBestCandidate(best, cred);
    if (threadIdx.x == 0) WriteRecord(out, SoftmaxPartial{0.f, 0.f}, best, 0);
    return;
  }
  __shared__ uint64_t cand[kSplitMergeCand];
  __shared__ uint64_t s_sorted[kSplitThreads / 32][32];
  __shared__ MaxAt mred[kSplitThreads / 32];
  __shared__ double dred[kSplitThreads / 32];
  __shared__ uint64_t s_t;
  __shared__ uint32_t s_cnt;
  const uint32_t k = r.k;
  const int nk = nchunks * static_cast<int>(k);
  auto key_at = [&](int e) {
    const int c = e / static_cast<int>(k), q = e - c * static_cast<int>(k);
    return reinterpret_cast<const uint64_t*>(recs + static_cast<size_t>(c) * kSplitRec + 16)[q];
  };
  // Thread i takes the contiguous slice [i L, (i+1) L) of the chunks' sorted lists laid end to
  // end, so the thread maxima are mostly list heads and the threshold is tight.
  const int L = (nk + kSplitThreads - 1) / kSplitThreads;
  const int e0 = threadIdx.x * L, e1 = min(e0 + L, nk);
  uint64_t tm = 0;
  for (int e = e0; e < e1; ++e) {
    const uint64_t key = key_at(e);
    tm = key > tm ? key : tm;
  }
  // Softmax partials: the first chunk with the largest max (the CPU's running max).
  MaxAt best{kNegInf, INT64_MAX};
  for (int c = threadIdx.x; c < nchunks; c += kSplitThreads)
    best = Better(best, MaxAt{reinterpret_cast<const float*>(recs + static_cast<size_t>(c) * kSplitRec)[0], c});
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) best = Better(best, ShflMaxAt(best, off));
  if (lane == 0) mred[warp] = best;
  if (threadIdx.x == 0) {
    s_t = 1;
    s_cnt = 0;
  }
  ThresholdFromMaxima(s_sorted, tm, k, &s_t);  // its barrier also publishes mred
  MaxAt m = mred[0];
  for (int w = 1; w < kSplitThreads / 32; ++w) m = Better(m, mred[w]);
  const float gmax = m.v;
  double sum = 0.0;
  if (isfinite(gmax)) {
    for (int c = threadIdx.x; c < nchunks; c += kSplitThreads) {
      const uint8_t* rc = recs + static_cast<size_t>(c) * kSplitRec;
      const float cm = reinterpret_cast<const float*>(rc)[0];
      const double cs = reinterpret_cast<const double*>(rc)[1];
      if (cs > 0.0 || cs != cs) sum += cs * exp(static_cast<double>(cm) - static_cast<double>(gmax));
    }
  }
  const double total = BlockSumDouble(sum, dred);  // syncs: s_t is final afterwards
  __syncthreads();
  const uint64_t t = s_t;
  for (int e = e0; e < e1; ++e) {
    const uint64_t key = key_at(e);
    if (key >= t) cand[atomicAdd(&s_cnt, 1u)] = key;
  }
  __syncthreads();
  const uint32_t cnt = s_cnt;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  auto put = [&](uint32_t rank, uint64_t key) {
    const uint32_t id = 0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu);
    const float v = src[static_cast<int64_t>(id) - id_base];  // the logit itself (NaN kept)
    uint32_t* cw = reinterpret_cast<uint32_t*>(out + sizeof(SoftmaxPartial) + rank * sizeof(Candidate));
    cw[0] = id;
    cw[1] = __float_as_uint(v);
    cw[2] = __float_as_uint(v);
  };
  RankCandidates(cand, cnt, k, put);
  for (uint32_t i = cnt + threadIdx.x; i < k; i += kSplitThreads) {
    uint32_t* cw = reinterpret_cast<uint32_t*>(out + sizeof(SoftmaxPartial) + i * sizeof(Candidate));
    cw[0] = 0xffffffffu;
    cw[1] = __float_as_uint(kNegInf);
    cw[2] = 0u;
  }
  if (threadIdx.x == 0) {
    float* pf = reinterpret_cast<float*>(out);
    pf[0] = gmax;
    pf[1] = isfinite(gmax) ? static_cast<float>(total) : 0.f;
  }
}

}  // namespace

namespace {

int g_epilogue_variant = 0;

size_t SegScratchBytes(int64_t n_valid, int nrows) {
  const int64_t segs = (n_valid + kTopKSmemFloats - 1) / kTopKSmemFloats;
  return segs <= 1 ? 0 : (static_cast<size_t>(segs) * nrows * kSegRecord + 15) & ~size_t{15};
}

// Columns per split CTA (variant 0): 512, doubled up to 4096 while (weighted) rows x chunks > 256
// (more CTAs only add per-CTA and merge cost), and at least n / kSplitMaxChunks; 0: the split
// path cannot serve this shard (the old kernels do). kmax: the largest small TOP_K k (8 if unknown).
int SplitChunk(int64_t n_valid, int nrows, int variant, uint32_t kmax) {
  int64_t chunk = variant == 2 ? 512 : variant == 3 ? 2048 : variant == 4 ? 1024 : 4096;
  if (variant == 0) {
    // 512 columns a CTA, doubled while rows x chunks (x2 for k >= 32: the merge reads chunks x k
    // keys) exceeds 256: measured best or within ~1 us of the best fixed size (round 2, run 2).
    chunk = 512;
    const int64_t w = kmax >= 32 ? 2 : 1;
    while (chunk < kSplitMaxChunk && w * nrows * ((n_valid + chunk - 1) / chunk) > 256) chunk *= 2;
  }
  const int64_t min_chunk = ((n_valid + kSplitMaxChunks - 1) / kSplitMaxChunks + 255) / 256 * 256;
  chunk = std::max(chunk, min_chunk);
  return chunk > kSplitMaxChunk ? 0 : static_cast<int>(chunk);
}

}  // namespace

void SetEpilogueVariant(int variant) { g_epilogue_variant = variant; }

size_t EpilogueScratchBytes(int64_t n_valid, int nrows) {
  return SegScratchBytes(n_valid, nrows) + static_cast<size_t>(nrows) * kSplitMaxChunks * kSplitRec;
}

cudaError_t ValidateReduceRows(const ReduceRow* rows, int nrows) {
  for (int i = 0; i < nrows; ++i) {
    const ReduceRow& r = rows[i];
    if (r.out_offset % 16 != 0 || r.y_row < 0) return cudaErrorInvalidValue;
    switch (static_cast<ReduceMode>(r.mode)) {
      case ReduceMode::kFullLogits:
        break;
      case ReduceMode::kTopK:
        if (r.k < 1 || r.k > kMaxTopK || !(r.temperature > 0)) return cudaErrorInvalidValue;
        break;
      case ReduceMode::kArgmax:
        if (r.k != 1) return cudaErrorInvalidValue;
        break;
      case ReduceMode::kSample:
        if (r.k != 1 || !(r.temperature > 0)) return cudaErrorInvalidValue;
        break;
      default:
        return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

cudaError_t ShardEpilogue(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                          int32_t id_base, const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  return ShardEpilogue(y, ldy, n_shard, n_valid, id_base, rows_dev, nrows, payload, scratch,
                       scratch_bytes, stream, nullptr);
}

cudaError_t ShardEpilogue(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                          int32_t id_base, const ReduceRow* rows_dev, int nrows, uint8_t* payload,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          const ReduceRow* rows_host) {
  if (nrows <= 0) return cudaSuccess;
  if (ldy % 4 != 0 || n_valid > n_shard || n_valid < 0 || n_shard < 1 || ldy < n_shard ||
      (reinterpret_cast<uintptr_t>(y) & 15u) != 0 || nrows > 65535)
    return cudaErrorInvalidValue;
  if (scratch == nullptr || scratch_bytes < EpilogueScratchBytes(n_valid, nrows))
    return cudaErrorInvalidValue;
  const int variant = g_epilogue_variant;
  uint32_t kmax = 8;
  if (rows_host != nullptr) {
    kmax = 1;
    for (int i = 0; i < nrows; ++i)
      if (static_cast<ReduceMode>(rows_host[i].mode) == ReduceMode::kTopK && rows_host[i].k <= kSmallTopK)
        kmax = std::max(kmax, rows_host[i].k);
  }
  const int chunk = variant == 1 ? 0 : SplitChunk(n_valid, nrows, variant, kmax);
  // What the rows need (everything when the host copy of the descriptors is not given).
  bool any_full = true, any_split = chunk > 0, any_large = true, any_best_old = chunk == 0;
  if (rows_host != nullptr) {
    any_full = any_split = any_large = any_best_old = false;
    for (int i = 0; i < nrows; ++i) {
      const ReduceRow& r = rows_host[i];
      const auto mode = static_cast<ReduceMode>(r.mode);
      if (mode == ReduceMode::kFullLogits) any_full = true;
      const bool best = mode == ReduceMode::kArgmax || mode == ReduceMode::kSample;
      const bool small = mode == ReduceMode::kTopK && r.k >= 1 && r.k <= kSmallTopK;
      if (chunk > 0 && (best || small)) any_split = true;
      if (chunk == 0 && best) any_best_old = true;
      if (mode == ReduceMode::kTopK && (chunk == 0 || !small)) any_large = true;
    }
  }
  if (any_full) {
    const int64_t fx = (n_shard + 1023) / 1024;
    if (fx > 0x7fffffff) return cudaErrorInvalidValue;
    FullLogitsKernel<<<dim3(static_cast<unsigned>(fx), nrows), 256, 0, stream>>>(y, ldy, n_shard,
                                                                                 rows_dev, payload);
    DH_CUDA_TRY(cudaGetLastError());
  }
  uint8_t* seg_scratch = static_cast<uint8_t*>(scratch);
  uint8_t* split_scratch = seg_scratch + SegScratchBytes(n_valid, nrows);
  if (any_split) {
    const int nchunks = static_cast<int>(std::max<int64_t>(1, (n_valid + chunk - 1) / chunk));
    const size_t smem = static_cast<size_t>(chunk) * 4 +
                        static_cast<size_t>(kSmallTopK) * 4 * ((chunk + 1023) / 1024) * 8;
    SplitKernel<<<dim3(nchunks, nrows), kSplitThreads, smem, stream>>>(y, ldy, n_valid, id_base,
                                                                       rows_dev, chunk, split_scratch);
    DH_CUDA_TRY(cudaGetLastError());
    SplitMerge<<<nrows, kSplitThreads, 0, stream>>>(y, ldy, id_base, rows_dev, payload, nchunks,
                                                    split_scratch);
    DH_CUDA_TRY(cudaGetLastError());
  }
  if (any_best_old) {
    BestKernel<<<nrows, kBestThreads, 0, stream>>>(y, ldy, n_valid, id_base, rows_dev, payload);
    DH_CUDA_TRY(cudaGetLastError());
  }
  if (!any_large) return cudaSuccess;
  const uint32_t min_k = chunk > 0 ? kSmallTopK + 1 : 1;
  const int64_t segs = std::max<int64_t>(1, (n_valid + kTopKSmemFloats - 1) / kTopKSmemFloats);
  const int64_t seg_len = segs == 1 ? std::max<int64_t>(n_valid, 1) : (n_valid + segs - 1) / segs;
  if (segs > kMergeMaxKeys / static_cast<int64_t>(kMaxTopK)) return cudaErrorInvalidValue;
  const int smem_floats = static_cast<int>(std::min<int64_t>(seg_len, kTopKSmemFloats));
  DH_CUDA_TRY(cudaFuncSetAttribute(TopKKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   kTopKSmemFloats * 4));
  TopKKernel<<<dim3(nrows, static_cast<unsigned>(segs)), kTopKThreads,
               smem_floats * sizeof(float), stream>>>(y, ldy, n_valid, id_base, rows_dev, payload,
                                                      smem_floats, seg_len, seg_scratch, min_k);
  DH_CUDA_TRY(cudaGetLastError());
  if (segs > 1) {
    size_t keys = 1;  // the bitonic sort pads to a power of two
    while (keys < static_cast<size_t>(segs) * kMaxTopK) keys <<= 1;
    DH_CUDA_TRY(cudaFuncSetAttribute(TopKMerge, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kMergeMaxKeys * 8));
    TopKMerge<<<nrows, kTopKThreads, keys * 8, stream>>>(y, ldy, id_base, rows_dev, payload,
                                                        static_cast<int>(segs), seg_scratch, min_k);
  }
  return cudaGetLastError();
}

}  // namespace drafthead::cuda
