#include "kernels/cuda/experimental/epilogue_variants.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/experimental/group_topk.cuh"
#include "kernels/cuda/shard_reduce_internal.cuh"
#include "kernels/cuda/split_reduce.cuh"

namespace drafthead::cuda {

// Variant 6 serves TOP_K k <= kGroupTopK on the group family where the split path is on for the
// shape (the split path then leaves those rows); elsewhere it is the default dispatch.
static bool GroupServes(int64_t n_valid) {
  return n_valid <= epilogue::kGroupMaxCols && epilogue::SplitChunk(n_valid, 0) > 0;
}

size_t EpilogueVariantScratchBytes(int64_t n_valid, int nrows, int variant) {
  const size_t base = EpilogueScratchBytes(n_valid, nrows);
  if (variant != 6 || !GroupServes(n_valid)) return base;
  return (base + 15) / 16 * 16 + epilogue::GroupTopKScratchBytes(n_valid, nrows);
}

cudaError_t ShardEpilogueVariant(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                                 int32_t id_base, const ReduceRow* rows_dev, int nrows,
                                 uint8_t* payload, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream, const ReduceRow* rows_host, int variant) {
  static constexpr int kSplitChunk[] = {0, -1, 512, 2048, 1024, 4096, 0};  // by variant
  if (variant < 0 || variant > 6) return cudaErrorInvalidValue;
  const bool group = variant == 6 && GroupServes(n_valid);
  if (group && scratch_bytes < EpilogueVariantScratchBytes(n_valid, nrows, variant)) return cudaErrorInvalidValue;
  // The rest first: it validates the arguments.
  DH_CUDA_TRY(detail::ShardEpilogueWithSplitChunk(y, ldy, n_shard, n_valid, id_base, rows_dev, nrows,
                                                  payload, scratch, scratch_bytes, stream, rows_host,
                                                  kSplitChunk[variant], group ? epilogue::kGroupTopK + 1 : 1));
  if (!group || nrows <= 0) return cudaSuccess;
  if (rows_host != nullptr) {  // launched only where a row needs it
    bool any = false;
    for (int i = 0; i < nrows; ++i)
      any = any || (rows_host[i].mode == static_cast<uint8_t>(ReduceMode::kTopK) && rows_host[i].k <= epilogue::kGroupTopK);
    if (!any) return cudaSuccess;
  }
  const size_t off = (EpilogueScratchBytes(n_valid, nrows) + 15) / 16 * 16;
  return epilogue::LaunchGroupTopK(y, ldy, n_valid, id_base, rows_dev, nrows, payload,
                                   static_cast<uint8_t*>(scratch) + off, scratch_bytes - off, stream);
}

}  // namespace drafthead::cuda
