#include "server/api/request.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/numeric.h"

namespace drafthead {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

absl::StatusOr<PreparedRequest> PrepareRequest(const v1::LogitsRequest& req,
                                               const ServingLimits& limits) {
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

  const size_t elems = static_cast<size_t>(p.rows) * limits.hidden;
  const size_t esize = req.hidden_dtype() == v1::FP32 ? 4 : 2;
  if (req.hidden().size() != elems * esize)
    return Bad("hidden", absl::StrCat("got ", req.hidden().size(), " bytes, want rows x hidden_size x ",
                                      esize, " = ", elems * esize));
  p.x.resize(elems);
  const char* src = req.hidden().data();
  if (esize == 2) {
    std::memcpy(p.x.data(), src, elems * 2);
    for (size_t i = 0; i < elems; ++i)
      if ((p.x[i] & 0x7f80u) == 0x7f80u)
        return Bad("hidden", absl::StrCat("non-finite value at row ", i / limits.hidden,
                                          ", column ", i % limits.hidden));
  } else {
    for (size_t i = 0; i < elems; ++i) {
      float f;
      std::memcpy(&f, src + i * 4, 4);
      if (!std::isfinite(f))
        return Bad("hidden", absl::StrCat("non-finite value at row ", i / limits.hidden,
                                          ", column ", i % limits.hidden));
      p.x[i] = FloatToBf16(f);
    }
  }
  return p;
}

}  // namespace drafthead
