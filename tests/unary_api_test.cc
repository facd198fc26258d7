// ComputeLogits on gRPC's synchronous API (--unary-api=sync) against the callback API, in process
// (one_rank_server.h): the same answers bit for bit in every mode, run inline on an idle engine and
// queued behind a stopped batch loop (then another thread's done() wakes the blocked handler);
// deadlines met or answered DEADLINE_EXCEEDED; blocked handlers neither starve the other RPCs nor
// outlive a failed group. And the callback API's answer: full logits moved into the sent buffer,
// not copied, parsing back to the same response. About two seconds.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "one_rank_server.h"
#include "server/api/raw_messages.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::OneRankServer;
using Answer = testing::Answer<v1::LogitsResponse>;
constexpr int64_t kK = OneRankServer::kK;

// A blocking call with a deadline `deadline` from now.
Answer Call(v1::DraftHead::Stub& stub, const v1::LogitsRequest& req, std::chrono::milliseconds deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  Answer a;
  a.status = stub.ComputeLogits(&ctx, req, &a.resp);
  return a;
}

// The four modes over `rows` rows of seed `seed`.
std::vector<v1::LogitsRequest> EveryMode(uint32_t rows, uint64_t seed) {
  std::vector<v1::LogitsRequest> out;
  for (v1::Mode mode : {v1::FULL_LOGITS, v1::TOP_K, v1::ARGMAX, v1::SAMPLE}) {
    v1::LogitsRequest r;
    r.set_rows(rows);
    const auto x = ref::RandomBf16(rows * kK, seed);
    r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
    r.set_mode(mode);
    if (mode == v1::TOP_K) r.set_top_k(7);
    if (mode == v1::SAMPLE) {
      r.set_temperature(0.8f);
      r.set_seed(seed);
    }
    out.push_back(r);
  }
  return out;
}

// The answer without its timing (which differs call to call).
std::string Payload(v1::LogitsResponse resp) {
  resp.clear_timing();
  return resp.SerializeAsString();
}

TEST(UnaryApiTest, SyncAnswersAsCallbackInlineAndQueued) {
  OneRankServer cb(UnaryApi::kCallback), sync(UnaryApi::kSync);
  const std::vector<v1::LogitsRequest> reqs = EveryMode(3, 11);
  // Queued first (both loops stopped): the sync handlers block until the loop answers them.
  std::vector<std::future<Answer>> cb_queued, sync_queued;
  for (const auto& r : reqs) {
    cb_queued.push_back(testing::SendLogits(*cb.stub, r));
    sync_queued.push_back(testing::SendLogits(*sync.stub, r));
  }
  ASSERT_TRUE(cb.WaitQueued(reqs.size())) << cb.batcher.queued_requests();
  ASSERT_TRUE(sync.WaitQueued(reqs.size())) << sync.batcher.queued_requests();
  cb.StartLoop();
  sync.StartLoop();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(sync_queued[i].wait_for(std::chrono::seconds(30)), std::future_status::ready) << i;
    ASSERT_EQ(cb_queued[i].wait_for(std::chrono::seconds(30)), std::future_status::ready) << i;
    const Answer a = cb_queued[i].get(), b = sync_queued[i].get();
    ASSERT_TRUE(a.status.ok()) << i << ": " << a.status.error_message();
    ASSERT_TRUE(b.status.ok()) << i << ": " << b.status.error_message();
    EXPECT_EQ(Payload(a.resp), Payload(b.resp)) << "mode " << reqs[i].mode();
    EXPECT_GT(b.resp.timing().server_us(), 0u);
    // Inline now (an idle engine): the same answer again, on the handler's own thread.
    const Answer c = Call(*sync.stub, reqs[i], std::chrono::seconds(30));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    EXPECT_EQ(Payload(a.resp), Payload(c.resp)) << "mode " << reqs[i].mode();
  }
  // Bad input answers as on the callback API.
  v1::LogitsRequest bad = reqs[0];
  bad.set_rows(2);
  const Answer e = Call(*sync.stub, bad, std::chrono::seconds(30)), f = Call(*cb.stub, bad, std::chrono::seconds(30));
  EXPECT_EQ(e.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << e.status.error_message();
  EXPECT_EQ(e.status.error_code(), f.status.error_code());
  EXPECT_EQ(e.status.error_message(), f.status.error_message());
}

