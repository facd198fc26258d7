#include "client/native_grpc/unary_c_api.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#define DH_EXPORT __attribute__((visibility("default")))

namespace {

struct Channel {
  std::shared_ptr<grpc::Channel> channel;
  grpc::GenericStub stub;
  std::mutex mu;
  std::set<grpc::ClientContext*> live;  // the calls unfinished, for dh_grpc_shutdown (guarded by mu)
  bool shut = false;                     // guarded by mu
  explicit Channel(std::shared_ptr<grpc::Channel> c) : channel(c), stub(std::move(c)) {}
};

// One call: its context, its own completion queue and what Finish fills. Refused calls (code != 0
// from the start) carry only their code and message.
struct Call {
  Channel* channel = nullptr;  // null: refused at start (nothing registered, no queue events)
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  grpc::ByteBuffer answer;
  grpc::Status status;
  bool ended = false;
  int code = 0;
  std::string message;
  // dh_grpc_answer_field_bytes' findings: the field, how often it came, the last one's size.
  int split_field = 0;
  int split_count = 0;
  uint32_t split_bytes = 0;

  ~Call() {
    cq.Shutdown();  // a queue is shut down and drained before it is destroyed
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
    if (channel == nullptr) return;
    std::lock_guard<std::mutex> l(channel->mu);
    channel->live.erase(&ctx);
  }
};

void Message(char* msg, size_t msg_len, const std::string& s) {
  if (msg == nullptr || msg_len == 0) return;
  const size_t n = std::min(s.size(), msg_len - 1);
  std::memcpy(msg, s.data(), n);
  msg[n] = '\0';
}

Call* Refused(grpc::StatusCode code, std::string message) {
  auto* call = new Call;
  call->ended = true;
  call->code = static_cast<int>(code);
  call->message = std::move(message);
  return call;
}

// Waits for the call's one event (Finish's) up to `until`; true once it came.
bool WaitEnd(Call* call, std::chrono::system_clock::time_point until) {
  if (call->ended) return true;
  void* tag = nullptr;
  bool ok = false;
  switch (call->cq.AsyncNext(&tag, &ok, until)) {
    case grpc::CompletionQueue::GOT_EVENT:
      call->ended = true;
      return true;
    case grpc::CompletionQueue::SHUTDOWN:  // not before ~Call: only if gRPC itself shut it
      call->ended = true;
      call->status = grpc::Status(grpc::StatusCode::INTERNAL, "the call's completion queue shut down");
      return true;
    default:
      return false;
  }
}

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using google::protobuf::internal::WireFormatLite;

bool IsField(uint32_t tag, int field) {
  return WireFormatLite::GetTagFieldNumber(tag) == field &&
         WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

// How often top-level length-delimited field `field` comes in the answer and the last one's size
// (the one a parser keeps); false if the answer is not protobuf wire format. Reads the answer's
// slices in place.
bool FindField(grpc::ByteBuffer* answer, int field, int* count, uint32_t* bytes) {
  grpc::ProtoBufferReader reader(answer);
  CodedInputStream in(&reader);
  in.SetTotalBytesLimit(INT_MAX);
  *count = 0;
  *bytes = 0;
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    if (IsField(tag, field)) {
      uint32_t len;
      if (!in.ReadVarint32(&len) || !in.Skip(static_cast<int>(len))) return false;
      ++*count;
      *bytes = len;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return in.ConsumedEntireMessage();
}

// The answer's `count`-th (last) occurrence of field `field` into dst, every other field (as it
// came, tags included; earlier occurrences dropped) into *rest.
bool SplitField(grpc::ByteBuffer* answer, int field, int count, void* dst, std::string* rest) {
  grpc::ProtoBufferReader reader(answer);
  CodedInputStream in(&reader);
  in.SetTotalBytesLimit(INT_MAX);
  {
    StringOutputStream sink(rest);
    CodedOutputStream out(&sink);
    int seen = 0;
    for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
      if (IsField(tag, field)) {
        uint32_t len;
        if (!in.ReadVarint32(&len)) return false;
        if (++seen == count ? !in.ReadRaw(dst, static_cast<int>(len)) : !in.Skip(static_cast<int>(len))) return false;
      } else if (!WireFormatLite::SkipField(&in, tag, &out)) {
        return false;
      }
    }
  }  // out flushes into *rest here
  return in.ConsumedEntireMessage();
}

}  // namespace

extern "C" {

DH_EXPORT int dh_grpc_abi_version(void) { return 3; }

DH_EXPORT void* dh_grpc_open(const char* target, int64_t max_message_bytes, char* msg, size_t msg_len) {
  if (target == nullptr || *target == '\0') {
    Message(msg, msg_len, "no target");
    return nullptr;
  }
  try {
    grpc::ChannelArguments args;
    const int max_bytes = static_cast<int>(std::clamp<int64_t>(max_message_bytes, 1, INT32_MAX));
    args.SetMaxReceiveMessageSize(max_bytes);
    args.SetMaxSendMessageSize(max_bytes);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // the Python client retries, within its deadline
    auto ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    if (ch == nullptr) {
      Message(msg, msg_len, std::string("cannot make a channel to ") + target);
      return nullptr;
    }
    return new Channel(std::move(ch));
  } catch (const std::exception& e) {
    Message(msg, msg_len, e.what());
    return nullptr;
  }
}

DH_EXPORT void dh_grpc_shutdown(void* channel) {
  auto* c = static_cast<Channel*>(channel);
  if (c == nullptr) return;
  std::lock_guard<std::mutex> l(c->mu);
  c->shut = true;
  for (grpc::ClientContext* ctx : c->live) ctx->TryCancel();
}

DH_EXPORT void dh_grpc_close(void* channel) { delete static_cast<Channel*>(channel); }

DH_EXPORT void* dh_grpc_start(void* channel, const char* method, const void* req, size_t req_len,
                              int64_t timeout_ns, const char* md_key, const char* md_value) {
  if (channel == nullptr || method == nullptr || (req == nullptr && req_len != 0))
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, "dh_grpc_start: a null argument");
  try {
    auto* c = static_cast<Channel*>(channel);
    auto call = std::make_unique<Call>();
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::nanoseconds(std::max<int64_t>(timeout_ns, 1000000)));
    if (md_key != nullptr) call->ctx.AddMetadata(md_key, md_value != nullptr ? md_value : "");
    {
      std::lock_guard<std::mutex> l(c->mu);
      if (c->shut) return Refused(grpc::StatusCode::CANCELLED, "the channel is closed");
      c->live.insert(&call->ctx);
      call->channel = c;
    }
    grpc::Slice slice(req, req_len);
    grpc::ByteBuffer request(&slice, 1);
    call->reader = c->stub.PrepareUnaryCall(&call->ctx, method, request, &call->cq);
    call->reader->StartCall();
    call->reader->Finish(&call->answer, &call->status, call.get());
    return call.release();
  } catch (const std::exception& e) {
    return Refused(grpc::StatusCode::INTERNAL, e.what());
  }
}

