// Shared-memory regions end to end: drafthead-server with --shared-memory=system as real rank
// processes, a caller's POSIX object registered as regions. Every mode, tp = 1 and 3, a cropped
// vocabulary: answers through regions equal the bytes path's bit for bit, and nothing outside the
// slices is written. Every bad input is answered with its code and field, and the server still
// serves. Small shapes (K = 256, 4000 of 4100 rows) keep it to a few seconds on 2 cores.
#include <gtest/gtest.h>

#include <cstring>

#include "client/regions.h"
#include "e2e_util.h"
#include "reference.h"
#include "shm_test_util.h"

namespace drafthead {
namespace {

using testing::Channel;
using testing::ServerProcess;
using testing::WaitServing;
using testutil::ScopedShm;

constexpr int64_t kK = 256, kPadded = 4100, kVocab = 4000;
constexpr int kMaxRows = 8;
// The caller's object: a hidden area at an unaligned offset, a logits area after it, both inside
// registered regions that start part-way into the object.
constexpr uint64_t kInOffset = 100, kInBytes = kMaxRows * kK * 4 + 64;
constexpr uint64_t kOutOffset = 40960, kOutBytes = kMaxRows * kVocab * 4 + 64;
constexpr size_t kShmBytes = kOutOffset + kOutBytes;
constexpr uint8_t kUntouched = 0xcd;

grpc::Status Call(v1::DraftHead::Stub& stub, const v1::LogitsRequest& req, v1::LogitsResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return stub.ComputeLogits(&ctx, req, resp);
}

grpc::Status Register(v1::DraftHead::Stub& stub, const v1::RegisterRegionRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::RegisterRegionResponse resp;
  return stub.RegisterRegion(&ctx, req, &resp);
}

grpc::Status Unregister(v1::DraftHead::Stub& stub, const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::UnregisterRegionRequest req;
  req.set_name(name);
  v1::UnregisterRegionResponse resp;
  return stub.UnregisterRegion(&ctx, req, &resp);
}

v1::RegisterRegionRequest SystemRegion(const std::string& name, const std::string& key,
                                       uint64_t offset, uint64_t size) {
  v1::RegisterRegionRequest r;
  r.set_name(name);
  r.set_kind(v1::SYSTEM);
  r.set_shm_key(key);
  r.set_offset(offset);
  r.set_byte_size(size);
  return r;
}

void Slice(v1::RegionSlice* s, const std::string& region, uint64_t offset, uint64_t size) {
  s->set_region(region);
  s->set_offset(offset);
  s->set_byte_size(size);
}

void ExpectStatus(const grpc::Status& s, grpc::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
}

// One request as a caller sends it on the bytes path.
struct Case {
  const char* what;
  v1::Mode mode;
  v1::DType hidden_dtype, logits_dtype;
  uint32_t top_k;
  bool probs;
  float temperature;
};

const Case kCases[] = {
    {"full bf16", v1::FULL_LOGITS, v1::BF16, v1::BF16, 0, false, 0},
    {"full fp32, fp32 hidden", v1::FULL_LOGITS, v1::FP32, v1::FP32, 0, false, 0},
    {"top_k probs", v1::TOP_K, v1::BF16, v1::BF16, 8, true, 0.7f},
    {"top_k fp32 hidden", v1::TOP_K, v1::FP32, v1::BF16, 3, false, 0},
    {"argmax", v1::ARGMAX, v1::BF16, v1::BF16, 0, false, 0},
    {"sample", v1::SAMPLE, v1::BF16, v1::BF16, 0, false, 0.9f},
};

v1::LogitsRequest BytesRequest(const Case& c, int rows, uint64_t seed) {
  v1::LogitsRequest r;
  r.set_request_id(seed);
  r.set_rows(rows);
  r.set_mode(c.mode);
  r.set_hidden_dtype(c.hidden_dtype);
  r.set_logits_dtype(c.logits_dtype);
  r.set_top_k(c.top_k);
  r.set_return_probs(c.probs);
  r.set_temperature(c.temperature);
  r.set_seed(seed);
  const auto x = ref::RandomBf16(rows * kK, seed);
  if (c.hidden_dtype == v1::BF16) {
    r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  } else {
    std::string f(x.size() * 4, '\0');
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(x[i]) << 16 | (i % 7);  // not bf16-exact
      std::memcpy(&f[i * 4], &bits, 4);
    }
    r.set_hidden(f);
  }
  return r;
}

class RegionsE2E : public ::testing::TestWithParam<int> {
 protected:
  void Start(const std::vector<std::string>& extra) {
    port_ = testing::FreePort();
    target_ = "127.0.0.1:" + std::to_string(port_);
    std::vector<std::string> args = {
        "--tp=" + std::to_string(GetParam()), "--backend=cpu", "--comm=gloo",
        "--listen=" + target_, "--threads=1", "--synthetic=7", "--hidden-size=256",
        "--padded-vocab=4100", "--vocab-size=4000", "--max-rows=8", "--max-top-k=64",
        "--op-timeout=5s", "--join-timeout=30s"};
    args.insert(args.end(), extra.begin(), extra.end());
    server_ = std::make_unique<ServerProcess>(args, tmp_.File("server.log"));
    ASSERT_TRUE(WaitServing(*server_, target_, std::chrono::seconds(60))) << server_->Log();
    stub_ = v1::DraftHead::NewStub(Channel(target_));
  }

