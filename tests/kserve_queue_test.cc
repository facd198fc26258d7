// Triton's reserved `timeout` request parameter on the KServe API, in process (one_rank_server.h):
// requests queue behind a stopped batch loop, so which one outlives its timeout is fixed by
// construction. One with `timeout` = 50 ms still queued after 300 ms answers DEADLINE_EXCEEDED; one
// without, and one with a timeout it meets, are answered; `priority` is accepted. About a second.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "one_rank_server.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::OneRankServer;
using Answer = testing::Answer<inference::ModelInferResponse>;

inference::ModelInferRequest Infer(const std::string& id, int64_t timeout_us) {
  inference::ModelInferRequest r;
  r.set_model_name("drafthead");
  r.set_id(id);
  auto* in = r.add_inputs();
  in->set_name("hidden");
  in->set_datatype("BF16");
  in->add_shape(1);
  in->add_shape(OneRankServer::kK);
  const auto x = ref::RandomBf16(OneRankServer::kK, 5);
  r.add_raw_input_contents(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  (*r.mutable_parameters())["mode"].set_string_param("argmax");
  (*r.mutable_parameters())["priority"].set_uint64_param(1);
  if (timeout_us >= 0) (*r.mutable_parameters())["timeout"].set_int64_param(timeout_us);
  return r;
}

std::future<Answer> Send(inference::GRPCInferenceService::Stub& stub, const inference::ModelInferRequest& req) {
  return testing::SendAsync<inference::ModelInferRequest, inference::ModelInferResponse>(
      req, [&stub](auto* ctx, auto* q, auto* r, auto done) { stub.async()->ModelInfer(ctx, q, r, std::move(done)); });
}

TEST(KServeQueueTest, TimeoutParameterBoundsTheWaitInTheQueue) {
  OneRankServer s;
  std::future<Answer> expires = Send(*s.kserve_stub, Infer("expires", 50'000));
  std::future<Answer> no_timeout = Send(*s.kserve_stub, Infer("no-timeout", -1));
  std::future<Answer> long_timeout = Send(*s.kserve_stub, Infer("long-timeout", 60'000'000));
  ASSERT_TRUE(s.WaitQueued(3)) << s.batcher.queued_requests() << " queued";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  s.StartLoop();
  for (auto* f : {&expires, &no_timeout, &long_timeout})
    ASSERT_EQ(f->wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const Answer e = expires.get();
  EXPECT_EQ(e.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << e.status.error_message();
  for (auto* f : {&no_timeout, &long_timeout}) {
    const Answer a = f->get();
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    ASSERT_EQ(a.resp.outputs_size(), 2);
    EXPECT_EQ(a.resp.outputs(0).name(), "token_ids");
  }
  // With the loop running (an idle engine: the request runs at once), a short timeout is met.
  const Answer quick = Send(*s.kserve_stub, Infer("quick", 5'000'000)).get();
  EXPECT_TRUE(quick.status.ok()) << quick.status.error_message();
  EXPECT_EQ(quick.resp.id(), "quick");
}

}  // namespace
}  // namespace drafthead
