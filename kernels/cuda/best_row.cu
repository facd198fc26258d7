#include "kernels/cuda/best_row.cuh"

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace drafthead::cuda::epilogue {
namespace {

constexpr int kBestThreads = 512;

__global__ void __launch_bounds__(kBestThreads) BestKernel(const float* __restrict__ y, int64_t ldy,
                                                           int64_t n_valid, int32_t id_base,
                                                           const ReduceRow* __restrict__ rows,
                                                           uint8_t* __restrict__ payload) {
  WaitForPrerequisites();
  const ReduceRow r = rows[blockIdx.x];
  const bool sample = r.mode == static_cast<uint8_t>(ReduceMode::kSample);
  if (!sample && r.mode != static_cast<uint8_t>(ReduceMode::kArgmax)) return;
  const float* src = y + static_cast<int64_t>(r.y_row) * ldy;
  Candidate best{-1, kNegInf, 0.f};
  for (int64_t j = threadIdx.x; j < n_valid; j += kBestThreads) {
    const Candidate c = BestCandidate(r, sample, src[j], static_cast<uint32_t>(id_base + j));
    if (CandidateBefore(c, best)) best = c;
  }
  best = WarpBest(best);
  __shared__ Candidate warp_best[kBestThreads / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < kBestThreads / 32 ? warp_best[lane] : Candidate{-1, kNegInf, 0.f};
    best = WarpBest(best);
    if (lane == 0) {
      WritePartial(payload + r.out_offset, 0.f, 0.f);
      WriteCandidate(payload + r.out_offset, best, 0);
    }
  }
}

}  // namespace

cudaError_t LaunchBestPerRow(const float* y, int64_t ldy, int64_t n_valid, int32_t id_base,
                             const ReduceRow* rows, int nrows, uint8_t* payload,
                             cudaStream_t stream) {
  return LaunchDependent(BestKernel, dim3(nrows), dim3(kBestThreads), 0, stream, y, ldy, n_valid,
                         id_base, rows, payload);
}

}  // namespace drafthead::cuda::epilogue
