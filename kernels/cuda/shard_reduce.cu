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
                                                           uint8_t* __restrict__ scratch) {
  const ReduceRow r = rows[blockIdx.x];
  if (r.mode != static_cast<uint8_t>(ReduceMode::kTopK) || r.k == 0 || r.k > kMaxTopK) return;
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
                                                          const uint8_t* __restrict__ scratch) {
  const ReduceRow r = rows[blockIdx.x];
  if (r.mode != static_cast<uint8_t>(ReduceMode::kTopK) || r.k == 0 || r.k > kMaxTopK) return;
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

}  // namespace

size_t EpilogueScratchBytes(int64_t n_valid, int nrows) {
  const int64_t segs = (n_valid + kTopKSmemFloats - 1) / kTopKSmemFloats;
  return segs <= 1 ? 0 : static_cast<size_t>(segs) * nrows * kSegRecord;
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
  if (nrows <= 0) return cudaSuccess;
  if (ldy % 4 != 0 || n_valid > n_shard || n_valid < 0 || n_shard < 1 || ldy < n_shard ||
      (reinterpret_cast<uintptr_t>(y) & 15u) != 0 || nrows > 65535)
    return cudaErrorInvalidValue;
  const int64_t fx = (n_shard + 1023) / 1024;
  if (fx > 0x7fffffff) return cudaErrorInvalidValue;
  FullLogitsKernel<<<dim3(static_cast<unsigned>(fx), nrows), 256, 0, stream>>>(y, ldy, n_shard,
                                                                               rows_dev, payload);
  DH_CUDA_TRY(cudaGetLastError());
  BestKernel<<<nrows, kBestThreads, 0, stream>>>(y, ldy, n_valid, id_base, rows_dev, payload);
  DH_CUDA_TRY(cudaGetLastError());
  const int64_t segs = std::max<int64_t>(1, (n_valid + kTopKSmemFloats - 1) / kTopKSmemFloats);
  const int64_t seg_len = segs == 1 ? std::max<int64_t>(n_valid, 1) : (n_valid + segs - 1) / segs;
  if (segs > 1) {
    if (scratch == nullptr || scratch_bytes < EpilogueScratchBytes(n_valid, nrows) ||
        segs > kMergeMaxKeys / static_cast<int64_t>(kMaxTopK))
      return cudaErrorInvalidValue;
  }
  const int smem_floats = static_cast<int>(std::min<int64_t>(seg_len, kTopKSmemFloats));
  DH_CUDA_TRY(cudaFuncSetAttribute(TopKKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   kTopKSmemFloats * 4));
  TopKKernel<<<dim3(nrows, static_cast<unsigned>(segs)), kTopKThreads,
               smem_floats * sizeof(float), stream>>>(y, ldy, n_valid, id_base, rows_dev, payload,
                                                      smem_floats, seg_len,
                                                      static_cast<uint8_t*>(scratch));
  DH_CUDA_TRY(cudaGetLastError());
  if (segs > 1) {
    size_t keys = 1;  // the bitonic sort pads to a power of two
    while (keys < static_cast<size_t>(segs) * kMaxTopK) keys <<= 1;
    DH_CUDA_TRY(cudaFuncSetAttribute(TopKMerge, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kMergeMaxKeys * 8));
    TopKMerge<<<nrows, kTopKThreads, keys * 8, stream>>>(y, ldy, id_base, rows_dev, payload,
                                                        static_cast<int>(segs),
                                                        static_cast<const uint8_t*>(scratch));
  }
  return cudaGetLastError();
}

}  // namespace drafthead::cuda