TEST(UnaryApiTest, SyncCallsQueuedPastTheirDeadlineAnswerDeadlineExceeded) {
  OneRankServer s(UnaryApi::kSync);
  const v1::LogitsRequest req = EveryMode(1, 5)[2];  // ARGMAX
  std::future<Answer> expires = std::async(std::launch::async, [&] {
    return Call(*s.stub, req, std::chrono::milliseconds(300));  // long enough to reach the queue
  });
  std::future<Answer> waits = std::async(std::launch::async, [&] {
    return Call(*s.stub, req, std::chrono::seconds(30));
  });
  ASSERT_TRUE(s.WaitQueued(2)) << s.batcher.queued_requests() << " queued";
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // past the first one's deadline
  s.StartLoop();
  ASSERT_EQ(expires.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_EQ(waits.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(expires.get().status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const Answer w = waits.get();
  ASSERT_TRUE(w.status.ok()) << w.status.error_message();
  EXPECT_EQ(w.resp.token_ids_size(), 1);
}

TEST(UnaryApiTest, BlockedSyncHandlersLeaveOtherRpcsAnsweredAndEndWithTheGroup) {
  OneRankServer s(UnaryApi::kSync);
  constexpr int kBlocked = 16;
  const v1::LogitsRequest req = EveryMode(1, 9)[1];  // TOP_K
  std::vector<std::future<Answer>> blocked;
  for (int i = 0; i < kBlocked; ++i)
    blocked.push_back(std::async(std::launch::async, [&] { return Call(*s.stub, req, std::chrono::seconds(30)); }));
  ASSERT_TRUE(s.WaitQueued(kBlocked)) << s.batcher.queued_requests() << " queued";
  // Every unary handler's thread is blocked; the callback RPCs still answer.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  ASSERT_TRUE(s.stub->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.hidden_size(), static_cast<uint32_t>(kK));
  // A failed group closes the queue: every blocked handler answers UNAVAILABLE, well before its deadline.
  const auto t0 = std::chrono::steady_clock::now();
  s.batcher.Close(absl::UnavailableError("the rank group failed (test)"));
  for (auto& f : blocked) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    const Answer a = f.get();
    EXPECT_EQ(a.status.error_code(), grpc::StatusCode::UNAVAILABLE) << a.status.error_message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  s.StartLoop();  // the destructor stops it (a closed queue: nothing runs)
}

// SerializeLogitsResponse: a full-logits answer goes out as two slices, the second the response's
// own logits bytes (moved, not copied), and parses back to the response; a small one as one.
TEST(UnaryApiTest, FullLogitsAnswersAreSentWithoutCopyingTheirLogits) {
  v1::LogitsResponse full;
  full.set_request_id(77);
  full.set_rows(3);
  full.set_vocab_size(40000);
  full.set_logits_dtype(v1::BF16);
  std::string logits(3 * 40000 * 2, '\0');
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<char>(i * 131 + 7);
  full.set_logits(logits);
  full.mutable_timing()->set_gemv_us(123);
  const std::string want = full.SerializeAsString();
  const char* bytes = full.logits().data();
  grpc::ByteBuffer out;
  ASSERT_TRUE(SerializeLogitsResponse(&full, &out).ok());
  EXPECT_TRUE(full.logits().empty());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(out.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), bytes) << "the logits were copied";
  EXPECT_EQ(out.Length(), want.size());
  v1::LogitsResponse back;
  ASSERT_TRUE(ParseRequest(&out, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), want);

  v1::LogitsResponse small;
  small.set_request_id(5);
  small.add_token_ids(17);
  small.add_values(2.5f);
  const std::string want_small = small.SerializeAsString();
  grpc::ByteBuffer out_small;
  ASSERT_TRUE(SerializeLogitsResponse(&small, &out_small).ok());
  v1::LogitsResponse back_small;
  ASSERT_TRUE(ParseRequest(&out_small, &back_small).ok());
  EXPECT_EQ(back_small.SerializeAsString(), want_small);
}

}  // namespace
}  // namespace drafthead
