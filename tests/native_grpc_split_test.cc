// libdrafthead_grpc.so's field split (dh_grpc_answer_field_bytes, dh_grpc_finish_split), through its
// C ABI against an in-process generic gRPC server that answers whatever bytes a test sets: the
// field's bytes (the last occurrence, across the answer's slices) into the caller's memory, every
// other field byte for byte in the rest, and clear codes for a malformed answer, a wrong size and a
// failed call.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/native_grpc/unary_c_api.h"

namespace {

// Protobuf wire format, by hand: a test states exactly which bytes come.
std::string Varint(uint64_t v) {
  std::string s;
  for (; v >= 0x80; v >>= 7) s.push_back(static_cast<char>((v & 0x7f) | 0x80));
  s.push_back(static_cast<char>(v));
  return s;
}
std::string VarintField(int field, uint64_t v) { return Varint(uint64_t(field) << 3 | 0) + Varint(v); }
std::string BytesField(int field, const std::string& b) { return Varint(uint64_t(field) << 3 | 2) + Varint(b.size()) + b; }
std::string Fixed32Field(int field, uint32_t v) {
  return Varint(uint64_t(field) << 3 | 5) + std::string(reinterpret_cast<const char*>(&v), 4);
}

// Answers every call's one request with `answer`.
class FixedAnswers : public grpc::CallbackGenericService {
 public:
  std::string answer;

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(const std::string& bytes) : bytes_(bytes) { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::OK);
        grpc::Slice s(bytes_);
        answer_ = grpc::ByteBuffer(&s, 1);
        StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      std::string bytes_;
      grpc::ByteBuffer request_, answer_;
    };
    return new Reactor(answer);
  }
};

class NativeGrpcSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterCallbackGenericService(&service_);
    b.SetMaxSendMessageSize(64 << 20);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    char msg[256];
    channel_ = dh_grpc_open(("127.0.0.1:" + std::to_string(port_)).c_str(), 64 << 20, msg, sizeof(msg));
    ASSERT_NE(channel_, nullptr) << msg;
  }
  void TearDown() override {
    if (channel_) dh_grpc_close(channel_);
    if (server_) server_->Shutdown();
  }

  struct Split {
    int64_t field_bytes = 0;
    int code = -1;
    std::string field, rest, msg;
  };
  // One call answered with `answer`, its field `field` split off into a buffer of the size the
  // library gave (+ `size_off`).
  Split CallSplit(const std::string& answer, int field, int64_t size_off = 0) {
    service_.answer = answer;
    void* call = dh_grpc_start(channel_, "/test.Any/Method", "x", 1, 10'000'000'000, nullptr, nullptr);
    Split s;
    s.field_bytes = dh_grpc_answer_field_bytes(call, field);
    s.field.assign(static_cast<size_t>(std::max<int64_t>(s.field_bytes + size_off, 0)), '\0');
    void* rest = nullptr;
    size_t rest_len = 0;
    char msg[256] = {};
    s.code = dh_grpc_finish_split(call, field, s.field.data(), s.field.size(), &rest, &rest_len, msg, sizeof(msg));
    s.msg = msg;
    if (rest != nullptr) s.rest.assign(static_cast<const char*>(rest), rest_len);
    dh_grpc_free(rest);
    return s;
  }

  FixedAnswers service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  void* channel_ = nullptr;
};

TEST_F(NativeGrpcSplit, ALargeFieldComesApartAndTheRestStaysByteForByte) {
  std::string big(3 << 20, '\0');  // 3 MiB: the client receives it in several slices
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 12));
  const std::string before = VarintField(1, 77) + VarintField(2, 5), after = BytesField(6, std::string("\x01\x02\x03", 3)) +
                             Fixed32Field(7, 0x3f800000u) + BytesField(9, VarintField(1, 12) + VarintField(2, 250));
  const Split s = CallSplit(before + BytesField(5, big) + after, 5);
  ASSERT_EQ(s.code, 0) << s.msg;
  EXPECT_EQ(s.field_bytes, static_cast<int64_t>(big.size()));
  EXPECT_TRUE(s.field == big) << "the field's bytes differ";
  EXPECT_EQ(s.rest, before + after);
}

TEST_F(NativeGrpcSplit, TheLastOccurrenceWinsAndEarlierOnesAreDropped) {
  const Split s = CallSplit(BytesField(5, "aaa") + VarintField(2, 1) + BytesField(5, "bbbbb") + VarintField(3, 9), 5);
  ASSERT_EQ(s.code, 0) << s.msg;
  EXPECT_EQ(s.field_bytes, 5);
  EXPECT_EQ(s.field, "bbbbb");
  EXPECT_EQ(s.rest, VarintField(2, 1) + VarintField(3, 9));
}

TEST_F(NativeGrpcSplit, AnAbsentFieldIsEmptyAndTheAnswerWhole) {
  // Field 5 as a varint is another wire type: not the bytes field, kept in the rest.
  const std::string answer = VarintField(2, 1) + VarintField(5, 3) + BytesField(6, "zz");
  const Split s = CallSplit(answer, 5);
  ASSERT_EQ(s.code, 0) << s.msg;
  EXPECT_EQ(s.field_bytes, 0);
  EXPECT_EQ(s.rest, answer);
}

TEST_F(NativeGrpcSplit, AMalformedAnswerIsInternal) {
  // Field 5's length promises more bytes than come.
  const Split s = CallSplit(VarintField(2, 1) + Varint(5 << 3 | 2) + Varint(100) + "short", 5);
  EXPECT_EQ(s.field_bytes, -1);
  EXPECT_EQ(s.code, 13) << s.msg;  // INTERNAL
  EXPECT_NE(s.msg.find("not a protobuf message"), std::string::npos) << s.msg;
  EXPECT_TRUE(s.rest.empty());
}

TEST_F(NativeGrpcSplit, ABufferOfAnotherSizeIsRefused) {
  const Split s = CallSplit(BytesField(5, "abcdef"), 5, /*size_off=*/-1);
  EXPECT_EQ(s.code, 3) << s.msg;  // INVALID_ARGUMENT
  EXPECT_NE(s.msg.find("dst_len"), std::string::npos) << s.msg;
}

TEST_F(NativeGrpcSplit, AFailedCallKeepsItsCode) {
  server_->Shutdown();
  server_.reset();
  const Split s = CallSplit(BytesField(5, "abc"), 5);
  EXPECT_EQ(s.field_bytes, -1);
  EXPECT_EQ(s.code, 14) << s.msg;  // UNAVAILABLE
  EXPECT_TRUE(s.rest.empty());
}

}  // namespace
