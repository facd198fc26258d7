#include "server/request/request.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/numeric.h"
#include "server/request/hidden_decode.h"

namespace drafthead {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// Rows of hidden state (bf16 or fp32 bytes at src) into bf16 bits, refusing non-finite values
// and fp32 values beyond bf16's range (hidden_decode.h: each source byte read once, vectorised; a
// scalar loop that returned at the first bad value cost ~30 us for 5 x 5120 values on the H200
// host, the portable block loop 12.5 us here, AVX-512 ~2 us).
absl::Status DecodeHidden(const char* src, size_t elems, size_t esize, int64_t hidden,
                          const std::string& field, HiddenRows* x) {
  x->resize(elems);
  auto where = [&](size_t i) { return absl::StrCat(" at row ", i / hidden, ", column ", i % hidden); };
  if (esize == 2) {
    uint16_t bits = 0;
    const size_t bad = drafthead::hidden::CopyBf16(src, elems, x->data(), &bits);
    if (bad == elems) return absl::OkStatus();
    return Bad(field, absl::StrCat("non-finite value", where(bad)));
  }
  uint32_t bits = 0;
  const size_t bad = drafthead::hidden::Fp32ToBf16(src, elems, x->data(), &bits);
  if (bad == elems) return absl::OkStatus();
  if ((bits & 0x7f800000u) == 0x7f800000u) return Bad(field, absl::StrCat("non-finite value", where(bad)));
  return Bad(field, absl::StrCat("value ", BitsFloat(bits), where(bad), " is beyond bf16's range"));
}

// The hidden rows from hidden_region: the slice must hold exactly rows x hidden_size x esize.
absl::Status ReadHiddenRegion(const v1::RegionSlice& slice, const regions::RegionRegistry& regions,
                              size_t elems, size_t esize, int64_t hidden,
                              HiddenRows* x) {
  const size_t want = elems * esize;
  if (slice.byte_size() != want)
    return Bad("hidden_region", absl::StrCat("byte_size ", slice.byte_size(),
                                             ", want rows x hidden_size x ", esize, " = ", want));
  DH_ASSIGN_OR_RETURN(regions::RegionRef ref, regions.Find(slice.region(), "hidden_region"));
  DH_ASSIGN_OR_RETURN(regions::RegionAccess access,
                      ref.Access(slice.offset(), slice.byte_size(), "hidden_region"));
  if (const uint8_t* host = access.host_data())
    return DecodeHidden(reinterpret_cast<const char*>(host), elems, esize, hidden,
                        "hidden_region", x);
  std::string staged(want, '\0');  // device memory: one copy to the host, then decode
  DH_RETURN_IF_ERROR(access.Read(0, staged.data(), want));
  return DecodeHidden(staged.data(), elems, esize, hidden, "hidden_region", x);
}

// logits_region: FULL_LOGITS only, exactly rows x vocab_size x dtype, inside its region.
absl::Status PinLogitsRegion(const v1::LogitsRequest& req, const RowTask& t, int64_t vocab,
                             const regions::RegionRegistry& regions, LogitsDestination* dest) {
  const v1::RegionSlice& slice = req.logits_region();
  if (t.mode != RowMode::kFullLogits)
    return Bad("logits_region", absl::StrCat("only FULL_LOGITS writes logits (mode is ",
                                             v1::Mode_Name(req.mode()), ")"));
  const size_t es = OutDTypeBytes(t.dtype);
  const uint64_t want = static_cast<uint64_t>(req.rows()) * vocab * es;
  if (slice.byte_size() != want)
    return Bad("logits_region", absl::StrCat("byte_size ", slice.byte_size(),
                                             ", want rows x vocab_size x ", es, " = ", want));
  DH_ASSIGN_OR_RETURN(regions::RegionRef ref, regions.Find(slice.region(), "logits_region"));
  // Checks the slice's bounds now, so a bad one is refused before it queues.
  DH_RETURN_IF_ERROR(ref.Access(slice.offset(), slice.byte_size(), "logits_region").status());
  dest->region = std::move(ref);
  dest->offset = slice.offset();
  dest->byte_size = slice.byte_size();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits) {
  return PrepareRequest(req, limits, nullptr, nullptr);
}

absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits,
                                               const regions::RegionRegistry* regions,
                                               LogitsDestination* logits_dest) {
  PreparedRequest p;
  p.request_id = req.request_id();
  if (req.rows() == 0 || req.rows() > limits.max_rows)
    return Bad("rows", absl::StrCat(req.rows(), " is outside 1..", limits.max_rows));
  p.rows = req.rows();
  if (!v1::DType_IsValid(req.hidden_dtype()))
    return Bad("hidden_dtype", absl::StrCat("unknown value ", static_cast<int>(req.hidden_dtype())));
  if (!v1::Mode_IsValid(req.mode()))
    return Bad("mode", absl::StrCat("unknown value ", static_cast<int>(req.mode())));
  if (!v1::DType_IsValid(req.logits_dtype()))
    return Bad("logits_dtype", absl::StrCat("unknown value ", static_cast<int>(req.logits_dtype())));
  if (!v1::Head_IsValid(req.head()))
    return Bad("head", absl::StrCat("unknown value ", static_cast<int>(req.head())));
  if (req.head() == v1::BF16_EXACT && !limits.has_bf16)
    return Bad("head", "BF16_EXACT is not served (the server was started without --keep-bf16)");

  RowTask& t = p.task;
  t.head = req.head() == v1::BF16_EXACT ? RowHead::kBf16Exact : RowHead::kFp8Twin;
  t.dtype = req.logits_dtype() == v1::FP32 ? OutDType::kFp32 : OutDType::kBf16;
  t.temperature = 1.0f;
  t.k = 1;
  const float temp = req.temperature();
  if (std::isnan(temp) || std::isinf(temp))
    return Bad("temperature", "must be a finite number");
  switch (req.mode()) {
    case v1::FULL_LOGITS:
      t.mode = RowMode::kFullLogits;
      t.k = 0;
      break;
    case v1::TOP_K: {
      t.mode = RowMode::kTopK;
      const uint32_t max_k = static_cast<uint32_t>(
          std::min<int64_t>(limits.max_top_k, limits.vocab_size));
      if (req.top_k() == 0 || req.top_k() > max_k)
        return Bad("top_k", absl::StrCat(req.top_k(), " is outside 1..", max_k));
      t.k = req.top_k();
      t.want_probs = req.return_probs() ? 1 : 0;
      if (temp < 0) return Bad("temperature", "must be > 0 (or 0 for 1)");
      t.temperature = temp == 0 ? 1.0f : temp;
      break;
    }
    case v1::ARGMAX:
      t.mode = RowMode::kArgmax;
      break;
    case v1::SAMPLE:
      t.mode = RowMode::kSample;
      if (!(temp > 0)) return Bad("temperature", "must be > 0 for SAMPLE");
      t.temperature = temp;
      t.seed = req.seed();
      break;
    default:
      return Bad("mode", "unsupported");
  }

  if (req.has_hidden_region() || req.has_logits_region()) {
    if (regions == nullptr || logits_dest == nullptr) return regions::SharedMemoryOff();
    DH_RETURN_IF_ERROR(regions->CheckAnyEnabled());
  }
  if (req.has_logits_region())
    DH_RETURN_IF_ERROR(PinLogitsRegion(req, t, limits.vocab_size, *regions, logits_dest));

  const size_t elems = static_cast<size_t>(p.rows) * limits.hidden;
  const size_t esize = req.hidden_dtype() == v1::FP32 ? 4 : 2;
  if (req.has_hidden_region()) {
    if (!req.hidden().empty())
      return Bad("hidden", "must be empty when hidden_region is set");
    DH_RETURN_IF_ERROR(
        ReadHiddenRegion(req.hidden_region(), *regions, elems, esize, limits.hidden, &p.x));
    return p;
  }
  if (req.hidden().size() != elems * esize)
    return Bad("hidden", absl::StrCat("got ", req.hidden().size(), " bytes, want rows x hidden_size x ",
                                      esize, " = ", elems * esize));
  DH_RETURN_IF_ERROR(DecodeHidden(req.hidden().data(), elems, esize, limits.hidden, "hidden", &p.x));
  return p;
}

absl::StatusOr<regions::RegionSpec> RegionSpecFromProto(const v1::RegisterRegionRequest& req) {
  if (!v1::RegionKind_IsValid(req.kind()))
    return Bad("kind", absl::StrCat("unknown value ", static_cast<int>(req.kind())));
  regions::RegionSpec spec;
  spec.name = req.name();
  spec.kind = req.kind() == v1::CUDA_IPC ? regions::RegionKind::kCudaIpc : regions::RegionKind::kSystem;
  spec.shm_key = req.shm_key();
  spec.cuda_ipc_handle = req.cuda_ipc_handle();
  spec.cuda_device = req.cuda_device();
  spec.offset = req.offset();
  spec.byte_size = req.byte_size();
  return spec;
}

}  // namespace drafthead
