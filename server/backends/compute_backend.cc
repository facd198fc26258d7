#include "server/backends/compute_backend.h"

#include "absl/strings/str_cat.h"

#if defined(DRAFTHEAD_HAVE_CUDA)
#include <cuda_runtime.h>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#endif

namespace drafthead {

absl::Status CheckDeviceRowsOut(const BatchControl& ctl, const ShardGeometry& geo) {
  if (ctl.device_outs > static_cast<uint32_t>(kMaxRowsLimit))
    return absl::InvalidArgumentError(absl::StrCat("device rows out: ", ctl.device_outs, " entries"));
  uint32_t next = 0;  // the first row the next entry may name
  for (uint32_t i = 0; i < ctl.device_outs; ++i) {
    const DeviceRowsOut& o = ctl.device_out[i];
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("device rows out ", i, " (rows ", o.row0, "+",
                                                     o.rows, " of ", ctl.rows, "): ", why));
    };
    if (o.rows == 0 || o.row0 < next || o.row0 > ctl.rows || o.rows > ctl.rows - o.row0)
      return bad("empty, out of row order, overlapping or outside the batch");
    if (o.dst == nullptr) return bad("no destination");
    const OutDType dtype = ctl.tasks[o.row0].dtype;
    for (uint32_t r = o.row0; r < o.row0 + o.rows; ++r) {
      if (ctl.tasks[r].mode != RowMode::kFullLogits) return bad("a row is not FULL_LOGITS");
      if (ctl.tasks[r].dtype != dtype) return bad("rows of two dtypes");
    }
    const uint64_t width = static_cast<uint64_t>(geo.valid_cols()) * OutDTypeBytes(dtype);
    if (o.dst_pitch < width) return bad(absl::StrCat("pitch ", o.dst_pitch, " < a row's ", width, " bytes"));
    next = o.row0 + o.rows;
  }
  return absl::OkStatus();
}

size_t HostPayloadBytes(const BatchControl& ctl, const PayloadLayout& layout) {
  // The last row not covered by an entry, walking back over the entries from the end.
  int64_t row = static_cast<int64_t>(ctl.rows) - 1;
  for (int64_t i = static_cast<int64_t>(ctl.device_outs) - 1; i >= 0 && row >= 0; --i) {
    const DeviceRowsOut& o = ctl.device_out[i];
    if (static_cast<int64_t>(o.row0 + o.rows) - 1 != row) break;  // a host row after this entry
    row = static_cast<int64_t>(o.row0) - 1;
  }
  return row < 0 ? 0 : layout.row_offset[static_cast<size_t>(row) + 1];
}

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
