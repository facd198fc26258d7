#include "client/response_scan.h"

#include <climits>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

namespace drafthead::client {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

bool ScanTiming(CodedInputStream& in, ScannedResponse* out) {
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    uint32_t v;
    if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT && field >= 1 &&
        field <= 3 + kTimingStages) {
      if (!in.ReadVarint32(&v)) return false;
      if (field > 3) {
        out->stage_us[field - 4] = v;
      } else {
        (field == 1 ? out->queue_us : field == 2 ? out->compute_us : out->batch_rows) = v;
      }
    } else if (field == 13 && WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return false;
      out->step_untimed = v != 0;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return true;
}

bool ScanError(CodedInputStream& in, ScannedResponse* out) {
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == 1 && WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return false;
      out->error_code = static_cast<int32_t>(v);
    } else {
      if (field == 2) out->has_error_message = true;
      if (!WireFormatLite::SkipField(&in, tag)) return false;
    }
  }
  return true;
}

// LogitsResponse: rows = 2 (varint), timing = 9, error = 10 (messages); everything else skipped.
bool Scan(CodedInputStream& in, ScannedResponse* out) {
  in.SetTotalBytesLimit(INT_MAX);
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto wt = WireFormatLite::GetTagWireType(tag);
    if (field == 2 && wt == WireFormatLite::WIRETYPE_VARINT) {
      if (!in.ReadVarint32(&out->rows)) return false;
    } else if ((field == 9 || field == 10) && wt == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t len;
      if (!in.ReadVarint32(&len)) return false;
      const auto limit = in.PushLimit(static_cast<int>(len));
      if (!(field == 9 ? ScanTiming(in, out) : ScanError(in, out))) return false;
      if (!in.ConsumedEntireMessage()) return false;
      in.PopLimit(limit);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return in.ConsumedEntireMessage();
}

}  // namespace

bool ScanLogitsResponse(const std::string& bytes, ScannedResponse* out) {
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
  CodedInputStream in(&stream);
  return Scan(in, out);
}

int ScanAnswer(grpc::ByteBuffer* answer, ScannedResponse* out, const std::string** msg) {
  static const std::string kMalformed = "response is not a valid LogitsResponse";
  static const std::string kInBand = "in-band error";
  grpc::ProtoBufferReader reader(answer);
  CodedInputStream in(&reader);
  if (!Scan(in, out)) {
    *msg = &kMalformed;
    return kMalformedCode;
  }
  if (out->error_code != 0) {
    *msg = &kInBand;
    return out->error_code;
  }
  return 0;
}

}  // namespace drafthead::client
