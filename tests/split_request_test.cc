// Requests split across batches (--split-requests), in process (one_rank_server.h: requests queued
// behind a stopped batch loop, so the batches are fixed by construction): every mode's answer is
// the same bits as the request computed whole, under both queue policies, and batches end full.
// (Each part answered once, failures and drops: batcher_test.) About a second.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <vector>

#include "one_rank_server.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::OneRankServer;
using Answer = testing::Answer<v1::LogitsResponse>;
constexpr int64_t kK = OneRankServer::kK;

// Nine requests of 3 rows of seed `seed`: in batches of 5 rows the 2nd, 4th, 7th and 9th are split
// (rows 3-5, 8-10, 18-20, 24-26 of 27), and those are the modes whose answers depend most on the
// row's place: FULL_LOGITS bf16, TOP_K with probs, SAMPLE (its noise keyed by the row in the
// request), FULL_LOGITS fp32; the rest ARGMAX.
std::vector<v1::LogitsRequest> Requests(uint64_t seed) {
  std::vector<v1::LogitsRequest> out;
  const v1::Mode modes[9] = {v1::ARGMAX, v1::FULL_LOGITS, v1::ARGMAX, v1::TOP_K, v1::ARGMAX,
                             v1::ARGMAX, v1::SAMPLE,      v1::ARGMAX, v1::FULL_LOGITS};
  for (const v1::Mode mode : modes) {
    v1::LogitsRequest r;
    r.set_rows(3);
    const auto x = ref::RandomBf16(3 * kK, seed + out.size());
    r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
    r.set_mode(mode);
    if (mode == v1::TOP_K) {
      r.set_top_k(7);
      r.set_return_probs(true);
    }
    if (mode == v1::SAMPLE) {
      r.set_temperature(0.8f);
      r.set_seed(seed);
    }
    if (mode == v1::FULL_LOGITS && out.size() > 1) r.set_logits_dtype(v1::FP32);
    out.push_back(r);
  }
  return out;
}

std::string Payload(v1::LogitsResponse resp) {
  resp.clear_timing();
  return resp.SerializeAsString();
}

// Queues `reqs` on a stopped server, starts its loop, returns the answers in order.
std::vector<Answer> RunQueued(OneRankServer& s, const std::vector<v1::LogitsRequest>& reqs) {
  std::vector<std::future<Answer>> queued;
  for (const auto& r : reqs) {
    queued.push_back(testing::SendLogits(*s.stub, r));
    EXPECT_TRUE(s.WaitQueued(queued.size()));  // one at a time: the queue's order is the list's
  }
  s.StartLoop();
  std::vector<Answer> out;
  for (auto& f : queued) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    out.push_back(f.get());
  }
  return out;
}

TEST(SplitRequestTest, SplitRequestsAnswerAsWholeOnesInEveryModeAndBatchesEndFull) {
  for (const QueuePolicy policy : {QueuePolicy::kFair, QueuePolicy::kFifo}) {
    BatcherOptions split;
    split.policy = policy;
    split.max_rows = 5;
    split.split_requests = true;
    BatcherOptions whole = split;
    whole.split_requests = false;
    OneRankServer a(UnaryApi::kCallback, split), b(UnaryApi::kCallback, whole);
    const std::vector<v1::LogitsRequest> reqs = Requests(21);
    const std::vector<Answer> got = RunQueued(a, reqs), want = RunQueued(b, reqs);
    ASSERT_EQ(got.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
      ASSERT_TRUE(want[i].status.ok()) << i << ": " << want[i].status.error_message();
      EXPECT_EQ(Payload(got[i].resp), Payload(want[i].resp))
          << "request " << i << ", mode " << reqs[i].mode() << ", policy " << QueuePolicyName(policy);
      EXPECT_EQ(got[i].resp.rows(), 3u);
      // Split, every batch ends full (27 rows: five batches of 5, then 2); whole, at one request.
      EXPECT_EQ(got[i].resp.timing().batch_rows(), i + 1 < reqs.size() ? 5u : 2u) << i;
      EXPECT_EQ(want[i].resp.timing().batch_rows(), 3u) << i;
    }
  }
}

}  // namespace
}  // namespace drafthead
