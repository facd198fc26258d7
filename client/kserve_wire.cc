#include "client/kserve_wire.h"

#include <climits>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "inference/grpc_service.grpc.pb.h"

namespace drafthead::client {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

const char* ModeName(v1::Mode m) {
  switch (m) {
    case v1::TOP_K: return "top_k";
    case v1::ARGMAX: return "argmax";
    case v1::SAMPLE: return "sample";
    default: return "full_logits";
  }
}

bool IsLengthDelimited(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

// Runs `scan` over the length-delimited message that follows a tag.
template <typename Scan>
bool Nested(CodedInputStream& in, Scan scan) {
  uint32_t len;
  if (!in.ReadVarint32(&len)) return false;
  const auto limit = in.PushLimit(static_cast<int>(len));
  if (!scan() || !in.ConsumedEntireMessage()) return false;
  in.PopLimit(limit);
  return true;
}

// One entry of ModelInferResponse.parameters: key = 1, value = 2 (InferParameter, int64_param = 2).
bool ScanParameter(CodedInputStream& in, ScannedResponse* out) {
  std::string key;
  uint64_t value = 0;
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == 1 && IsLengthDelimited(tag)) {
      if (!WireFormatLite::ReadString(&in, &key)) return false;
    } else if (field == 2 && IsLengthDelimited(tag)) {
      const bool ok = Nested(in, [&] {
        for (uint32_t t; (t = in.ReadTag()) != 0;) {
          if (WireFormatLite::GetTagFieldNumber(t) == 2 &&
              WireFormatLite::GetTagWireType(t) == WireFormatLite::WIRETYPE_VARINT) {
            if (!in.ReadVarint64(&value)) return false;
          } else if (!WireFormatLite::SkipField(&in, t)) {
            return false;
          }
        }
        return true;
      });
      if (!ok) return false;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  const auto v = static_cast<uint32_t>(value);
  if (key == "queue_us") out->queue_us = v;
  if (key == "compute_us") out->compute_us = v;
  if (key == "batch_rows") out->batch_rows = v;
  return true;
}

// ModelInferResponse: parameters = 4; the outputs and their raw bytes are skipped.
bool ScanInferResponse(CodedInputStream& in, ScannedResponse* out) {
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    if (WireFormatLite::GetTagFieldNumber(tag) == 4 && IsLengthDelimited(tag)) {
      if (!Nested(in, [&] { return ScanParameter(in, out); })) return false;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return true;
}

// ModelStreamInferResponse: error_message = 1, infer_response = 2.
bool ScanStreamResponse(CodedInputStream& in, ScannedResponse* out, std::string* error) {
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == 1 && IsLengthDelimited(tag)) {
      if (!WireFormatLite::ReadString(&in, error)) return false;
    } else if (field == 2 && IsLengthDelimited(tag)) {
      if (!Nested(in, [&] { return ScanInferResponse(in, out); })) return false;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return true;
}

// Triton's tensor parameters for a tensor in a shared-memory region.
void PlaceInRegion(const v1::RegionSlice& slice,
                   google::protobuf::Map<std::string, inference::InferParameter>* params) {
  (*params)["shared_memory_region"].set_string_param(slice.region());
  (*params)["shared_memory_byte_size"].set_uint64_param(slice.byte_size());
  (*params)["shared_memory_offset"].set_uint64_param(slice.offset());
}

// The code of an in-band "CODE: message" (the server's spelling, absl's code names).
int32_t InBandCode(const std::string& error) {
  for (int c = 1; c <= 16; ++c)
    if (absl::StartsWith(error, absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(c)), ":")))
      return c;
  return static_cast<int32_t>(absl::StatusCode::kUnknown);
}

}  // namespace

std::string KServeRequestBytes(const v1::LogitsRequest& native, const std::string& model) {
  inference::ModelInferRequest r;
  r.set_model_name(model);
  r.set_id(absl::StrCat(native.request_id()));
  auto* in = r.add_inputs();
  in->set_name("hidden");
  in->set_datatype(native.hidden_dtype() == v1::FP32 ? "FP32" : "BF16");
  const size_t esize = native.hidden_dtype() == v1::FP32 ? 4 : 2;
  const bool in_region = native.has_hidden_region();
  const uint64_t bytes = in_region ? native.hidden_region().byte_size() : native.hidden().size();
  in->add_shape(native.rows());
  in->add_shape(native.rows() == 0 ? 0 : bytes / esize / native.rows());
  if (in_region)
    PlaceInRegion(native.hidden_region(), in->mutable_parameters());
  else
    r.add_raw_input_contents(native.hidden());
  if (native.has_logits_region()) {
    auto* out = r.add_outputs();
    out->set_name("logits");
    PlaceInRegion(native.logits_region(), out->mutable_parameters());
  }
  auto& p = *r.mutable_parameters();
  p["mode"].set_string_param(ModeName(native.mode()));
  if (native.mode() == v1::TOP_K) p["top_k"].set_int64_param(native.top_k());
  if (native.return_probs()) p["return_probs"].set_bool_param(true);
  if (native.temperature() != 0) p["temperature"].set_double_param(native.temperature());
  if (native.mode() == v1::SAMPLE) p["seed"].set_uint64_param(native.seed());
  if (native.logits_dtype() == v1::FP32) p["logits_dtype"].set_string_param("FP32");
  if (native.head() == v1::BF16_EXACT) p["head"].set_string_param("bf16_exact");
  return r.SerializeAsString();
}

absl::Status ProbeKServe(const std::shared_ptr<grpc::Channel>& channel, const std::string& request,
                         absl::Duration timeout) {
  inference::ModelInferRequest req;
  if (!req.ParseFromString(request)) return absl::InternalError("probe: unreadable ModelInferRequest");
  inference::ModelInferResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  const grpc::Status s = inference::GRPCInferenceService::NewStub(channel)->ModelInfer(&ctx, req, &resp);
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

int ScanKServeAnswer(grpc::ByteBuffer* answer, bool stream, ScannedResponse* out, const std::string** msg) {
  static const std::string kMalformed = "response is not a valid ModelInferResponse";
  static const std::string kInBand = "in-band error";
  grpc::ProtoBufferReader reader(answer);
  CodedInputStream in(&reader);
  in.SetTotalBytesLimit(INT_MAX);
  std::string error;
  const bool ok = stream ? ScanStreamResponse(in, out, &error) : ScanInferResponse(in, out);
  if (!ok || !in.ConsumedEntireMessage()) {
    *msg = &kMalformed;
    return kMalformedCode;
  }
  if (!error.empty()) {
    out->error_code = InBandCode(error);
    out->has_error_message = true;
    *msg = &kInBand;
    return out->error_code;
  }
  return 0;
}

}  // namespace drafthead::client