  testutil::TempDir tmp_;
  std::string target_;
  int port_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::DraftHead::Stub> stub_;
};

TEST_P(RegionsE2E, EveryModeThroughRegionsEqualsTheBytesPath) {
  Start({"--shared-memory=system"});
  ScopedShm shm(kShmBytes);
  ASSERT_TRUE(Register(*stub_, SystemRegion("in", shm.key(), kInOffset, kInBytes)).ok());
  ASSERT_TRUE(Register(*stub_, SystemRegion("out", shm.key(), kOutOffset, kOutBytes)).ok());
  uint8_t* in = shm.data() + kInOffset;
  uint8_t* out = shm.data() + kOutOffset;
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    for (int rows : {1, 5, kMaxRows}) {
      SCOPED_TRACE(::testing::Message() << c.what << ", rows " << rows << ", tp " << GetParam());
      const v1::LogitsRequest bytes_req = BytesRequest(c, rows, ++seed);
      v1::LogitsResponse want;
      ASSERT_TRUE(Call(*stub_, bytes_req, &want).ok());
      const std::string want_logits = want.logits();

      // The hidden rows 16 bytes into the "in" region; the logits 32 bytes into "out".
      v1::LogitsRequest req = bytes_req;
      const std::string hidden = req.hidden();
      std::memcpy(in + 16, hidden.data(), hidden.size());
      req.clear_hidden();
      Slice(req.mutable_hidden_region(), "in", 16, hidden.size());
      const bool full = c.mode == v1::FULL_LOGITS;
      if (full) Slice(req.mutable_logits_region(), "out", 32, want.logits().size());
      std::memset(out, kUntouched, kOutBytes);
      v1::LogitsResponse got;
      grpc::Status s = Call(*stub_, req, &got);
      ASSERT_TRUE(s.ok()) << s.error_message();
      if (full) {
        EXPECT_TRUE(got.logits().empty());
        ASSERT_EQ(std::memcmp(out + 32, want.logits().data(), want.logits().size()), 0);
        for (uint64_t i = 0; i < kOutBytes; ++i) {
          if (i >= 32 && i < 32 + want.logits().size()) continue;
          ASSERT_EQ(out[i], kUntouched) << "byte " << i << " outside the slice was written";
        }
        want.clear_logits();
      }
      want.clear_timing();
      got.clear_timing();
      EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());

      // A FULL_LOGITS answer into a region from hidden rows sent as bytes.
      if (full) {
        v1::LogitsRequest mixed = bytes_req;
        Slice(mixed.mutable_logits_region(), "out", 0, want_logits.size());
        std::memset(out, kUntouched, kOutBytes);
        ASSERT_TRUE(Call(*stub_, mixed, &got).ok());
        EXPECT_TRUE(got.logits().empty());
        ASSERT_EQ(std::memcmp(out, want_logits.data(), want_logits.size()), 0);
      }
    }
  }
  // The stream takes region requests too.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub_->StreamLogits(&ctx);
  v1::LogitsRequest sreq = BytesRequest(kCases[0], 2, 99);
  v1::LogitsResponse want;
  ASSERT_TRUE(Call(*stub_, sreq, &want).ok());
  std::memcpy(in, sreq.hidden().data(), sreq.hidden().size());
  Slice(sreq.mutable_hidden_region(), "in", 0, sreq.hidden().size());
  sreq.clear_hidden();
  Slice(sreq.mutable_logits_region(), "out", 0, want.logits().size());
  ASSERT_TRUE(stream->Write(sreq));
  stream->WritesDone();
  v1::LogitsResponse sresp;
  ASSERT_TRUE(stream->Read(&sresp));
  EXPECT_FALSE(sresp.has_error()) << sresp.error().message();
  EXPECT_EQ(std::memcmp(out, want.logits().data(), want.logits().size()), 0);
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(Unregister(*stub_, "").ok());  // every region
  ExpectStatus(Unregister(*stub_, "in"), grpc::StatusCode::NOT_FOUND, "'in'");
}

