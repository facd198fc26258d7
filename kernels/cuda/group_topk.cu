#include "kernels/cuda/group_topk.cuh"

#include <algorithm>
#include <atomic>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace drafthead::cuda::epilogue {
namespace {

constexpr int kGroupCols = 512;                 // a warp's four float4 loads a lane
constexpr int kLoads = kGroupCols / 128;         // float4 loads a lane
constexpr int kMaxGroupsPerThread = static_cast<int>(kGroupMaxCols / kGroupCols / kReduceThreads);
constexpr int kGroupCand = kGroupTopK * kMaxGroupsPerThread;  // group keys >= the first threshold
constexpr int kElemCand = kGroupTopK * kGroupCols;            // keys in the k best groups
constexpr int kMergeSmem = kElemCand * static_cast<int>(sizeof(uint64_t));  // 64 KB, dynamic
static_assert(kGroupMaxCols % (kGroupCols * kReduceThreads) == 0, "whole groups a thread");
static_assert(kGroupCols == 2 * kReduceThreads, "GroupMerge: a selected group is two loads a thread");

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

// One warp a group of 512 columns, lane l holding columns 128 i + 4 l + u (i, u < 4), all four
// loads issued before any is used. The lane first reduces its 16 columns in column order, then the
// warp: the max of v / T (first of equals: redux on its order, then the smallest column among the
// lanes holding it, whose value is taken), the largest key (the lane's from its best OrderKey,
// first of equals, then redux on the high word and on the low word among the lanes holding it),
// and the sum of exps relative to the max in fp32, pairwise: a fixed tree of 4 levels in the lane
// and a butterfly whose every lane adds the same pairs (a + b == b + a), so the sum is one fixed
// tree of 9 levels: its rounding error < 9 x 2^-24 of the sum (the row adds the groups in double).
// The per-column work is compares and one expf; the warp's reductions are made once a group.
// CTAs of any whole number of warps (the launch picks); no barrier and no shared memory.
__global__ void __launch_bounds__(kReduceThreads) GroupScan(const float* __restrict__ y, int64_t ldy,
                                                            int64_t n_valid, int32_t id_base,
                                                            const ReduceRow* __restrict__ rows,
                                                            uint8_t* __restrict__ scratch) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.y];
  if (!GroupRow(r)) return;
  const int64_t ng = Groups(n_valid);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (g >= ng) return;  // warp-uniform; nothing below syncs the block
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  GroupRec* recs = reinterpret_cast<GroupRec*>(scratch) + static_cast<int64_t>(blockIdx.y) * ng;
  const int64_t c0 = g * kGroupCols + lane * 4;
  const float T = r.temperature;
  float v[kLoads][4];
  int nv[kLoads];  // the lane's valid columns of each load
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int64_t c = c0 + i * 128;
    LoadFour(src, c, n_valid, v[i]);
    nv[i] = static_cast<int>(n_valid - c < 0 ? 0 : (n_valid - c > 4 ? 4 : n_valid - c));
  }
  float s[kLoads][4];
  float mv = kNegInf;   // the lane's max of v / T, first of equals (NaN never wins) ...
  uint32_t mc = ~0u;    // ... at this column of the group (none while mv is -inf)
  float kv = kNegInf;   // the lane's best OrderKey (NaN as -inf), first of equals ...
  uint32_t kc = 0;      // ... at this column of the group
  bool any = false;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      s[i][u] = Scaled(v[i][u], T);
      if (u < nv[i]) {
        const uint32_t off = static_cast<uint32_t>(i * 128 + lane * 4 + u);
        if (s[i][u] > mv) mv = s[i][u], mc = off;
        const float o = OrderKey(v[i][u]);
        if (!any || o > kv) kv = o, kc = off;
        any = true;
      }
    }
  }
  const uint32_t mo = any ? FloatOrder(mv) : 0u;
  const uint32_t gmo = __reduce_max_sync(0xffffffffu, mo);
  const uint32_t first = __reduce_min_sync(0xffffffffu, mo == gmo ? mc : ~0u);
  const float m = __shfl_sync(0xffffffffu, mv, first == ~0u ? 0 : static_cast<int>((first & 127u) >> 2));
  const uint64_t lkey = any ? TopKKey(kv, static_cast<uint32_t>(id_base + g * kGroupCols + kc)) : 0u;
  const uint32_t khi = static_cast<uint32_t>(lkey >> 32), klo = static_cast<uint32_t>(lkey);
  const uint32_t ghi = __reduce_max_sync(0xffffffffu, khi);
  const uint32_t glo = __reduce_max_sync(0xffffffffu, khi == ghi ? klo : 0u);
  double sum;
  if (isfinite(m)) {
    float a[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      float t[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) t[u] = u < nv[i] ? SumTerm(s[i][u], m) : 0.f;
      a[i] = (t[0] + t[1]) + (t[2] + t[3]);
    }
    float own = (a[0] + a[1]) + (a[2] + a[3]);
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) own += __shfl_xor_sync(0xffffffffu, own, off);
    sum = static_cast<double>(own);
  } else {
    bool nan = false;
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
#pragma unroll
      for (int u = 0; u < 4; ++u) nan |= u < nv[i] && v[i][u] != v[i][u];
    sum = __any_sync(0xffffffffu, nan) ? __longlong_as_double(0x7ff8000000000000ll) : 0.0;
  }
  if (lane == 0) recs[g] = GroupRec{(static_cast<uint64_t>(ghi) << 32) | glo, sum, m, 0u};
}

