#include "kernels/cuda/topk_select.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace drafthead::cuda::epilogue {
namespace {

constexpr int kTopKThreads = 1024;

// Sorts keys[0, cnt) descending in place (bitonic, padded with 0 keys to a power of two: keys
// must have room for that). The whole CTA calls it.
__device__ __forceinline__ void SortKeysDesc(uint64_t* keys, uint32_t cnt) {
  uint32_t p2 = 1;
  while (p2 < cnt) p2 <<= 1;
  for (uint32_t i = cnt + threadIdx.x; i < p2; i += kTopKThreads) keys[i] = 0;  // sorts last
  __syncthreads();
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
}

// Candidates 0..k-1 of a record from the first cnt sorted keys (slots past cnt: id -1); the
// logit is read back from vals (column = id - id_base), so NaN payloads are kept.
__device__ __forceinline__ void WriteSortedCandidates(uint8_t* out, const uint64_t* keys,
                                                      uint32_t cnt, uint32_t k, const float* vals,
                                                      int32_t id_base) {
  for (uint32_t i = threadIdx.x; i < k; i += kTopKThreads) {
    Candidate c{-1, kNegInf, 0.f};
    if (i < cnt) {
      const uint32_t id = TopKKeyId(keys[i]);
      const float v = vals[static_cast<int64_t>(id) - id_base];
      c = Candidate{static_cast<int32_t>(id), v, v};
    }
    WriteCandidate(out, c, i);
  }
}

// Row values are staged in dynamic shared memory when they fit (a tp >= 3 shard of the default
// vocabulary), so the select passes read shared memory; longer rows are re-read from global/L2.
constexpr int kTopKSmemFloats = 40960;  // 160 KB

// Rows longer than the shared-memory stage are cut into segments (blockIdx.y): each segment's
// CTA writes its own record (partial + k candidates) to scratch, and TopKMerge combines them.
constexpr size_t kSegRecord = (sizeof(SoftmaxPartial) + kMaxTopK * sizeof(Candidate) + 15) & ~size_t{15};
constexpr int kMergeMaxKeys = 16384;  // segments x k the merge can hold (128 KB of keys)

__device__ __forceinline__ bool TopKRowFrom(const ReduceRow& r, uint32_t min_k) {
  return r.mode == static_cast<uint8_t>(ReduceMode::kTopK) && r.k >= min_k && r.k >= 1 &&
         r.k <= kMaxTopK;
}

__global__ void __launch_bounds__(kTopKThreads, 1) TopKKernel(const float* __restrict__ y, int64_t ldy,
                                                           int64_t n_valid_row, int32_t id_base_row,
                                                           const ReduceRow* __restrict__ rows,
                                                           uint8_t* __restrict__ payload,
                                                           int smem_floats, int64_t seg_len,
                                                           uint8_t* __restrict__ scratch,
                                                           uint32_t min_k) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.x];
  if (!TopKRowFrom(r, min_k)) return;
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
    best = Better(best, MaxAt{Scaled(v, T), j});
  }
  best = WarpBetter(best);
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
    if (finite_max) sum += static_cast<double>(SumTerm(Scaled(v, T), gmax));
  }
  const double total = BlockSumDouble(sum, dred);
  __syncthreads();
  const uint32_t cnt = min(s_count, kMaxTopK);
  SortKeysDesc(keys, cnt);
  uint8_t* out = segs == 1 ? payload + r.out_offset
                           : scratch + (static_cast<size_t>(blockIdx.x) * segs + seg) * kSegRecord;
  WriteSortedCandidates(out, keys, cnt, k, vals, id_base);
  if (threadIdx.x == 0) WritePartial(out, gmax, finite_max ? static_cast<float>(total) : 0.f);
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
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.x];
  if (!TopKRowFrom(r, min_k)) return;
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
  SortKeysDesc(mkeys, cnt);
  uint8_t* out = payload + r.out_offset;
  WriteSortedCandidates(out, mkeys, cnt, k, src, id_base);
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
    WritePartial(out, best, isfinite(best) ? static_cast<float>(sum) : 0.f);
  }
}
int64_t Segments(int64_t n_valid) {
  return std::max<int64_t>(1, (n_valid + kTopKSmemFloats - 1) / kTopKSmemFloats);
}

}  // namespace

size_t TopKSelectScratchBytes(int64_t n_valid, int nrows) {
  const int64_t segs = Segments(n_valid);
  return segs <= 1 ? 0 : (static_cast<size_t>(segs) * nrows * kSegRecord + 15) & ~size_t{15};
}

cudaError_t LaunchTopKSelect(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                             const ReduceRow* rows, int nrows, uint8_t* payload, void* scratch,
                             uint32_t min_k, cudaStream_t stream) {
  const int64_t segs = Segments(n_valid);
  const int64_t seg_len = segs == 1 ? std::max<int64_t>(n_valid, 1) : (n_valid + segs - 1) / segs;
  if (segs > kMergeMaxKeys / static_cast<int64_t>(kMaxTopK)) return cudaErrorInvalidValue;
  const int smem_floats = static_cast<int>(std::min<int64_t>(seg_len, kTopKSmemFloats));
  uint8_t* seg_scratch = static_cast<uint8_t*>(scratch);
  static std::atomic<uint64_t> kernel_ready{0}, merge_ready{0};
  DH_CUDA_TRY(OptInSharedMemory(TopKKernel, kTopKSmemFloats * 4, kernel_ready));
  DH_CUDA_TRY(LaunchDependent(TopKKernel, dim3(nrows, static_cast<unsigned>(segs)),
                              dim3(kTopKThreads), smem_floats * sizeof(float), stream, y, ldy,
                              n_valid, id_base, rows, payload, smem_floats, seg_len, seg_scratch,
                              min_k));
  if (segs > 1) {
    size_t keys = 1;  // the bitonic sort pads to a power of two
    while (keys < static_cast<size_t>(segs) * kMaxTopK) keys <<= 1;
    DH_CUDA_TRY(OptInSharedMemory(TopKMerge, kMergeMaxKeys * 8, merge_ready));
    DH_CUDA_TRY(LaunchDependent(TopKMerge, dim3(nrows), dim3(kTopKThreads), keys * 8, stream, y,
                                ldy, id_base, rows, payload, static_cast<int>(segs),
                                static_cast<const uint8_t*>(seg_scratch), min_k));
  }
  return cudaSuccess;
}

}  // namespace drafthead::cuda::epilogue
