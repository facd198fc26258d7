#include "kernels/cuda/experimental/epilogue_variants.cuh"

#include "kernels/cuda/shard_reduce_internal.cuh"

namespace drafthead::cuda {

cudaError_t ShardEpilogueVariant(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                                 int32_t id_base, const ReduceRow* rows_dev, int nrows,
                                 uint8_t* payload, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream, const ReduceRow* rows_host, int variant) {
  static constexpr int kSplitChunk[] = {0, -1, 512, 2048, 1024, 4096, 0, 0};  // by variant
  if (variant < 0 || variant > 7) return cudaErrorInvalidValue;
  return detail::ShardEpilogueWithSplitChunk(y, ldy, n_shard, n_valid, id_base, rows_dev, nrows,
                                             payload, scratch, scratch_bytes, stream, rows_host,
                                             kSplitChunk[variant], variant == 0 ? 1 : variant == 7 ? 2 : 0);
}

}  // namespace drafthead::cuda
