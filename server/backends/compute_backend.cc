#include "server/backends/compute_backend.h"

#if defined(DRAFTHEAD_HAVE_CUDA)
#include <cuda_runtime.h>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#endif

namespace drafthead {

#if defined(DRAFTHEAD_HAVE_CUDA)
absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  DH_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count), -1);
  return count;
}
#else
namespace {
constexpr char kNoCuda[] =
    "this drafthead was built without CUDA (configure with -DDRAFTHEAD_CUDA=ON on a machine with "
    "the CUDA toolkit and NCCL)";
}  // namespace

absl::StatusOr<int> CudaDeviceCount() { return absl::UnimplementedError(kNoCuda); }

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeCudaBackend(const BackendOptions&, int) {
  return absl::UnimplementedError(kNoCuda);
}
#endif

}  // namespace drafthead
