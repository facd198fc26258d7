// A logits region unregistered while requests that write into it are queued: the DraftHead
// service in process (gRPC in-process channel, one CPU rank), its batch loop started only once
// the requests are seen in the queue and the region is gone, so the order is fixed by
// construction, not by timing. Every such request answers NOT_FOUND, the server writes nothing
// into the caller's memory after the unregister, and it goes on serving. About a second.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "reference.h"
#include "server/api/service.h"
#include "server/backends/compute_backend.h"
#include "server/comm/inproc_collective.h"
#include "server/engine/rank_engine.h"
#include "server/sched/batch_loop.h"
#include "server/weights/shard_weights.h"
#include "shm_test_util.h"

namespace drafthead {
namespace {

constexpr int64_t kK = 64, kRows = 1000, kVocab = 900;
constexpr int kQueued = 6;
constexpr uint8_t kSentinel = 0x5a;

// One rank serving synthetic weights, with the loop not yet running.
struct OneRankServer {
  OneRankServer() : registry(regions::RegistryOptions{true, false, 0}), batcher(BatcherOptions{}) {
    const ShardGeometry geo = ShardGeometry::Make(1, 0, kK, kRows, kVocab);
    WeightsConfig wc;
    wc.synthetic_seed = 3;
    wc.hidden_size = kK;
    wc.padded_vocab = kRows;
    wc.threads = 1;
    auto weights = LoadShardWeights(wc, geo, true);
    EXPECT_TRUE(weights.ok()) << weights.status();
    BackendOptions bo;
    bo.threads = 1;
    auto backend = MakeCpuBackend(bo);
    EXPECT_TRUE(backend->Load(std::move(weights).value()).ok());
    engine = std::make_unique<RankEngine>(
        std::make_unique<testing::InProcCollective>(std::make_shared<testing::InProcGroup>(1), 0, 1),
        std::move(backend), geo, EngineOptions{});
    loop = std::make_unique<BatchLoop>(*engine, batcher, nullptr, nullptr);
    ServingLimits limits;
    limits.hidden = kK;
    limits.vocab_size = kVocab;
    service = std::make_unique<DraftHeadService>(batcher, limits, v1::ModelInfo(), nullptr);
    service->SetRegions(&registry);
    service->SetReady(true);
    grpc::ServerBuilder builder;
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    stub = v1::DraftHead::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
  ~OneRankServer() {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    loop->Stop();
    if (loop_thread.joinable()) loop_thread.join();
  }
  void StartLoop() {
    loop_thread = std::thread([this] { EXPECT_TRUE(loop->Run().ok()); });
  }

  regions::RegionRegistry registry;
  Batcher batcher;
  std::unique_ptr<RankEngine> engine;
  std::unique_ptr<BatchLoop> loop;
  std::unique_ptr<DraftHeadService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::DraftHead::Stub> stub;
  std::thread loop_thread;
};

struct Answer {
  grpc::Status status;
  v1::LogitsResponse resp;
};

// An asynchronous ComputeLogits; the future holds its answer.
std::future<Answer> Send(v1::DraftHead::Stub& stub, const v1::LogitsRequest& req) {
  struct Call {
    grpc::ClientContext ctx;
    v1::LogitsRequest req;
    Answer answer;
    std::promise<Answer> done;
  };
  auto call = std::make_shared<Call>();
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  call->req = req;
  auto fut = call->done.get_future();
  stub.async()->ComputeLogits(&call->ctx, &call->req, &call->answer.resp,
                              [call](grpc::Status s) {
                                call->answer.status = s;
                                call->done.set_value(std::move(call->answer));
                              });
  return fut;
}

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
  for (int i = 0; i < kQueued; ++i) answers.push_back(Send(*s.stub, FullLogitsInto("out", i)));
  // Validated and queued (the loop is not running, so they stay there).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s.batcher.queued_requests() < kQueued && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(s.batcher.queued_requests(), static_cast<size_t>(kQueued));

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
  Answer a = Send(*s.stub, FullLogitsInto("again", 2)).get();
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  v1::LogitsRequest bytes = FullLogitsInto("again", 2);
  bytes.clear_logits_region();
  Answer want = Send(*s.stub, bytes).get();
  ASSERT_TRUE(want.status.ok());
  EXPECT_EQ(std::memcmp(shm.data() + 2 * kVocab * 2, want.resp.logits().data(), kVocab * 2), 0);
  EXPECT_EQ(shm.data()[0], kSentinel);
}

}  // namespace
}  // namespace drafthead
