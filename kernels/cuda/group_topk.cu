#include "kernels/cuda/group_topk.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace drafthead::cuda::epilogue {
namespace {

constexpr int kGroupCols = 128;  // a warp's float4 loads
constexpr int kMaxGroupsPerThread = static_cast<int>(kGroupMaxCols / kGroupCols / kReduceThreads);
constexpr int kGroupCand = kGroupTopK * kMaxGroupsPerThread;  // group keys >= the first threshold
constexpr int kElemCand = kGroupTopK * kGroupCols;            // keys in the k best groups
static_assert(kElemCand % kReduceThreads == 0, "GroupMerge: whole loads a thread");

struct GroupRec {
  uint64_t key;    // the group's largest TopKKey (0: no column)
  double sum;      // sum of exp(v / T - max) over the group; NaN / 0 when max is not finite
  float max;       // max of v / T, first of equals (kNegInf: none)
  uint32_t pad;
};
static_assert(sizeof(GroupRec) == 24, "24-byte records");

__device__ __forceinline__ bool GroupRow(const ReduceRow& r) {
  return r.mode == static_cast<uint8_t>(ReduceMode::kTopK) && r.k >= 1 && r.k <= kGroupTopK;
}

__host__ __device__ __forceinline__ int64_t Groups(int64_t n_valid) { return (n_valid + kGroupCols - 1) / kGroupCols; }

// The order of a float for redux.sync's unsigned max: larger is better, -0 ties +0, NaN (and no
// column: 0) below everything.
__device__ __forceinline__ uint32_t FloatOrder(float f) {
  if (f != f) return 0u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// GPW groups a warp, their loads issued before any is used. Per group, warp-wide: the max of v / T
// (each lane's by fp32 compares, first of equals; then redux on its order and the first lane
// holding it: its columns come first), the largest key (each lane's from its best OrderKey, first
// of equals, then redux on the high word and on the low word among the lanes holding it), and the
// sum of exps relative to the max in fp32, pairwise: (t0 + t1) + (t2 + t3) a lane, then a
// butterfly whose every lane adds the same pairs (a + b == b + a), so the sum is one fixed tree of
// 7 levels: its rounding error < 7 x 2^-24 of the sum (the row adds the groups in double).
// The per-column work is compares and one expf; keys and orders are made once a lane.
template <int GPW>
__global__ void __launch_bounds__(kReduceThreads) GroupScan(const float* __restrict__ y, int64_t ldy,
                                                            int64_t n_valid, int32_t id_base,
                                                            const ReduceRow* __restrict__ rows,
                                                            uint8_t* __restrict__ scratch) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.y];
  if (!GroupRow(r)) return;
  const int64_t ng = Groups(n_valid);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  GroupRec* recs = reinterpret_cast<GroupRec*>(scratch) + static_cast<int64_t>(blockIdx.y) * ng;
  const int64_t g0 = (static_cast<int64_t>(blockIdx.x) * (kReduceThreads / 32) + warp) * GPW;
  const float T = r.temperature;
  float v[GPW][4];
#pragma unroll
  for (int i = 0; i < GPW; ++i) LoadFour(src, (g0 + i) * kGroupCols + lane * 4, n_valid, v[i]);
#pragma unroll
  for (int i = 0; i < GPW; ++i) {
    const int64_t g = g0 + i;
    if (g >= ng) break;  // warp-uniform
    const int64_t c = g * kGroupCols + lane * 4;
    const int nv = static_cast<int>(n_valid - c < 0 ? 0 : (n_valid - c > 4 ? 4 : n_valid - c));
    float s[4];
    float mv = kNegInf;   // the lane's max of v / T, first of equals (NaN never wins)
    float kv = kNegInf;   // the lane's best OrderKey (NaN as -inf), first of equals: column kc
    int kc = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      s[u] = Scaled(v[i][u], T);
      if (u < nv) {
        if (s[u] > mv) mv = s[u];
        const float o = OrderKey(v[i][u]);
        if (u == 0 || o > kv) kv = o, kc = u;
      }
    }
    const uint32_t mo = nv > 0 ? FloatOrder(mv) : 0u;
    const uint64_t lkey = nv > 0 ? TopKKey(kv, static_cast<uint32_t>(id_base + c + kc)) : 0u;
    const uint32_t khi = static_cast<uint32_t>(lkey >> 32), klo = static_cast<uint32_t>(lkey);
    const uint32_t gmo = __reduce_max_sync(0xffffffffu, mo);
    const uint32_t first = __ffs(__ballot_sync(0xffffffffu, mo == gmo)) - 1;
    const float m = __shfl_sync(0xffffffffu, mv, first);
    const uint32_t ghi = __reduce_max_sync(0xffffffffu, khi);
    const uint32_t glo = __reduce_max_sync(0xffffffffu, khi == ghi ? klo : 0u);
    double sum;
    if (isfinite(m)) {
      float t[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) t[u] = u < nv ? SumTerm(s[u], m) : 0.f;
      float own = (t[0] + t[1]) + (t[2] + t[3]);
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) own += __shfl_xor_sync(0xffffffffu, own, off);
      sum = static_cast<double>(own);
    } else {
      bool nan = false;
#pragma unroll
      for (int u = 0; u < 4; ++u) nan |= u < nv && v[i][u] != v[i][u];
      sum = __any_sync(0xffffffffu, nan) ? __longlong_as_double(0x7ff8000000000000ll) : 0.0;
    }
    if (lane == 0) recs[g] = GroupRec{(static_cast<uint64_t>(ghi) << 32) | glo, sum, m, 0u};
  }
}