DH_EXPORT int dh_grpc_wait(void* call, int64_t wait_ns) {
  auto* c = static_cast<Call*>(call);
  return WaitEnd(c, std::chrono::system_clock::now() + std::chrono::nanoseconds(std::max<int64_t>(wait_ns, 0)))
             ? 1
             : 0;
}

DH_EXPORT void dh_grpc_cancel(void* call) {
  auto* c = static_cast<Call*>(call);
  if (c->channel != nullptr && !c->ended) c->ctx.TryCancel();
}

DH_EXPORT int dh_grpc_finish(void* call, void** resp, size_t* resp_len, char* msg, size_t msg_len) {
  std::unique_ptr<Call> c(static_cast<Call*>(call));
  if (resp != nullptr) *resp = nullptr;
  if (resp_len != nullptr) *resp_len = 0;
  if (c->code != 0) {
    Message(msg, msg_len, c->message);
    return c->code;
  }
  // The deadline bounds this: gRPC ends the call with DEADLINE_EXCEEDED at the latest then.
  while (!WaitEnd(c.get(), std::chrono::system_clock::now() + std::chrono::seconds(1))) {
  }
  if (!c->status.ok()) {
    Message(msg, msg_len, c->status.error_message());
    return static_cast<int>(c->status.error_code());
  }
  if (resp == nullptr || resp_len == nullptr) {
    Message(msg, msg_len, "dh_grpc_finish: a null argument");
    return static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
  }
  std::vector<grpc::Slice> slices;
  if (!c->answer.Dump(&slices).ok()) {
    Message(msg, msg_len, "cannot read the answer's bytes");
    return static_cast<int>(grpc::StatusCode::INTERNAL);
  }
  size_t n = 0;
  for (const grpc::Slice& s : slices) n += s.size();
  if (n == 0) return 0;
  auto* out = static_cast<uint8_t*>(std::malloc(n));
  if (out == nullptr) {
    Message(msg, msg_len, "out of memory for the answer");
    return static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  size_t at = 0;
  for (const grpc::Slice& s : slices) {
    std::memcpy(out + at, s.begin(), s.size());
    at += s.size();
  }
  *resp = out;
  *resp_len = n;
  return 0;
}

DH_EXPORT int64_t dh_grpc_answer_field_bytes(void* call, int field) {
  auto* c = static_cast<Call*>(call);
  if (c->code != 0 || field <= 0) return -1;
  while (!WaitEnd(c, std::chrono::system_clock::now() + std::chrono::seconds(1))) {
  }
  if (!c->status.ok()) return -1;
  c->split_field = field;
  if (!FindField(&c->answer, field, &c->split_count, &c->split_bytes)) {
    c->split_field = -1;  // dh_grpc_finish_split says why
    return -1;
  }
  return c->split_bytes;
}

DH_EXPORT int dh_grpc_finish_split(void* call, int field, void* dst, size_t dst_len, void** resp, size_t* resp_len,
                                   char* msg, size_t msg_len) {
  auto* c = static_cast<Call*>(call);
  if (c->code == 0 && c->split_field == -1) {  // ended OK, but dh_grpc_answer_field_bytes could not read it
    std::unique_ptr<Call> owned(c);
    Message(msg, msg_len, "the answer is not a protobuf message");
    return static_cast<int>(grpc::StatusCode::INTERNAL);
  }
  if (c->code != 0 || field <= 0 || c->split_field != field) return dh_grpc_finish(call, resp, resp_len, msg, msg_len);
  std::unique_ptr<Call> owned(c);  // freed on every path below
  if (resp != nullptr) *resp = nullptr;
  if (resp_len != nullptr) *resp_len = 0;
  if (resp == nullptr || resp_len == nullptr || (dst == nullptr && c->split_bytes != 0) || dst_len != c->split_bytes) {
    Message(msg, msg_len, "dh_grpc_finish_split: a null argument, or dst_len is not the field's size");
    return static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
  }
  std::string rest;
  if (!SplitField(&c->answer, field, c->split_count, dst, &rest)) {
    Message(msg, msg_len, "the answer is not a protobuf message");
    return static_cast<int>(grpc::StatusCode::INTERNAL);
  }
  if (rest.empty()) return 0;
  auto* out = static_cast<uint8_t*>(std::malloc(rest.size()));
  if (out == nullptr) {
    Message(msg, msg_len, "out of memory for the answer");
    return static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  std::memcpy(out, rest.data(), rest.size());
  *resp = out;
  *resp_len = rest.size();
  return 0;
}

DH_EXPORT void dh_grpc_free(void* p) { std::free(p); }

}  // extern "C"
