// Device helpers shared by the epilogue's kernel families (full_logits, best_row, topk_select,
// split_reduce): the record layout of a reduced row, the candidate orders as shuffles and keys, and
// block-wide reductions. Internal to kernels/cuda; include from .cu files only.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/candidate.h"
#include "kernels/cuda/shard_reduce.cuh"
#include "kernels/numeric.h"

namespace drafthead::cuda::epilogue {

constexpr float kNegInf = -__builtin_huge_valf();

// Four columns [j, j + 4) of a row of len (16-byte aligned at j): one float4 load where all four
// are in the row, else one by one with 0 past its end.
template <typename Index>
__device__ __forceinline__ void LoadFour(const float* __restrict__ src, Index j, Index len, float (&v)[4]) {
  if (j + 4 <= len) {
    const float4 q = *reinterpret_cast<const float4*>(src + j);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = j + u < len ? src[j + u] : 0.f;
  }
}

// The softmax partial's pieces (kernels/cpu/shard_reduce.cc computes the sum in double): v / T in
// fp32, with no division when T == 1 (which gives v exactly), and one term exp(v / T - max) of the
// sum in fp32: the difference rounds once, so a term's relative error stays below
// |v / T - max| x 2^-24 plus expf's 2 ulp (< 1e-6 for every term that moves the sum; the partial
// is stored as a float anyway). Callers add the terms in double. A double-precision exp a column
// (dozens of half-rate DP instructions) was most of the TOP_K epilogue's instructions.
__device__ __forceinline__ float Scaled(float v, float T) { return T == 1.f ? v : v / T; }
__device__ __forceinline__ float SumTerm(float scaled, float max_scaled) { return expf(scaled - max_scaled); }

// A reduced row's block in the payload: SoftmaxPartial, then k Candidate records (4-byte
// aligned only: written word by word).
__device__ __forceinline__ void WriteCandidate(uint8_t* out, const Candidate& c, uint32_t i) {
  uint32_t* cw = reinterpret_cast<uint32_t*>(out + sizeof(SoftmaxPartial) + i * sizeof(Candidate));
  cw[0] = static_cast<uint32_t>(c.id);
  cw[1] = __float_as_uint(c.key);
  cw[2] = __float_as_uint(c.logit);
}
__device__ __forceinline__ void WritePartial(uint8_t* out, float max_scaled, float sum_exp) {
  float* pf = reinterpret_cast<float*>(out);
  pf[0] = max_scaled;
  pf[1] = sum_exp;
}

__device__ __forceinline__ Candidate ShflCand(const Candidate& c, int off) {
  Candidate o;
  o.id = __shfl_xor_sync(0xffffffffu, c.id, off);
  o.key = __shfl_xor_sync(0xffffffffu, c.key, off);
  o.logit = __shfl_xor_sync(0xffffffffu, c.logit, off);
  return o;
}

// The warp's best candidate (CandidateBefore order), in every lane.
__device__ __forceinline__ Candidate WarpBest(Candidate best) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Candidate o = ShflCand(best, off);
    if (CandidateBefore(o, best)) best = o;
  }
  return best;
}

// An ARGMAX / SAMPLE row's candidate for column value v with token id.
__device__ __forceinline__ Candidate BestCandidate(const ReduceRow& r, bool sample, float v,
                                                   uint32_t id) {
  float key = v;
  if (sample) {
    key = SampleKey(v, r.temperature, r.seed, r.row_in_request, id);
    // x86 propagates a NaN operand's payload (quieted); the GPU makes a canonical NaN.
    if (key != key && v != v) key = __uint_as_float(__float_as_uint(v) | 0x00400000u);
  }
  return Candidate{static_cast<int32_t>(id), key, v};
}

// Unique sort key: larger is better. High word: the candidate order of the logit (NaN as -inf,
// -0 as +0 so they tie as the CPU's float compare does); low word: ~id, so ties go to smaller ids.
__device__ __forceinline__ uint64_t TopKKey(float v, uint32_t id) {
  float f = OrderKey(v);
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(ord) << 32) | (0xffffffffu - id);
}

// The token id a TopKKey encodes.
__device__ __forceinline__ uint32_t TopKKeyId(uint64_t key) {
  return 0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu);
}

// Block-wide sum; `scratch` holds blockDim.x / 32 doubles. Valid in thread 0 only.
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
  return s;
}

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
__device__ __forceinline__ MaxAt ShflMaxAt(MaxAt a, int off) {
  MaxAt o;
  o.v = __shfl_xor_sync(0xffffffffu, a.v, off);
  o.j = __shfl_xor_sync(0xffffffffu, a.j, off);
  return o;
}
__device__ __forceinline__ MaxAt WarpBetter(MaxAt a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) a = Better(a, ShflMaxAt(a, off));
  return a;
}

// The TOP_K threshold and candidate ranking of a block of kReduceThreads threads (the split and
// group families): each thread's largest key is a lower bound for its own elements; the k-th
// largest of the thread maxima, t, is a lower bound for the block's k-th largest key (k distinct
// elements are >= t), and only the k threads with maxima >= t can hold keys >= t.
constexpr int kReduceThreads = 256;

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

// The threshold t of the comment above: the k-th largest of the kReduceThreads thread maxima tm (0 = none),
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
  for (int w = 0; w < kReduceThreads / 32; ++w) {
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

// Shared memory of a block's TOP_K threshold (split_reduce.cu, group_topk.cu).
struct TopKShared {
  uint64_t sorted[kReduceThreads / 32][32];  // ThresholdFromMaxima's sorted thread maxima
  MaxAt mred[kReduceThreads / 32];
  double dred[kReduceThreads / 32];
  uint64_t t;    // the threshold
  uint32_t cnt;  // candidates collected
};

// The block's part of both kernels' TOP_K: the largest of the threads' `best` (first of equals;
// returned in every thread) and the threshold of the thread maxima tm into sh.t (see
// ThresholdFromMaxima; final after the next barrier); resets the candidate count sh.cnt.
__device__ __forceinline__ float BlockMaxAndThreshold(MaxAt best, uint64_t tm, uint32_t k,
                                                      TopKShared& sh) {
  best = WarpBetter(best);
  if ((threadIdx.x & 31) == 0) sh.mred[threadIdx.x >> 5] = best;
  if (threadIdx.x == 0) {
    sh.t = 1;
    sh.cnt = 0;
  }
  ThresholdFromMaxima(sh.sorted, tm, k, &sh.t);  // its barrier also publishes mred
  MaxAt m = sh.mred[0];
  for (int w = 1; w < kReduceThreads / 32; ++w) m = Better(m, sh.mred[w]);
  return m.v;
}

// Ranks the cnt unique candidates by counting and writes the best k (rank order) with put(rank, key).
template <typename Put>
__device__ __forceinline__ void RankCandidates(const uint64_t* cand, uint32_t cnt, uint32_t k, Put put) {
  for (uint32_t i = threadIdx.x; i < cnt; i += kReduceThreads) {
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

}  // namespace drafthead::cuda::epilogue