// The float whose order (TopKKey's high word) is ord, for a quick compare before a key is made.
__device__ __forceinline__ float OrderValue(uint32_t ord) {
  return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

__global__ void __launch_bounds__(kReduceThreads) GroupMerge(const float* __restrict__ y, int64_t ldy,
                                                             int64_t n_valid, int32_t id_base,
                                                             const ReduceRow* __restrict__ rows,
                                                             uint8_t* __restrict__ payload,
                                                             const uint8_t* __restrict__ scratch) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.x];
  const int64_t ng = Groups(n_valid);
  const GroupRec* recs = reinterpret_cast<const GroupRec*>(scratch) + static_cast<int64_t>(blockIdx.x) * ng;
  // Thread i: the contiguous groups [i L, (i+1) L) (a fixed order for the sum: batch-invariant),
  // read once into registers (L <= kMaxGroupsPerThread), together with the row's descriptor
  // (every row has room for its records, read or not): one round trip for both.
  const int L = static_cast<int>((ng + kReduceThreads - 1) / kReduceThreads);
  const int e0 = static_cast<int>(threadIdx.x) * L;
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
  if (!GroupRow(r)) return;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  uint8_t* out = payload + r.out_offset;
  extern __shared__ uint64_t cand[];  // kElemCand keys
  __shared__ TopKShared sh;
  __shared__ uint64_t gcand[kGroupCand];
  __shared__ int32_t sel[kGroupTopK];
  __shared__ uint64_t t_exact;
  __shared__ uint32_t ecnt;
  const uint32_t k = r.k;
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
  const double total = BlockSumDouble(sum, sh.dred);  // its barriers publish sh.t and ecnt
  const uint64_t t1 = sh.t;
  uint32_t nsel;
  uint64_t t;
  if (L == 1) {
    // One group a thread: the thread maxima are the group keys, so t1 is already the exact k-th
    // largest group key (or 1: fewer groups than k), and the groups reaching it are the k best.
    if (n_own > 0 && keys[0] >= t1) sel[atomicAdd(&sh.cnt, 1u)] = e0;
    __syncthreads();
    nsel = sh.cnt;
    t = t1;
  } else {
    // The groups whose key reaches the thread-maxima threshold (at most k threads x L groups),
    // then their exact k-th largest key t: exactly the k groups ranked < k hold keys >= t.
#pragma unroll
    for (int i = 0; i < kMaxGroupsPerThread; ++i)
      if (i < n_own && keys[i] >= t1) gcand[atomicAdd(&sh.cnt, 1u)] = keys[i];
    __syncthreads();
    const uint32_t gc = sh.cnt;
    RankCandidates(gcand, gc, k, [&](uint32_t rank, uint64_t key) {
      sel[rank] = static_cast<int32_t>((static_cast<int64_t>(TopKKeyId(key)) - id_base) / kGroupCols);
      if (rank == k - 1) t_exact = key;
    });
    __syncthreads();
    nsel = gc < k ? gc : k;
    t = gc >= k ? t_exact : 1;  // fewer groups than k: every column
  }
  // The selected groups' logits, two loads a thread a group (columns tid and tid + 256 of it):
  // every load first, then their keys. A float compare against t's value drops most columns
  // before a key is made (t's value is -inf or t is 1: every column goes on to its key).
  constexpr int kPer = kElemCand / kReduceThreads;
  const int per = 2 * static_cast<int>(nsel);
  auto column = [&](int j) -> int64_t {
    return static_cast<int64_t>(sel[j >> 1]) * kGroupCols + (j & 1) * kReduceThreads + threadIdx.x;
  };
  float ev[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (j < per) {
      const int64_t col = column(j);
      ev[j] = col < n_valid ? src[col] : 0.f;
    }
  }
  const uint32_t thi = static_cast<uint32_t>(t >> 32);
  const bool every = thi <= FloatOrder(kNegInf);
  const float tv = OrderValue(thi);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (j < per) {
      const int64_t col = column(j);
      if (col < n_valid && (every || ev[j] >= tv)) {
        const uint64_t key = TopKKey(ev[j], static_cast<uint32_t>(id_base + col));
        if (key >= t) cand[atomicAdd(&ecnt, 1u)] = key;
      }
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
  // Eight warps a CTA where rows are many, four where they are few (more CTAs: every SM busy).
  // The records do not depend on it.
  const int warps = nrows >= 8 ? kReduceThreads / 32 : kReduceThreads / 64;
  DH_CUDA_TRY(LaunchDependent(GroupScan, dim3(static_cast<unsigned>((ng + warps - 1) / warps), nrows),
                              dim3(warps * 32), 0, stream, y, ldy, n_valid, id_base, rows, recs));
  static std::atomic<uint64_t> merge_smem_ready{0};
  DH_CUDA_TRY(OptInSharedMemory(GroupMerge, kMergeSmem, merge_smem_ready));
  return LaunchDependent(GroupMerge, dim3(nrows), dim3(kReduceThreads), kMergeSmem, stream, y, ldy,
                         n_valid, id_base, rows, payload, static_cast<const uint8_t*>(recs));
}

}  // namespace drafthead::cuda::epilogue
