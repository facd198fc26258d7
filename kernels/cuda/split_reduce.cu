#include "kernels/cuda/split_reduce.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace drafthead::cuda::epilogue {
namespace {

// Each row is cut into chunks of `chunk` columns (blockIdx.x), one 256-thread CTA each, so a row
// is spread over many SMs; every CTA writes a small record to scratch and SplitMerge (one CTA per
// row) combines them. The candidate orders are total (unique ids), so the result does not depend on
// how the row was cut: bit-identical to the CPU.
//
// TOP_K inside a CTA: the thread-maxima threshold of reduce_common.cuh (ThresholdFromMaxima) leaves
// at most k x (elements per thread) candidates, ranked by counting (keys are unique).
constexpr int kSplitThreads = kReduceThreads;
constexpr int kSplitMaxChunk = 4096;   // columns per CTA (staged: 16 KB)
constexpr int kSplitMaxChunks = 128;   // chunks per row
constexpr size_t kSplitRec = 16 + kSmallTopK * 8;  // {max f32, pad, sum f64} + k keys (or a Candidate)
constexpr int kSplitMergeCand = kSmallTopK * ((kSplitMaxChunks * kSmallTopK + kSplitThreads - 1) / kSplitThreads);

// min_k: smaller k are another family's (group_topk.cuh where it serves; else 1).
__device__ __forceinline__ bool SmallTopKRow(const ReduceRow& r, uint32_t min_k) {
  return r.mode == static_cast<uint8_t>(ReduceMode::kTopK) && r.k >= min_k && r.k <= kSmallTopK;
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
  for (int it = 0; it < kSplitIt; ++it)
    LoadFour(src, static_cast<int>((threadIdx.x + it * kSplitThreads) * 4), len, v[it]);
}

// f(column, value) for each of the thread's elements of its chunk (loaded as LoadChunk does).
template <typename F>
__device__ __forceinline__ void ForChunk(const float* __restrict__ src, int len, F&& f) {
  float vv[kSplitIt][4];
  LoadChunk(src, len, vv);
#pragma unroll
  for (int it = 0; it < kSplitIt; ++it) {
    const int j = (threadIdx.x + it * kSplitThreads) * 4;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (j + u < len) f(j + u, vv[it][u]);
  }
}

// Block-wide best candidate (valid in every thread). `red` holds kSplitThreads / 32 entries.
__device__ __forceinline__ Candidate BlockBestCandidate(Candidate best, Candidate* red) {
  best = WarpBest(best);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = best;
  __syncthreads();
  best = red[0];
  for (int w = 1; w < kSplitThreads / 32; ++w)
    if (CandidateBefore(red[w], best)) best = red[w];
  return best;
}

__global__ void __launch_bounds__(kSplitThreads) SplitKernel(const float* __restrict__ y, int64_t ldy,
                                                             int64_t n_valid, int32_t id_base,
                                                             const ReduceRow* __restrict__ rows,
                                                             int chunk, uint32_t min_k,
                                                             uint8_t* __restrict__ scratch) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.y];
  const bool best_row = BestRow(r);
  if (!best_row && !SmallTopKRow(r, min_k)) return;
  const int nchunks = gridDim.x;
  uint8_t* rec = scratch + (static_cast<size_t>(blockIdx.y) * nchunks + blockIdx.x) * kSplitRec;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t rest = n_valid - c0;
  const int len = rest <= 0 ? 0 : (rest < chunk ? static_cast<int>(rest) : chunk);
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy + c0;
  const uint32_t idb = static_cast<uint32_t>(id_base + static_cast<int32_t>(c0));
  __shared__ Candidate cred[kSplitThreads / 32];

  if (best_row) {
    const bool sample = r.mode == static_cast<uint8_t>(ReduceMode::kSample);
    Candidate best{-1, kNegInf, 0.f};
    ForChunk(src, len, [&](int j, float v) {
      const Candidate c = BestCandidate(r, sample, v, idb + static_cast<uint32_t>(j));
      if (CandidateBefore(c, best)) best = c;
    });
    best = BlockBestCandidate(best, cred);
    if (threadIdx.x == 0) {  // a best row's chunk record is one bare Candidate
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
  __shared__ TopKShared sh;
  const uint32_t k = r.k;
  const float T = r.temperature;

  // Pass 1: stage, keys, thread maximum key, max of v / T (first of equals).
  uint64_t tm = 0;
  MaxAt best{kNegInf, INT64_MAX};
  ForChunk(src, len, [&](int j, float v) {
    sv[j] = v;
    const uint64_t key = TopKKey(v, idb + static_cast<uint32_t>(j));
    tm = key > tm ? key : tm;
    best = Better(best, MaxAt{Scaled(v, T), j});
  });
  const float gmax = BlockMaxAndThreshold(best, tm, k, sh);

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
          sum += static_cast<double>(SumTerm(Scaled(v, T), gmax));
        else
          has_nan |= v != v;
      }
    }
  }
  const double total = BlockSumDouble(sum, sh.dred);  // syncs: sh.t is final afterwards
  const bool any_nan = __syncthreads_or(has_nan);
  const uint64_t t = sh.t;
  for (int j = threadIdx.x * 4; j < len; j += kSplitThreads * 4) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (j + u < len) {
        const uint64_t key = TopKKey(sv[j + u], idb + static_cast<uint32_t>(j + u));
        if (key >= t) cand[atomicAdd(&sh.cnt, 1u)] = key;
      }
    }
  }
  __syncthreads();
  const uint32_t cnt = sh.cnt;
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
                                                            uint32_t min_k,
                                                            const uint8_t* __restrict__ scratch) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.x];
  const bool best_row = BestRow(r);
  if (!best_row && !SmallTopKRow(r, min_k)) return;
  const uint8_t* recs = scratch + static_cast<size_t>(blockIdx.x) * nchunks * kSplitRec;
  uint8_t* out = payload + r.out_offset;
  __shared__ Candidate cred[kSplitThreads / 32];
  if (best_row) {
    Candidate best{-1, kNegInf, 0.f};
    for (int c = threadIdx.x; c < nchunks; c += kSplitThreads) {
      const uint32_t* cw = reinterpret_cast<const uint32_t*>(recs + static_cast<size_t>(c) * kSplitRec);
      const Candidate o{static_cast<int32_t>(cw[0]), __uint_as_float(cw[1]), __uint_as_float(cw[2])};
      if (CandidateBefore(o, best)) best = o;
    }
    best = BlockBestCandidate(best, cred);
    if (threadIdx.x == 0) {
      WritePartial(out, 0.f, 0.f);
      WriteCandidate(out, best, 0);
    }
    return;
  }
  __shared__ uint64_t cand[kSplitMergeCand];
  __shared__ TopKShared sh;
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
  const float gmax = BlockMaxAndThreshold(best, tm, k, sh);
  double sum = 0.0;
  if (isfinite(gmax)) {
    for (int c = threadIdx.x; c < nchunks; c += kSplitThreads) {
      const uint8_t* rc = recs + static_cast<size_t>(c) * kSplitRec;
      const float cm = reinterpret_cast<const float*>(rc)[0];
      const double cs = reinterpret_cast<const double*>(rc)[1];
      if (cs > 0.0 || cs != cs) sum += cs * exp(static_cast<double>(cm) - static_cast<double>(gmax));
    }
  }
  const double total = BlockSumDouble(sum, sh.dred);  // syncs: sh.t is final afterwards
  __syncthreads();
  const uint64_t t = sh.t;
  for (int e = e0; e < e1; ++e) {
    const uint64_t key = key_at(e);
    if (key >= t) cand[atomicAdd(&sh.cnt, 1u)] = key;
  }
  __syncthreads();
  const uint32_t cnt = sh.cnt;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  auto put = [&](uint32_t rank, uint64_t key) {
    const uint32_t id = TopKKeyId(key);
    const float v = src[static_cast<int64_t>(id) - id_base];  // the logit itself (NaN kept)
    WriteCandidate(out, Candidate{static_cast<int32_t>(id), v, v}, rank);
  };
  RankCandidates(cand, cnt, k, put);
  for (uint32_t i = cnt + threadIdx.x; i < k; i += kSplitThreads)
    WriteCandidate(out, Candidate{-1, kNegInf, 0.f}, i);
  if (threadIdx.x == 0) WritePartial(out, gmax, isfinite(gmax) ? static_cast<float>(total) : 0.f);
}


}  // namespace

