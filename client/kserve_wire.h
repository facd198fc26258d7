// The load tester's side of the KServe v2 API (drafthead-client load --protocol=kserve): a native
// request restated as a ModelInferRequest, one checked call, and the measured fields read off a
// serialized ModelInferResponse / ModelStreamInferResponse without parsing it into a message (the
// raw output bytes are skipped, as the native scanner skips the logits).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/response_scan.h"
#include "drafthead/v1/drafthead.pb.h"

namespace drafthead::client {

inline constexpr char kKServeUnaryMethod[] = "/inference.GRPCInferenceService/ModelInfer";
inline constexpr char kKServeStreamMethod[] = "/inference.GRPCInferenceService/ModelStreamInfer";

// The ModelInferRequest (serialized) that asks `model` what `native` asks: input `hidden` (inline,
// or where hidden_region says, as Triton's shared-memory tensor parameters; a logits_region
// likewise for output `logits`), the mode's parameters (only those that differ from the
// protocol's defaults), id = request_id.
std::string KServeRequestBytes(const v1::LogitsRequest& native, const std::string& model);

// One ModelInfer of the serialized `request`, its status.
absl::Status ProbeKServe(const std::shared_ptr<grpc::Channel>& channel, const std::string& request,
                         absl::Duration timeout);

// Reads one answer (a ModelInferResponse, or with `stream` a ModelStreamInferResponse) as
// ScanAnswer does: 0, the in-band error's code (from its "CODE: " prefix; UNKNOWN without one), or
// kMalformedCode; the timing from the response parameters queue_us / compute_us / batch_rows.
int ScanKServeAnswer(grpc::ByteBuffer* answer, bool stream, ScannedResponse* out, const std::string** msg);

}  // namespace drafthead::client
