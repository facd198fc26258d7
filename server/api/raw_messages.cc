#include "server/api/raw_messages.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace drafthead {

absl::Status SerializeAnswer(const google::protobuf::MessageLite& answer, grpc::ByteBuffer* out) {
  bool own = false;
  const grpc::Status s = grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(
      answer, out, &own);
  if (!s.ok()) return absl::InternalError(absl::StrCat("the answer could not be serialized: ", s.error_message()));
  return absl::OkStatus();
}

absl::Status SerializeLogitsResponse(v1::LogitsResponse* answer, grpc::ByteBuffer* out) {
  // Below this the copy costs less than a second slice.
  constexpr size_t kMoveLogitsBytes = 64 << 10;
  if (answer->logits().size() < kMoveLogitsBytes) return SerializeAnswer(*answer, out);
  std::unique_ptr<std::string> logits(answer->release_logits());
  std::string head;
  if (!answer->SerializeToString(&head))
    return absl::InternalError("the answer could not be serialized");
  // The logits field's key (length-delimited), then the length.
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  uint8_t key[16];
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(v1::LogitsResponse::kLogitsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), key);
  end = CodedOutputStream::WriteVarint64ToArray(logits->size(), end);
  head.append(reinterpret_cast<const char*>(key), end - key);
  grpc::Slice parts[2] = {grpc::Slice(head),
                          grpc::Slice(logits->data(), logits->size(),
                                      [](void* s) { delete static_cast<std::string*>(s); }, logits.get())};
  logits.release();  // the slice owns it now
  *out = grpc::ByteBuffer(parts, 2);
  return absl::OkStatus();
}

absl::Status ParseRequest(grpc::ByteBuffer* in, google::protobuf::MessageLite* msg) {
  const grpc::Status s =
      grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::MessageLite>(in, msg);
  if (!s.ok())
    return absl::InvalidArgumentError(absl::StrCat("the message is not a ", msg->GetTypeName(), ": ", s.error_message()));
  return absl::OkStatus();
}

}  // namespace drafthead
