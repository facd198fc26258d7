#include "kernels/cuda/experimental/group_topk.cuh"

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

__device__ __forceinline__ int64_t Groups(int64_t n_valid) { return (n_valid + kGroupCols - 1) / kGroupCols; }

// Butterflies: every lane ends with the same value (a + b == b + a), whatever the lane.
__device__ __forceinline__ uint64_t WarpMaxKey(uint64_t v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}
__device__ __forceinline__ double WarpSumDouble(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// GPW groups a warp, their loads issued before any is used.
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
  for (int i = 0; i < GPW; ++i) {
    const int64_t c = (g0 + i) * kGroupCols + lane * 4;
    if (c + 4 <= n_valid) {
      const float4 q = *reinterpret_cast<const float4*>(src + c);
      v[i][0] = q.x, v[i][1] = q.y, v[i][2] = q.z, v[i][3] = q.w;
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u) v[i][u] = c + u < n_valid ? src[c + u] : 0.f;
    }
  }
#pragma unroll
  for (int i = 0; i < GPW; ++i) {
    const int64_t g = g0 + i;
    if (g >= ng) break;  // warp-uniform
    const int64_t c = g * kGroupCols + lane * 4;
    uint64_t km = 0;
    MaxAt best{kNegInf, INT64_MAX};
    bool nan = false;
    float s[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      s[u] = Scaled(v[i][u], T);
      if (c + u < n_valid) {
        best = Better(best, MaxAt{s[u], c + u});
        const uint64_t key = TopKKey(v[i][u], static_cast<uint32_t>(id_base + c + u));
        km = key > km ? key : km;
        nan |= v[i][u] != v[i][u];
      }
    }
    best = WarpBetter(best);
    km = WarpMaxKey(km);
    const bool any_nan = __any_sync(0xffffffffu, nan);
    double sum;
    if (isfinite(best.v)) {
      double own = 0.0;
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (c + u < n_valid) own += static_cast<double>(SumTerm(s[u], best.v));
      sum = WarpSumDouble(own);
    } else {
      sum = any_nan ? __longlong_as_double(0x7ff8000000000000ll) : 0.0;
    }
    if (lane == 0) recs[g] = GroupRec{km, sum, best.v, 0u};
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
  // Thread i: the contiguous groups [i L, (i+1) L) (a fixed order for the sum: batch-invariant).
  const int64_t L = (ng + kReduceThreads - 1) / kReduceThreads;
  const int64_t e0 = threadIdx.x * L, e1 = min(e0 + L, ng);
  uint64_t tm = 0;
  MaxAt best{kNegInf, INT64_MAX};
  for (int64_t g = e0; g < e1; ++g) {
    const GroupRec rec = recs[g];
    tm = rec.key > tm ? rec.key : tm;
    best = Better(best, MaxAt{rec.max, g});  // groups in column order: first of equals
  }
  const float gmax = BlockMaxAndThreshold(best, tm, k, sh);
  double sum = 0.0;
  if (isfinite(gmax)) {
    for (int64_t g = e0; g < e1; ++g) {
      const double cs = recs[g].sum;
      if (cs > 0.0 || cs != cs) sum += cs * exp(static_cast<double>(recs[g].max) - static_cast<double>(gmax));
    }
  }
  if (threadIdx.x == 0) ecnt = 0;
  const double total = BlockSumDouble(sum, sh.dred);  // syncs: sh.t is final afterwards
  __syncthreads();
  // The groups whose key reaches the thread-maxima threshold (at most k threads x L groups).
  const uint64_t t1 = sh.t;
  for (int64_t g = e0; g < e1; ++g) {
    const uint64_t key = recs[g].key;
    if (key >= t1) gcand[atomicAdd(&sh.cnt, 1u)] = key;
  }
  __syncthreads();
  const uint32_t gc = sh.cnt;
  // Their exact k-th largest key t: exactly the k groups ranked < k hold keys >= t.
  for (uint32_t i = threadIdx.x; i < gc; i += kReduceThreads) {
    const uint64_t key = gcand[i];
    uint32_t rank = 0;
    for (uint32_t j = 0; j < gc; ++j) rank += gcand[j] > key;
    if (rank < k) sel[rank] = (static_cast<int64_t>(TopKKeyId(key)) - id_base) / kGroupCols;
    if (rank == k - 1) t_exact = key;
  }
  __syncthreads();
  const uint32_t nsel = gc < k ? gc : k;
  const uint64_t t = gc >= k ? t_exact : 1;  // fewer groups than k: every column
  for (uint32_t e = threadIdx.x; e < nsel * kGroupCols; e += kReduceThreads) {
    const int64_t col = sel[e / kGroupCols] * kGroupCols + e % kGroupCols;
    if (col < n_valid) {
      const uint64_t key = TopKKey(src[col], static_cast<uint32_t>(id_base + col));
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
  return static_cast<size_t>(nrows) * static_cast<size_t>((n_valid + kGroupCols - 1) / kGroupCols) *
         sizeof(GroupRec);
}

cudaError_t LaunchGroupTopK(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                            const ReduceRow* rows, int nrows, uint8_t* payload, void* scratch,
                            size_t scratch_bytes, cudaStream_t stream) {
  if (nrows <= 0) return cudaSuccess;
  if (n_valid < 0 || n_valid > kGroupMaxCols || scratch == nullptr ||
      scratch_bytes < GroupTopKScratchBytes(n_valid, nrows) || (reinterpret_cast<uintptr_t>(scratch) & 7u) != 0)
    return cudaErrorInvalidValue;
  const int64_t ng = std::max<int64_t>(1, (n_valid + kGroupCols - 1) / kGroupCols);
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