INSTANTIATE_TEST_SUITE_P(Tp, RegionsE2E, ::testing::Values(1, 3));

class RegionsBadInput : public RegionsE2E {};

TEST_P(RegionsBadInput, EveryBadInputIsAnsweredAndTheServerServes) {
  Start({"--shared-memory=system"});
  auto& stub = *stub_;
  ScopedShm shm(kShmBytes);
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub.GetModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    ASSERT_EQ(info.shared_memory_size(), 1);
    EXPECT_EQ(info.shared_memory(0), v1::SYSTEM);
  }
  // Registration.
  auto cuda = SystemRegion("c", "", 0, 64);
  cuda.set_kind(v1::CUDA_IPC);
  cuda.set_cuda_ipc_handle(std::string(64, '\0'));
  ExpectStatus(Register(stub, cuda), grpc::StatusCode::FAILED_PRECONDITION, "--shared-memory=cuda");
  auto kind = SystemRegion("k", shm.key(), 0, 64);
  kind.set_kind(static_cast<v1::RegionKind>(7));
  ExpectStatus(Register(stub, kind), grpc::StatusCode::INVALID_ARGUMENT, "kind:");
  for (const char* key : {"noslash", "/a/b", "/..", "/"})
    ExpectStatus(Register(stub, SystemRegion("k", key, 0, 64)), grpc::StatusCode::INVALID_ARGUMENT,
                 "shm_key:");
  ExpectStatus(Register(stub, SystemRegion("k", "/dh_test_absent_object", 0, 64)),
               grpc::StatusCode::INVALID_ARGUMENT, "cannot open");
  ExpectStatus(Register(stub, SystemRegion("k", shm.key(), kShmBytes - 10, 11)),
               grpc::StatusCode::INVALID_ARGUMENT, "byte_size:");
  ExpectStatus(Register(stub, SystemRegion("", shm.key(), 0, 64)),
               grpc::StatusCode::INVALID_ARGUMENT, "name:");
  ASSERT_TRUE(Register(stub, SystemRegion("in", shm.key(), kInOffset, kInBytes)).ok());
  ASSERT_TRUE(Register(stub, SystemRegion("out", shm.key(), kOutOffset, kOutBytes)).ok());
  ExpectStatus(Register(stub, SystemRegion("in", shm.key(), 0, 64)),
               grpc::StatusCode::ALREADY_EXISTS, "'in'");
  ExpectStatus(Unregister(stub, "nope"), grpc::StatusCode::NOT_FOUND, "'nope'");

  // Requests: each bad slice refused by name; nothing is written.
  const v1::LogitsRequest base = BytesRequest(kCases[0], 2, 5);
  const uint64_t hbytes = 2 * kK * 2, lbytes = 2 * kVocab * 2;
  std::memcpy(shm.data() + kInOffset, base.hidden().data(), hbytes);
  auto with = [&](auto edit) {
    v1::LogitsRequest r = base;
    r.clear_hidden();
    Slice(r.mutable_hidden_region(), "in", 0, hbytes);
    Slice(r.mutable_logits_region(), "out", 0, lbytes);
    edit(r);
    return r;
  };
  struct Bad {
    const char* what;
    std::function<void(v1::LogitsRequest&)> edit;
    grpc::StatusCode code;
    const char* needle;
  };
  const std::vector<Bad> bad = {
      {"unknown hidden region", [](auto& r) { r.mutable_hidden_region()->set_region("x"); },
       grpc::StatusCode::NOT_FOUND, "hidden_region: no region named 'x'"},
      {"unknown logits region", [](auto& r) { r.mutable_logits_region()->set_region("x"); },
       grpc::StatusCode::NOT_FOUND, "logits_region: no region named 'x'"},
      {"hidden slice past the region",
       [&](auto& r) { r.mutable_hidden_region()->set_offset(kInBytes - hbytes + 1); },
       grpc::StatusCode::INVALID_ARGUMENT, "hidden_region: offset"},
      {"hidden slice offset overflowing",
       [&](auto& r) { r.mutable_hidden_region()->set_offset(UINT64_MAX - 8); },
       grpc::StatusCode::INVALID_ARGUMENT, "hidden_region: offset"},
      {"hidden slice of the wrong size",
       [&](auto& r) { r.mutable_hidden_region()->set_byte_size(hbytes + 2); },
       grpc::StatusCode::INVALID_ARGUMENT, "hidden_region: byte_size"},
      {"logits slice of the wrong size",
       [&](auto& r) { r.mutable_logits_region()->set_byte_size(lbytes - 2); },
       grpc::StatusCode::INVALID_ARGUMENT, "logits_region: byte_size"},
      {"logits slice past the region",
       [&](auto& r) { r.mutable_logits_region()->set_offset(kOutBytes - lbytes + 1); },
       grpc::StatusCode::INVALID_ARGUMENT, "logits_region: offset"},
      {"logits region for TOP_K",
       [](auto& r) {
         r.set_mode(v1::TOP_K);
         r.set_top_k(4);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "logits_region: only FULL_LOGITS"},
      {"hidden bytes beside a hidden region", [&](auto& r) { r.set_hidden(base.hidden()); },
       grpc::StatusCode::INVALID_ARGUMENT, "hidden: must be empty"},
  };
  uint8_t* out = shm.data() + kOutOffset;
  std::memset(out, kUntouched, kOutBytes);
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    v1::LogitsResponse resp;
    ExpectStatus(Call(stub, with(b.edit), &resp), b.code, b.needle);
  }
  // A non-finite value in the region's rows.
  const uint16_t nan = 0x7fc0;
  std::memcpy(shm.data() + kInOffset + 2 * (kK + 3), &nan, 2);
  v1::LogitsResponse resp;
  ExpectStatus(Call(stub, with([](auto&) {}), &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "hidden_region: non-finite value at row 1, column 3");
  for (uint64_t i = 0; i < kOutBytes; ++i) ASSERT_EQ(out[i], kUntouched) << "byte " << i;
  // A bad region request on a stream is answered in band; the stream goes on.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = stub.StreamLogits(&ctx);
    ASSERT_TRUE(stream->Write(with([](auto& r) { r.mutable_hidden_region()->set_region("x"); })));
    ASSERT_TRUE(stream->Write(base));
    stream->WritesDone();
    v1::LogitsResponse a, b;
    ASSERT_TRUE(stream->Read(&a) && stream->Read(&b));
    EXPECT_EQ(a.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
    EXPECT_FALSE(b.has_error());
    EXPECT_TRUE(stream->Finish().ok());
  }
  // Still serving, through regions and bytes.
  std::memcpy(shm.data() + kInOffset, base.hidden().data(), hbytes);
  grpc::Status s = Call(stub, with([](auto&) {}), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::LogitsResponse want;
  ASSERT_TRUE(Call(stub, base, &want).ok());
  EXPECT_EQ(std::memcmp(out, want.logits().data(), lbytes), 0);
  EXPECT_TRUE(server_->Running());
}

TEST_P(RegionsBadInput, RegionsAreOffWithoutTheFlag) {
  Start({});
  ScopedShm shm(4096);
  ExpectStatus(Register(*stub_, SystemRegion("in", shm.key(), 0, 4096)),
               grpc::StatusCode::FAILED_PRECONDITION, "--shared-memory");
  ExpectStatus(Unregister(*stub_, ""), grpc::StatusCode::FAILED_PRECONDITION, "--shared-memory");
  v1::LogitsRequest r = BytesRequest(kCases[0], 1, 3);
  r.clear_hidden();
  Slice(r.mutable_hidden_region(), "in", 0, kK * 2);
  v1::LogitsResponse resp;
  ExpectStatus(Call(*stub_, r, &resp), grpc::StatusCode::FAILED_PRECONDITION, "--shared-memory");
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.shared_memory_size(), 0);
  EXPECT_TRUE(Call(*stub_, BytesRequest(kCases[0], 1, 3), &resp).ok());
}

