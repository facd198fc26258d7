#include "kernels/cuda/experimental/epilogue_variants.cuh"

#include <iterator>

#include "kernels/cuda/shard_reduce_internal.cuh"

namespace drafthead::cuda {

cudaError_t ShardEpilogueVariant(const float* y, int64_t ldy, int64_t n_shard, int64_t n_valid,
                                 int32_t id_base, const ReduceRow* rows_dev, int nrows,
                                 uint8_t* payload, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream, const ReduceRow* rows_host, int variant) {
  using detail::GroupTopK;
  static constexpr struct {
    int split_chunk;
    GroupTopK group;
  } kVariants[] = {{0, GroupTopK::kOn},     {-1, GroupTopK::kOff},  {512, GroupTopK::kOff},
                   {2048, GroupTopK::kOff}, {1024, GroupTopK::kOff}, {4096, GroupTopK::kOff},
                   {0, GroupTopK::kOff}};
  if (variant < 0 || variant >= static_cast<int>(std::size(kVariants))) return cudaErrorInvalidValue;
  return detail::ShardEpilogueWithSplitChunk(y, ldy, n_shard, n_valid, id_base, rows_dev, nrows,
                                             payload, scratch, scratch_bytes, stream, rows_host,
                                             kVariants[variant].split_chunk, kVariants[variant].group);
}

}  // namespace drafthead::cuda