__global__ void __launch_bounds__(kReduceThreads) GroupMerge(const float* __restrict__ y, int64_t ldy,
                                                             int64_t n_valid, int32_t id_base,
                                                             const ReduceRow* __restrict__ rows,
                                                             uint8_t* __restrict__ payload,
                                                             const uint8_t* __restrict__ scratch) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.x];
  if (!GroupRow(r)) return;
  const int64_t ng = Groups(n_valid);
  const GroupRec* recs = reinterpret_cast<const GroupRec*>(scratch) + static_cast<int64_t>(blockIdx.x) * ng;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  uint8_t* out = payload + r.out_offset;
  __shared__ TopKShared sh;
  __shared__ uint64_t gcand[kGroupCand];
  __shared__ int64_t sel[kGroupTopK];
  __shared__ uint64_t cand[kElemCand];
  __shared__ uint64_t t_exact;
  __shared__ uint32_t ecnt;
  const uint32_t k = r.k;
  // Thread i: the contiguous groups [i L, (i+1) L) (a fixed order for the sum: batch-invariant),
  // read once into registers (L <= kMaxGroupsPerThread).
  const int L = static_cast<int>((ng + kReduceThreads - 1) / kReduceThreads);
  const int64_t e0 = threadIdx.x * static_cast<int64_t>(L);
  const int64_t left = ng - e0;
  const int n_own = left <= 0 ? 0 : (left < L ? static_cast<int>(left) : L);
  uint64_t keys[kMaxGroupsPerThread];
  float maxes[kMaxGroupsPerThread];
  double sums[kMaxGroupsPerThread];
#pragma unroll
  for (int i = 0; i < kMaxGroupsPerThread; ++i) {
    if (i < n_own) {
      const GroupRec rec = recs[e0 + i];
      keys[i] = rec.key, maxes[i] = rec.max, sums[i] = rec.sum;
    } else {
      keys[i] = 0, maxes[i] = kNegInf, sums[i] = 0.0;
    }
  }
  uint64_t tm = 0;
  MaxAt best{kNegInf, INT64_MAX};
#pragma unroll
  for (int i = 0; i < kMaxGroupsPerThread; ++i) {
    if (i < n_own) {
      tm = keys[i] > tm ? keys[i] : tm;
      best = Better(best, MaxAt{maxes[i], e0 + i});  // groups in column order: first of equals
    }
  }
  const float gmax = BlockMaxAndThreshold(best, tm, k, sh);
  double sum = 0.0;
  if (isfinite(gmax)) {
#pragma unroll
    for (int i = 0; i < kMaxGroupsPerThread; ++i) {
      const double cs = sums[i];
      if (i < n_own && (cs > 0.0 || cs != cs))
        sum += cs * exp(static_cast<double>(maxes[i]) - static_cast<double>(gmax));
    }
  }
  if (threadIdx.x == 0) ecnt = 0;
  const double total = BlockSumDouble(sum, sh.dred);  // syncs: sh.t is final afterwards
  __syncthreads();
  // The groups whose key reaches the thread-maxima threshold (at most k threads x L groups).
  const uint64_t t1 = sh.t;
