// The messages of the raw RPCs (StreamLogits, the callback API's ComputeLogits, KServe's streams):
// requests parsed out of the ByteBuffers gRPC read, answers serialized into the ByteBuffers it
// writes. Pure functions, no threads.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "drafthead/v1/drafthead.pb.h"

namespace drafthead {

// An answer serialized once into `out`: the one copy the server holds from then until gRPC has
// written it (StartWrite refers to its slices, it copies nothing), so a stream's budget counts
// exactly out->Length(). INTERNAL if it cannot be (over protobuf's 2 GiB).
absl::Status SerializeAnswer(const google::protobuf::MessageLite& answer, grpc::ByteBuffer* out);
// SerializeAnswer for a LogitsResponse, without copying its logits: they are moved out of `answer`
// into a slice of their own (freed when gRPC is done with it), after the rest serialized with the
// logits field's tag and length (fields may come in any order on the wire). `answer` is left
// without its logits. Small answers are serialized as SerializeAnswer does.
absl::Status SerializeLogitsResponse(v1::LogitsResponse* answer, grpc::ByteBuffer* out);
// A request parsed from what gRPC read (`in` is emptied); INVALID_ARGUMENT when the bytes are not
// a `msg`.
absl::Status ParseRequest(grpc::ByteBuffer* in, google::protobuf::MessageLite* msg);

}  // namespace drafthead
