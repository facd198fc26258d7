// The gRPC edge (rank 0): drafthead.v1.DraftHead on the callback API, except ComputeLogits under
// UnaryApi::kSync. Every RPC validates its request (server/request/request.h), hands it to the
// Batcher and is completed by whoever answers the batch (the batch loop, the completer, or its own
// thread in an inline run); no callback handler blocks. A sync ComputeLogits blocks the thread gRPC
// polled it with until its answer (an inline run answers on that thread; else until the batch
// loop's or the completer's done() wakes it), never past the call's deadline plus kSyncAnswerGrace
// (a call without a deadline: until answered, which a closing batcher does at once).
// absl::Status is converted to grpc::Status here and only here.
// StreamLogits is registered raw (ByteBuffers in and out): each answer is serialized once, when it
// is ready, into the buffer that its stream's budget counts and gRPC writes from (no second copy).
// ComputeLogits is raw too, on either API: a full-logits answer's logits are moved into the
// buffer gRPC sends, not copied (SerializeLogitsResponse); on the sync API as a "streamed unary"
// method (the generated code offers no raw synchronous unary one; on the wire it is a unary call).
//
// Callers (batcher.h's CallerKey, the unit of fair queueing): each StreamLogits stream is one
// ("stream"); the unary calls of one connection (ctx->peer(): one client channel) are one
// ("unary"), so a client's concurrent calls share one fair share as one stream's requests do, and
// the unary calls of many connections do not crowd out a stream.
//
// Threads: gRPC's callback threads and (kSync) its synchronous polling threads; the service is
// thread-safe. Lifetime: outlives the server.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "drafthead/v1/drafthead.grpc.pb.h"
#include "server/sched/batcher.h"
#include "server/sched/metrics.h"
#include "server/request/request.h"
#include "server/regions/region_registry.h"
#include "server/api/stream_budget.h"
#include "server/api/unary_api.h"
#include "server/lane/lane_manager.h"

namespace drafthead {

grpc::Status ToGrpcStatus(const absl::Status& s);

// Every RPC of the service but ComputeLogits on the callback API, StreamLogits raw (a new RPC: add
// its WithCallbackMethod_ here, or its override does not compile). ComputeLogits is marked raw
// callback in the constructor, or (UnaryApi::kSync) streamed unary.
using DraftHeadServiceBase = v1::DraftHead::WithRawCallbackMethod_StreamLogits<
    v1::DraftHead::WithCallbackMethod_GetModelInfo<v1::DraftHead::WithCallbackMethod_RegisterRegion<
        v1::DraftHead::WithCallbackMethod_UnregisterRegion<v1::DraftHead::WithCallbackMethod_OpenLane<
            v1::DraftHead::WithCallbackMethod_CloseLane<v1::DraftHead::Service>>>>>>;

class DraftHeadService final : public DraftHeadServiceBase {
 public:
  // How long past its deadline a sync ComputeLogits waits for done() before answering INTERNAL
  // (done() always comes: the batcher answers every request it queued, by its deadline at latest).
  static constexpr absl::Duration kSyncAnswerGrace = absl::Seconds(10);

  DraftHeadService(Batcher& batcher, ServingLimits limits, v1::ModelInfo info, Metrics* metrics,
                   UnaryApi unary_api = UnaryApi::kCallback);

  // Shared-memory regions (--shared-memory): requests may name regions of `regions`, and the
  // Register/UnregisterRegion RPCs manage it. Call before serving; `regions` outlives the service.
  // Without it every region RPC and field answers FAILED_PRECONDITION naming the flag.
  void SetRegions(regions::RegionRegistry* regions) { regions_ = regions; }

  // Until ready, logits RPCs answer UNAVAILABLE (weights still loading) and health is NOT_SERVING.
  void SetReady(bool ready) { ready_ = ready; }
  // StreamLogits' backpressure (stream_budget.h); before serving (defaults otherwise).
  void SetStreamBudget(const StreamBudgetOptions& options) {
    stream_budget_ = std::make_unique<StreamBudget>(options);
  }
  // The budget every stream of this server counts against, the KServe streams' too.
  StreamBudget& stream_budget() { return *stream_budget_; }
  // Where every request's outcome is recorded (both APIs'); null: nowhere (tests).
  const Metrics* metrics() const { return metrics_; }

  // ComputeLogits, raw (a full-logits answer is sent without copying its logits:
  // SerializeLogitsResponse), on the callback API (UnaryApi::kCallback) or the sync API (kSync).
  grpc::ServerUnaryReactor* ComputeLogitsCallback(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req, grpc::ByteBuffer* resp);
  grpc::Status ComputeLogitsSync(grpc::ServerContext* ctx,
                                 grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* call);
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StreamLogits(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::ModelInfoRequest* req,
                                         v1::ModelInfo* resp) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterRegionRequest* req,
                                           v1::RegisterRegionResponse* resp) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx,
                                             const v1::UnregisterRegionRequest* req,
                                             v1::UnregisterRegionResponse* resp) override;
  grpc::ServerUnaryReactor* OpenLane(grpc::CallbackServerContext* ctx, const v1::OpenLaneRequest* req,
                                     v1::OpenLaneResponse* resp) override;
  grpc::ServerUnaryReactor* CloseLane(grpc::CallbackServerContext* ctx, const v1::CloseLaneRequest* req,
                                      v1::CloseLaneResponse* resp) override;

  // Validates and queues one request; `done` is called exactly once (possibly before Submit
  // returns) with the result. `may_run_inline`: the calling thread has nothing else to do, so when
  // the engine is idle the request runs on it and Submit returns once it is answered
  // (BatchItem::may_run_inline). `timeout`: a deadline nearer than the call's own, counted from
  // arrival (KServe's `timeout` parameter); a request still queued at its deadline gets
  // DEADLINE_EXCEEDED. `caller`: whom the request is queued for (fair queueing, FIFO within one
  // caller); unset: the unary caller of ctx's connection (UnaryCaller).
  void Submit(grpc::ServerContextBase* ctx, const v1::LogitsRequest& req,
              std::function<void(const absl::Status&, v1::LogitsResponse*)> done, bool may_run_inline = false,
              absl::Duration timeout = absl::InfiniteDuration(), std::optional<CallerKey> caller = std::nullopt);
  // The caller of a unary call: its connection (peer), told apart further by the client's
  // kCallerHeader when it sends one (over a Unix socket every connection's peer reads the same).
  static CallerKey UnaryCaller(const grpc::ServerContextBase& ctx);
  static CallerKey UnaryCallerKey(std::string_view peer, std::string_view caller_header);
  // The same for a request that did not come in as a gRPC call (a lane's): `call` says its
  // deadline, cancellation, caller and whether the submitting thread may run it.
  void Submit(const v1::LogitsRequest& req, CallControl call,
              std::function<void(const absl::Status&, v1::LogitsResponse*)> done);

  // Same-host lanes (--lanes): the OpenLane / CloseLane RPCs manage `lanes`, which outlives the
  // service. Without it both answer FAILED_PRECONDITION naming --lanes.
  void SetLanes(LaneManager* lanes) { lanes_ = lanes; }

 private:
  class StreamReactor;

  Batcher& batcher_;
  ServingLimits limits_;
  v1::ModelInfo info_;
  Metrics* metrics_;
  regions::RegionRegistry* regions_ = nullptr;
  LaneManager* lanes_ = nullptr;
  std::atomic<bool> ready_{false};
  std::unique_ptr<StreamBudget> stream_budget_ = std::make_unique<StreamBudget>(StreamBudgetOptions{});
};

}  // namespace drafthead
