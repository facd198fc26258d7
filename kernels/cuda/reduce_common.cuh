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

}  // namespace drafthead::cuda::epilogue
