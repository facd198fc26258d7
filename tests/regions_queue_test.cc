// A logits region unregistered while requests that write into it are queued: the DraftHead
// service in process (one_rank_server.h), its batch loop started only once the requests are seen
// in the queue and the region is gone, so the order is fixed by construction, not by timing. Every such request answers NOT_FOUND, the server writes nothing
// into the caller's memory after the unregister, and it goes on serving. About a second.
#include <gtest/gtest.h>

#include <cstring>
#include <future>

#include "one_rank_server.h"
#include "reference.h"
#include "shm_test_util.h"

namespace drafthead {
namespace {

constexpr int kQueued = 6;
constexpr uint8_t kSentinel = 0x5a;

using testing::OneRankServer;
using Answer = testing::Answer<v1::LogitsResponse>;
constexpr int64_t kK = OneRankServer::kK, kVocab = OneRankServer::kVocab;

grpc::Status Register(v1::DraftHead::Stub& stub, const std::string& name, const std::string& key) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::RegisterRegionRequest req;
  req.set_name(name);
  req.set_shm_key(key);
  req.set_byte_size(kQueued * kVocab * 2);
  v1::RegisterRegionResponse resp;
  return stub.RegisterRegion(&ctx, req, &resp);
}

v1::LogitsRequest FullLogitsInto(const std::string& region, int slot) {
  v1::LogitsRequest r;
  r.set_rows(1);
  const auto x = ref::RandomBf16(kK, slot + 1);
  r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  r.mutable_logits_region()->set_region(region);
  r.mutable_logits_region()->set_offset(static_cast<uint64_t>(slot) * kVocab * 2);
  r.mutable_logits_region()->set_byte_size(kVocab * 2);
  return r;
}

TEST(RegionsQueueTest, UnregisteredWhileQueuedNeitherCrashesNorWritesAfterward) {
  testutil::ScopedShm shm(kQueued * kVocab * 2);
  OneRankServer s;
  ASSERT_TRUE(Register(*s.stub, "out", shm.key()).ok());
  std::vector<std::future<Answer>> answers;
  for (int i = 0; i < kQueued; ++i) answers.push_back(testing::SendLogits(*s.stub, FullLogitsInto("out", i)));
  // Validated and queued (the loop is not running, so they stay there).
  ASSERT_TRUE(s.WaitQueued(kQueued)) << s.batcher.queued_requests() << " queued";

  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::UnregisterRegionRequest req;
    req.set_name("out");
    v1::UnregisterRegionResponse resp;
    ASSERT_TRUE(s.stub->UnregisterRegion(&ctx, req, &resp).ok());
  }
  // The caller reuses its memory at once.
  std::memset(shm.data(), kSentinel, shm.size());
  s.StartLoop();
  for (auto& f : answers) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const Answer a = f.get();
    EXPECT_EQ(a.status.error_code(), grpc::StatusCode::NOT_FOUND) << a.status.error_message();
    EXPECT_NE(a.status.error_message().find("logits_region: region 'out' was unregistered"),
              std::string::npos)
        << a.status.error_message();
  }
  for (size_t i = 0; i < shm.size(); ++i)
    ASSERT_EQ(shm.data()[i], kSentinel) << "byte " << i << " written after the unregister";

  // Still serving: the same memory under a new registration receives the logits.
  ASSERT_TRUE(Register(*s.stub, "again", shm.key()).ok());
  Answer a = testing::SendLogits(*s.stub, FullLogitsInto("again", 2)).get();
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  v1::LogitsRequest bytes = FullLogitsInto("again", 2);
  bytes.clear_logits_region();
  Answer want = testing::SendLogits(*s.stub, bytes).get();
  ASSERT_TRUE(want.status.ok());
  EXPECT_EQ(std::memcmp(shm.data() + 2 * kVocab * 2, want.resp.logits().data(), kVocab * 2), 0);
  EXPECT_EQ(shm.data()[0], kSentinel);
}

}  // namespace
}  // namespace drafthead
