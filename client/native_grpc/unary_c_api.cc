#include "client/native_grpc/unary_c_api.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#define DH_EXPORT __attribute__((visibility("default")))

namespace {

struct Channel {
  std::shared_ptr<grpc::Channel> channel;
  grpc::GenericStub stub;
  std::mutex mu;
  std::set<grpc::ClientContext*> live;  // the calls running, for dh_grpc_shutdown (guarded by mu)
  bool shut = false;                     // guarded by mu
  explicit Channel(std::shared_ptr<grpc::Channel> c) : channel(c), stub(std::move(c)) {}
};

// A call's entry in Channel::live for its lifetime; refused once the channel is shut.
class LiveCall {
 public:
  LiveCall(Channel* c, grpc::ClientContext* ctx) : c_(c), ctx_(ctx) {
    std::lock_guard<std::mutex> l(c_->mu);
    ok_ = !c_->shut;
    if (ok_) c_->live.insert(ctx_);
  }
  ~LiveCall() {
    std::lock_guard<std::mutex> l(c_->mu);
    c_->live.erase(ctx_);
  }
  bool ok() const { return ok_; }

 private:
  Channel* c_;
  grpc::ClientContext* ctx_;
  bool ok_ = false;
};

void Message(char* msg, size_t msg_len, const std::string& s) {
  if (msg == nullptr || msg_len == 0) return;
  const size_t n = std::min(s.size(), msg_len - 1);
  std::memcpy(msg, s.data(), n);
  msg[n] = '\0';
}

}  // namespace

extern "C" {

DH_EXPORT int dh_grpc_abi_version(void) { return 1; }

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

DH_EXPORT int dh_grpc_unary(void* channel, const char* method, const void* req, size_t req_len,
                            int64_t timeout_ns, const char* md_key, const char* md_value, void** resp,
                            size_t* resp_len, char* msg, size_t msg_len) {
  if (channel == nullptr || method == nullptr || resp == nullptr || resp_len == nullptr ||
      (req == nullptr && req_len != 0)) {
    Message(msg, msg_len, "dh_grpc_unary: a null argument");
    return static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
  }
  *resp = nullptr;
  *resp_len = 0;
  try {
    auto* c = static_cast<Channel*>(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::nanoseconds(std::max<int64_t>(timeout_ns, 1000000)));
    if (md_key != nullptr) ctx.AddMetadata(md_key, md_value != nullptr ? md_value : "");
    const LiveCall live(c, &ctx);
    if (!live.ok()) {
      Message(msg, msg_len, "the channel is closed");
      return static_cast<int>(grpc::StatusCode::CANCELLED);
    }
    grpc::Slice slice(req, req_len);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer answer;
    grpc::Status status;
    grpc::CompletionQueue cq;  // this call's own: its events come back on this thread
    auto call = c->stub.PrepareUnaryCall(&ctx, method, request, &cq);
    call->StartCall();
    call->Finish(&answer, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    // Returns once the call ends: OK, failed or past its deadline (gRPC cancels it then).
    const bool got = cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (!got) {
      Message(msg, msg_len, "the call's completion queue shut down");
      return static_cast<int>(grpc::StatusCode::INTERNAL);
    }
    if (!status.ok()) {
      Message(msg, msg_len, status.error_message());
      return static_cast<int>(status.error_code());
    }
    std::vector<grpc::Slice> slices;
    if (!answer.Dump(&slices).ok()) {
      Message(msg, msg_len, "cannot read the answer's bytes");
      return static_cast<int>(grpc::StatusCode::INTERNAL);
    }
    size_t n = 0;
    for (const grpc::Slice& s : slices) n += s.size();
    if (n > 0) {
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
    }
    return 0;
  } catch (const std::exception& e) {
    Message(msg, msg_len, e.what());
    return static_cast<int>(grpc::StatusCode::INTERNAL);
  }
}

DH_EXPORT void dh_grpc_free(void* p) { std::free(p); }

}  // extern "C"