#pragma unroll
  for (int i = 0; i < kMaxGroupsPerThread; ++i)
    if (i < n_own && keys[i] >= t1) gcand[atomicAdd(&sh.cnt, 1u)] = keys[i];
  __syncthreads();
  const uint32_t gc = sh.cnt;
  // Their exact k-th largest key t: exactly the k groups ranked < k hold keys >= t.
  RankCandidates(gcand, gc, k, [&](uint32_t rank, uint64_t key) {
    sel[rank] = (static_cast<int64_t>(TopKKeyId(key)) - id_base) / kGroupCols;
    if (rank == k - 1) t_exact = key;
  });
  __syncthreads();
  const uint32_t nsel = gc < k ? gc : k;
  const uint64_t t = gc >= k ? t_exact : 1;  // fewer groups than k: every column
  // The selected groups' logits: every load of a thread first, then their keys. One load after
  // another, each waited a whole L2 round trip (ncu at top-8 x5: a fifth of the kernel's samples).
  constexpr int kPer = kElemCand / kReduceThreads;
  auto column = [&](int j) -> int64_t {  // the j-th column of this thread (n_valid: none)
    const uint32_t e = threadIdx.x + static_cast<uint32_t>(j) * kReduceThreads;
    if (e >= nsel * kGroupCols) return n_valid;
    const int64_t col = sel[e / kGroupCols] * kGroupCols + e % kGroupCols;
    return col < n_valid ? col : n_valid;
  };
  float ev[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t col = column(j);
    ev[j] = col < n_valid ? src[col] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t col = column(j);
    if (col < n_valid) {
      const uint64_t key = TopKKey(ev[j], static_cast<uint32_t>(id_base + col));
      if (key >= t) cand[atomicAdd(&ecnt, 1u)] = key;
    }
  }
  __syncthreads();
  const uint32_t cnt = ecnt;
  RankCandidates(cand, cnt, k, [&](uint32_t rank, uint64_t key) {
    const uint32_t id = TopKKeyId(key);
    const float v = src[static_cast<int64_t>(id) - id_base];  // the logit itself (NaN kept)
    WriteCandidate(out, Candidate{static_cast<int32_t>(id), v, v}, rank);
  });
  for (uint32_t i = cnt + threadIdx.x; i < k; i += kReduceThreads)
    WriteCandidate(out, Candidate{-1, kNegInf, 0.f}, i);
  if (threadIdx.x == 0) WritePartial(out, gmax, isfinite(gmax) ? static_cast<float>(total) : 0.f);
}

}  // namespace

size_t GroupTopKScratchBytes(int64_t n_valid, int nrows) {
  return static_cast<size_t>(nrows) * static_cast<size_t>(Groups(n_valid)) * sizeof(GroupRec);
}

cudaError_t LaunchGroupTopK(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                            const ReduceRow* rows, int nrows, uint8_t* payload, void* scratch,
                            size_t scratch_bytes, cudaStream_t stream) {
  if (nrows <= 0) return cudaSuccess;
  if (n_valid < 0 || n_valid > kGroupMaxCols || scratch == nullptr ||
      scratch_bytes < GroupTopKScratchBytes(n_valid, nrows) || (reinterpret_cast<uintptr_t>(scratch) & 7u) != 0)
    return cudaErrorInvalidValue;
  const int64_t ng = std::max<int64_t>(1, Groups(n_valid));
  auto* recs = static_cast<uint8_t*>(scratch);
  constexpr int kWarps = kReduceThreads / 32;
  // Four groups a warp where rows are many (fewer CTAs, more loads in flight each); one where
  // they are few (every SM busy). The records do not depend on it.
  if (nrows >= 8) {
    DH_CUDA_TRY(LaunchDependent(GroupScan<4>, dim3(static_cast<unsigned>((ng + 4 * kWarps - 1) / (4 * kWarps)), nrows),
                                dim3(kReduceThreads), 0, stream, y, ldy, n_valid, id_base, rows, recs));
  } else {
    DH_CUDA_TRY(LaunchDependent(GroupScan<1>, dim3(static_cast<unsigned>((ng + kWarps - 1) / kWarps), nrows),
                                dim3(kReduceThreads), 0, stream, y, ldy, n_valid, id_base, rows, recs));
  }
  return LaunchDependent(GroupMerge, dim3(nrows), dim3(kReduceThreads), 0, stream, y, ldy, n_valid,
                         id_base, rows, payload, static_cast<const uint8_t*>(recs));
}

}  // namespace drafthead::cuda::epilogue
