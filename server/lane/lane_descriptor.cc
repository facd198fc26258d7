#include "server/lane/lane_descriptor.h"

#include "absl/strings/str_cat.h"

namespace drafthead {
namespace {

absl::Status Bad(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::StatusOr<const std::string*> RegionOf(const lane::LaneSlice& s, const char* field,
                                            const std::vector<std::string>& names) {
  if (s.region >= names.size())
    return Bad(field, absl::StrCat("region index ", s.region, " is not one of the lane's ",
                                   names.size(), " regions"));
  return &names[s.region];
}

void SetSlice(const std::string& name, const lane::LaneSlice& s, v1::RegionSlice* out) {
  out->set_region(name);
  out->set_offset(s.offset);
  out->set_byte_size(s.byte_size);
}

}  // namespace

absl::StatusOr<ParsedDescriptor> ParseDescriptor(const lane::LaneRequest& d,
                                                 const std::vector<std::string>& region_names,
                                                 const LaneLimits& limits) {
  ParsedDescriptor p;
  v1::LogitsRequest& r = p.req;
  r.set_request_id(d.request_id);
  r.set_rows(d.rows);
  // Enum fields keep their raw numbers: PrepareRequest names an unknown one.
  r.set_hidden_dtype(static_cast<v1::DType>(d.hidden_dtype));
  r.set_mode(static_cast<v1::Mode>(d.mode));
  r.set_logits_dtype(static_cast<v1::DType>(d.logits_dtype));
  r.set_head(static_cast<v1::Head>(d.head));
  r.set_top_k(d.top_k);
  r.set_return_probs((d.flags & lane::kFlagReturnProbs) != 0);
  r.set_temperature(d.temperature);
  r.set_seed(d.seed);
  if ((d.flags & ~lane::kKnownRequestFlags) != 0)
    return Bad("flags", absl::StrCat("unknown bits 0x", absl::Hex(d.flags & ~lane::kKnownRequestFlags)));
  p.timeout_us = d.timeout_us;
  p.ids64 = (d.flags & lane::kFlagIds64) != 0;

  if (d.hidden.region == lane::kNoRegion) return Bad("hidden", "a lane request names its rows' region slice");
  auto hidden = RegionOf(d.hidden, "hidden", region_names);
  if (!hidden.ok()) return hidden.status();
  SetSlice(**hidden, d.hidden, r.mutable_hidden_region());

  const bool has_output = d.output.region != lane::kNoRegion;
  const std::string* output = nullptr;
  if (has_output) {
    auto o = RegionOf(d.output, "output", region_names);
    if (!o.ok()) return o.status();
    output = *o;
  }
  if (d.mode == v1::FULL_LOGITS) {
    if (!has_output) return Bad("output", "FULL_LOGITS over a lane writes into an output slice; none given");
    SetSlice(*output, d.output, r.mutable_logits_region());
    return p;
  }
  // Token answers. Out-of-range rows / top_k are PrepareRequest's to name; sizes only when sane.
  uint64_t k = 1;
  if (d.mode == v1::TOP_K) k = d.top_k;
  const bool sane = d.rows >= 1 && d.rows <= limits.max_rows && k >= 1 && k <= limits.max_top_k &&
                    d.mode <= v1::SAMPLE;
  const bool probs = d.mode == v1::TOP_K && r.return_probs();
  p.token_bytes = sane ? lane::TokenAnswerBytes(d.rows, k, probs, p.ids64) : 0;
  if (has_output) {
    if (sane && d.output.byte_size < p.token_bytes)
      return Bad("output", absl::StrCat("byte_size ", d.output.byte_size, " cannot hold the answer's ",
                                        p.token_bytes, " bytes (rows x k x ",
                                        lane::TokenAnswerBytes(1, 1, probs, p.ids64), ")"));
    p.tokens_region = *output;
    p.tokens_offset = d.output.offset;
  } else if (p.token_bytes > limits.inline_bytes) {
    return Bad("output", absl::StrCat("the answer's ", p.token_bytes, " bytes exceed the lane's ",
                                      limits.inline_bytes, " inline bytes a slot: give an output slice"));
  }
  return p;
}

absl::Status CheckLaneHeader(const lane::LaneHeader& h, uint64_t byte_size, uint64_t nonce, int32_t pid) {
  if (h.magic != lane::kLaneMagic) return Bad("shm_key", "the object does not start with the lane magic");
  if (h.version != lane::kLaneLayoutVersion || h.header_bytes != lane::kHeaderBytes)
    return Bad("layout_version", absl::StrCat("the header says version ", h.version, ", header ",
                                              h.header_bytes, " bytes"));
  if (h.nonce != nonce) return Bad("nonce", "does not match the object's header");
  if (h.depth == 0 || h.depth > lane::kMaxDepth || (h.depth & (h.depth - 1)) != 0)
    return Bad("shm_key", absl::StrCat("depth ", h.depth, " is not a power of two in 1..", lane::kMaxDepth));
  if (h.inline_bytes % 64 != 0 || h.inline_bytes > lane::kMaxInlineBytes)
    return Bad("shm_key", absl::StrCat("inline_bytes ", h.inline_bytes, " is not a multiple of 64 <= ",
                                       lane::kMaxInlineBytes));
  const lane::LaneGeometry g = lane::GeometryFor(h.depth, h.inline_bytes);
  if (h.request_bytes != sizeof(lane::LaneRequest) || h.completion_bytes != g.completion_bytes ||
      h.requests_offset != g.requests_offset || h.completions_offset != g.completions_offset ||
      h.total_bytes != g.total_bytes || g.total_bytes != byte_size)
    return Bad("byte_size", absl::StrCat("the header's geometry is not the layout's for depth ", h.depth,
                                         " and ", h.inline_bytes, " inline bytes (", g.total_bytes,
                                         " bytes; the object has ", byte_size, ")"));
  if (h.client_pid != pid) return Bad("pid", "does not match the header's client_pid");
  return absl::OkStatus();
}

}  // namespace drafthead
