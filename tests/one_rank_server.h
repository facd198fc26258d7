// One CPU rank serving synthetic weights in process (gRPC in-process channel), with its batch loop
// started only when the test says: requests stay queued until then, so a test fixes the order of
// events by construction, not by timing. Both APIs are served (drafthead.v1, KServe v2);
// ComputeLogits on the gRPC API `unary_api` says.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "server/api/health.h"
#include "server/api/kserve_service.h"
#include "server/api/service.h"
#include "server/backends/compute_backend.h"
#include "server/comm/inproc_collective.h"
#include "server/engine/rank_engine.h"
#include "server/sched/batch_loop.h"
#include "server/weights/shard_weights.h"

namespace drafthead::testing {

struct OneRankServer {
  static constexpr int64_t kK = 64, kRows = 1000, kVocab = 900;

  explicit OneRankServer(UnaryApi unary_api = UnaryApi::kCallback, BatcherOptions batching = {})
      : registry(regions::RegistryOptions{true, false, 0}), batcher(batching) {
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
    engine = std::make_unique<RankEngine>(std::make_unique<InProcCollective>(std::make_shared<InProcGroup>(1), 0, 1),
                                          std::move(backend), geo, EngineOptions{});
    loop = std::make_unique<BatchLoop>(*engine, batcher, nullptr, nullptr);
    ServingLimits limits;
    limits.hidden = kK;
    limits.vocab_size = kVocab;
    v1::ModelInfo info;
    info.set_hidden_size(kK);
    info.set_vocab_size(kVocab);
    info.set_max_rows(64);
    info.set_max_top_k(256);
    service = std::make_unique<DraftHeadService>(batcher, limits, info, nullptr, unary_api);
    service->SetRegions(&registry);
    service->SetReady(true);
    health.SetServing(true);
    kserve = std::make_unique<KServeService>(*service, health, kserve::DescribeModel(info, "drafthead"), &registry);
    grpc::ServerBuilder builder;
    builder.RegisterService(service.get());
    builder.RegisterService(kserve.get());
    server = builder.BuildAndStart();
    stub = v1::DraftHead::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
    kserve_stub = inference::GRPCInferenceService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
  ~OneRankServer() {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    loop->Stop();
    if (loop_thread.joinable()) loop_thread.join();
  }
  void StartLoop() {
    loop_thread = std::thread([this] { EXPECT_TRUE(loop->Run().ok()); });
  }
  // Waits (30 s at most) until `n` requests are queued.
  bool WaitQueued(size_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (batcher.queued_requests() < n && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return batcher.queued_requests() == n;
  }

  regions::RegionRegistry registry;
  Batcher batcher;
  std::unique_ptr<RankEngine> engine;
  std::unique_ptr<BatchLoop> loop;
  std::unique_ptr<DraftHeadService> service;
  HealthService health;
  std::unique_ptr<KServeService> kserve;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::DraftHead::Stub> stub;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_stub;
  std::thread loop_thread;
};

template <class Resp>
struct Answer {
  grpc::Status status;
  Resp resp;
};

// An asynchronous unary call with a 30 s deadline; `start(ctx, req, resp, on_done)` issues it
// through a stub's async() interface. The future holds the answer.
template <class Req, class Resp, class Start>
std::future<Answer<Resp>> SendAsync(const Req& req, Start start) {
  struct Call {
    grpc::ClientContext ctx;
    Req req;
    Answer<Resp> answer;
    std::promise<Answer<Resp>> done;
  };
  auto call = std::make_shared<Call>();
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  call->req = req;
  auto fut = call->done.get_future();
  start(&call->ctx, &call->req, &call->answer.resp, [call](grpc::Status s) {
    call->answer.status = s;
    call->done.set_value(std::move(call->answer));
  });
  return fut;
}

// ComputeLogits through the callback stub, asynchronously (SendAsync).
inline std::future<Answer<v1::LogitsResponse>> SendLogits(v1::DraftHead::Stub& stub, const v1::LogitsRequest& req) {
  return SendAsync<v1::LogitsRequest, v1::LogitsResponse>(req, [&stub](auto* ctx, auto* q, auto* r, auto done) {
    stub.async()->ComputeLogits(ctx, q, r, std::move(done));
  });
}

}  // namespace drafthead::testing