// The C++ client library's helpers: a SystemRegion created and registered, requests naming its
// slices, the logits viewed in place; destroying the region unregisters it.
TEST_P(RegionsBadInput, ClientLibraryRegionsViewLogitsInPlace) {
  Start({"--shared-memory=system"});
  auto client = client::DraftHeadClient::Connect(target_);
  ASSERT_TRUE(client.ok()) << client.status();
  const auto x = ref::RandomBf16(5 * kK, 9);
  auto bytes = (*client)->Logits(client::HiddenRows::Bf16(x, 5));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const uint64_t hbytes = x.size() * 2, lbytes = bytes->data.size();
  v1::RegionSlice hidden;
  {
    auto region = client::SystemRegion::Create(**client, "lib", hbytes + lbytes);
    ASSERT_TRUE(region.ok()) << region.status();
    std::memcpy((*region)->data(), x.data(), hbytes);
    hidden = (*region)->Slice(0, hbytes);
    client::RequestOptions o;
    o.logits_region = (*region)->Target(hbytes, lbytes);
    auto got = (*client)->Logits(client::HiddenRows::InRegion(hidden, 5), o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->data.empty());
    EXPECT_EQ(got->in_region, (*region)->data() + hbytes);
    EXPECT_EQ(got->bytes(), bytes->data);
    EXPECT_EQ(got->At(4, 17), bytes->At(4, 17));
    client::RequestOptions topk;
    topk.k = 8;
    auto ids = (*client)->TopK(client::HiddenRows::InRegion(hidden, 5), topk);
    auto want = (*client)->TopK(client::HiddenRows::Bf16(x, 5), topk);
    ASSERT_TRUE(ids.ok() && want.ok());
    EXPECT_EQ(ids->token_ids, want->token_ids);
  }
  auto gone = (*client)->Argmax(client::HiddenRows::InRegion(hidden, 5));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

INSTANTIATE_TEST_SUITE_P(Tp1, RegionsBadInput, ::testing::Values(1));

}  // namespace
}  // namespace drafthead