int SplitChunk(int64_t n_valid, int fixed_chunk) {
  int64_t chunk = fixed_chunk;
  if (fixed_chunk <= 0) {
    // A function of the row length alone, so a row's softmax sum is added in the same order
    // whatever its batch mates (batch invariance): the smallest of 512..4096 columns that cuts the
    // row into at most 16 chunks. Round 2, run 3 (docs/cuda.md): at N = 32320 that is 2048, within
    // 1 us of the best size at M <= 16 and +3.5 / +6.6 us at top-8 / top-64 x64; at N = 129280 it
    // is 4096 (32 chunks), what the old rows-dependent rule chose for M >= 3.
    chunk = 512;
    while (chunk < kSplitMaxChunk && (n_valid + chunk - 1) / chunk > 16) chunk *= 2;
  }
  const int64_t min_chunk = ((n_valid + kSplitMaxChunks - 1) / kSplitMaxChunks + 255) / 256 * 256;
  chunk = std::max(chunk, min_chunk);
  return chunk > kSplitMaxChunk ? 0 : static_cast<int>(chunk);
}

size_t SplitReduceScratchBytes(int nrows) {
  return static_cast<size_t>(nrows) * kSplitMaxChunks * kSplitRec;
}

cudaError_t LaunchSplitReduce(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                              const ReduceRow* rows, int nrows, uint8_t* payload, int chunk,
                              uint32_t min_k, void* scratch, cudaStream_t stream) {
  if (chunk <= 0 || chunk > kSplitMaxChunk) return cudaErrorInvalidValue;
  uint8_t* recs = static_cast<uint8_t*>(scratch);
  const int nchunks = static_cast<int>(std::max<int64_t>(1, (n_valid + chunk - 1) / chunk));
  if (nchunks > kSplitMaxChunks) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(chunk) * 4 +
                      static_cast<size_t>(kSmallTopK) * 4 * ((chunk + 1023) / 1024) * 8;
  DH_CUDA_TRY(LaunchDependent(SplitKernel, dim3(nchunks, nrows), dim3(kSplitThreads), smem, stream,
                              y, ldy, n_valid, id_base, rows, chunk, min_k, recs));
  return LaunchDependent(SplitMerge, dim3(nrows), dim3(kSplitThreads), 0, stream, y, ldy, id_base,
                         rows, payload, nchunks, min_k, static_cast<const uint8_t*>(recs));
}

}  // namespace drafthead::cuda::epilogue
