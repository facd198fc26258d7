#include "server/backends/compute_backend.h"

namespace drafthead {

#if !defined(DRAFTHEAD_HAVE_CUDA)
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeCudaBackend(const BackendOptions&, int) {
  return absl::UnimplementedError(
      "this drafthead was built without CUDA (configure with -DDRAFTHEAD_CUDA=ON on a machine with "
      "the CUDA toolkit and NCCL)");
}
#endif

}  // namespace drafthead
