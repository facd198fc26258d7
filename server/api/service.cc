#include "server/api/service.h"

#include <algorithm>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/caller_header.h"
#include "common/status_macros.h"
#include "server/api/response.h"
#include "server/api/raw_messages.h"

namespace drafthead {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      std::string(s.message()));
}

namespace {

const char* RequestModeName(const v1::LogitsRequest& req) {
  switch (req.mode()) {
    case v1::FULL_LOGITS: return "full_logits";
    case v1::TOP_K: return "top_k";
    case v1::ARGMAX: return "argmax";
    case v1::SAMPLE: return "sample";
    default: return "invalid";
  }
}

uint32_t MicrosSince(Clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
}

Clock::time_point SteadyDeadline(grpc::ServerContextBase* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = d - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

}  // namespace

DraftHeadService::DraftHeadService(Batcher& batcher, ServingLimits limits, v1::ModelInfo info,
                                   Metrics* metrics, UnaryApi unary_api)
    : batcher_(batcher), limits_(limits), info_(std::move(info)), metrics_(metrics) {
  // Method 0 is ComputeLogits, the proto's first rpc (rpcs are added, never renumbered), as the
  // generated WithRawCallbackMethod_ComputeLogits / WithStreamedUnaryMethod_ComputeLogits mark it.
  if (unary_api == UnaryApi::kCallback) {
    MarkMethodRawCallback(0, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                                 [this](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) { return ComputeLogitsCallback(ctx, req, resp); }));
  } else {
    // Raw on the sync API: gRPC's "streamed unary" (one message read, one written; a unary call on
    // the wire), since the generated code offers no raw synchronous unary method.
    MarkMethodStreamed(0, new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                              [this](grpc::ServerContext* ctx,
                                     grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* call) {
                                return ComputeLogitsSync(ctx, call);
                              }));
  }
}

void DraftHeadService::Submit(grpc::ServerContextBase* ctx, const v1::LogitsRequest& req,
                              std::function<void(const absl::Status&, v1::LogitsResponse*)> done,
                              bool may_run_inline, absl::Duration timeout,
                              std::optional<CallerKey> caller) {
  CallControl call;
  call.deadline = SteadyDeadline(ctx);
  if (timeout < absl::Hours(24 * 365))
    call.deadline = std::min(call.deadline, Clock::now() + absl::ToChronoNanoseconds(timeout));
  call.cancelled = [ctx] { return ctx->IsCancelled(); };
  call.may_run_inline = may_run_inline;
  call.caller = caller ? *std::move(caller) : UnaryCaller(*ctx);
  Submit(req, std::move(call), std::move(done));
}

void DraftHeadService::Submit(const v1::LogitsRequest& req, CallControl call,
                              std::function<void(const absl::Status&, v1::LogitsResponse*)> done) {
  const auto arrived = Clock::now();
  const uint64_t arrived_ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  const std::string mode = RequestModeName(req);
  const uint32_t rows = req.rows();
  Metrics* metrics = metrics_;
  auto record = [metrics, mode, rows, arrived, arrived_ms, done = std::move(done)](
                    const absl::Status& s, v1::LogitsResponse* resp) {
    if (metrics == nullptr) return done(s, resp);
    metrics->RecordRequest(mode, static_cast<int>(s.code()), rows);
    // Before the answer leaves, so that a caller holding it sees it counted.
    const auto total_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - arrived).count());
    if (!s.ok() || resp == nullptr) {
      metrics->RecordInference(false, arrived_ms, total_ns, nullptr);
      return done(s, resp);
    }
    const v1::Timing timing = resp->timing();  // done() may move resp away
    RequestStages stages;
    stages.queue_us = timing.queue_us();
    stages.validate_us = timing.validate_us();
    stages.combine_us = timing.combine_us();
    stages.compute_us = timing.compute_us();
    stages.batch = {timing.broadcast_us(), timing.h2d_us(), timing.gemv_us(),
                    timing.epilogue_us(), timing.gather_us(), timing.d2h_us()};
    stages.batch.step_untimed = timing.step_untimed();
    metrics->RecordInference(true, arrived_ms, total_ns, &stages);
    const auto handed = Clock::now();
    done(s, resp);  // unary: Finish serializes the answer; stream: queued in order
    metrics->RecordLatency(timing.queue_us() * 1e-6,
                           std::chrono::duration<double>(handed - arrived).count());
    metrics->RecordRequestStages(timing.validate_us(), timing.combine_us(), MicrosSince(handed));
  };
  if (!ready_) {
    record(absl::UnavailableError("the rank group is not ready (weights still loading)"), nullptr);
    return;
  }
  LogitsDestination logits_dest;
  auto prepared = PrepareRequest(req, limits_, regions_, &logits_dest);
  if (!prepared.ok()) {
    record(prepared.status(), nullptr);
    return;
  }
  BatchItem item;
  item.req = std::make_shared<const PreparedRequest>(std::move(prepared).value());
  item.enqueued = Clock::now();
  item.deadline = call.deadline;
  item.caller = std::move(call.caller);
  item.cancelled = std::move(call.cancelled);
  item.may_run_inline = call.may_run_inline;
  if (logits_dest.region && logits_dest.region.kind() == regions::RegionKind::kCudaIpc) {
    // Device memory: the backend may copy the logits there itself (BatchItem::device_logits); the
    // access keeps the region mapped until the request is answered.
    auto access = logits_dest.region.Access(logits_dest.offset, logits_dest.byte_size, "logits_region");
    if (!access.ok()) {
      record(access.status(), nullptr);
      return;
    }
    item.device_logits = access->device_data();
    item.device_logits_pitch = logits_dest.byte_size / item.req->rows;  // rows x vocab_size x dtype
    item.device_logits_hold = std::make_shared<const regions::RegionAccess>(std::move(access).value());
  }
  const uint32_t validate_us = MicrosSince(arrived);
  item.done = [req = item.req, logits_dest = std::move(logits_dest), arrived, validate_us,
               record = std::move(record)](const absl::Status& s, const BatchRowsResult* result) {
    if (!s.ok() || result == nullptr) return record(s, nullptr);
    v1::LogitsResponse resp;
    const auto t0 = Clock::now();
    const absl::Status built = BuildResponse(*req, *result, logits_dest, &resp);
    if (!built.ok()) return record(built, nullptr);
    v1::Timing* timing = resp.mutable_timing();
    timing->set_validate_us(validate_us);
    timing->set_combine_us(MicrosSince(t0));
    timing->set_server_us(MicrosSince(arrived));
    record(built, &resp);
  };
  batcher_.Submit(std::move(item)).IgnoreError();  // done() has the outcome
}

CallerKey DraftHeadService::UnaryCallerKey(std::string_view peer, std::string_view caller_header) {
  uint64_t id = std::hash<std::string_view>{}(peer);
  if (!caller_header.empty())
    id ^= std::hash<std::string_view>{}(caller_header) + 0x9e3779b97f4a7c15ull + (id << 6) + (id >> 2);
  return CallerKey{"unary", id};
}

CallerKey DraftHeadService::UnaryCaller(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kCallerHeader);
  const std::string_view header = it == md.end() ? std::string_view()
                                                 : std::string_view(it->second.data(), it->second.size());
  return UnaryCallerKey(ctx.peer(), header);
}

grpc::ServerUnaryReactor* DraftHeadService::ComputeLogitsCallback(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* req,
                                                                  grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::ByteBuffer in = *req;  // shares the slices; ParseRequest empties its argument
  v1::LogitsRequest parsed;
  if (absl::Status s = ParseRequest(&in, &parsed); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  Submit(
      ctx, parsed,
      [reactor, resp](const absl::Status& s, v1::LogitsResponse* r) {
        absl::Status answered = s;
        if (answered.ok()) answered = r == nullptr ? absl::InternalError("no answer") : SerializeLogitsResponse(r, resp);
        reactor->Finish(ToGrpcStatus(answered));
      },
      /*may_run_inline=*/true);
  return reactor;
}

grpc::Status DraftHeadService::ComputeLogitsSync(
    grpc::ServerContext* ctx, grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* call) {
  grpc::ByteBuffer in;
  if (!call->Read(&in)) return grpc::Status(grpc::StatusCode::INTERNAL, "ComputeLogits: no request message");
  v1::LogitsRequest parsed;
  if (absl::Status s = ParseRequest(&in, &parsed); !s.ok()) return ToGrpcStatus(s);
  // Shared with done(), which may come after this handler gave up waiting (then it answers into
  // the shared response, never into the call's).
  struct Answer {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    v1::LogitsResponse resp ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  Submit(
      ctx, parsed,
      [answer](const absl::Status& s, v1::LogitsResponse* r) {
        absl::MutexLock l(&answer->mu);
        answer->status = s;
        if (s.ok() && r != nullptr) answer->resp.Swap(r);
        answer->done = true;
      },
      /*may_run_inline=*/true);
  const auto deadline = ctx->deadline();
  const absl::Time wait_until = deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)
                                    ? absl::InfiniteFuture()
                                    : absl::FromChrono(deadline) + kSyncAnswerGrace;
  absl::MutexLock l(&answer->mu);
  if (!answer->mu.AwaitWithDeadline(absl::Condition(&answer->done), wait_until))
    return grpc::Status(grpc::StatusCode::INTERNAL, "the request was never answered (a server bug)");
  if (!answer->status.ok()) return ToGrpcStatus(answer->status);
  grpc::ByteBuffer out;
  if (absl::Status s = SerializeLogitsResponse(&answer->resp, &out); !s.ok()) return ToGrpcStatus(s);
  // The last message: held back and sent with the status, as a unary answer is.
  if (!call->Write(out, grpc::WriteOptions().set_last_message()))
    return grpc::Status(grpc::StatusCode::CANCELLED, "ComputeLogits: the call ended before its answer");
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* DraftHeadService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                         const v1::ModelInfoRequest*,
                                                         v1::ModelInfo* resp) {
  *resp = info_;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

absl::Status RegisterRegionStatus(regions::RegionRegistry* registry,
                                  const v1::RegisterRegionRequest& req) {
  if (registry == nullptr) return regions::SharedMemoryOff();
  DH_ASSIGN_OR_RETURN(regions::RegionSpec spec, RegionSpecFromProto(req));
  return registry->Register(spec);
}

absl::Status UnregisterRegionStatus(regions::RegionRegistry* registry,
                                    const v1::UnregisterRegionRequest& req) {
  if (registry == nullptr) return regions::SharedMemoryOff();
  DH_RETURN_IF_ERROR(registry->CheckAnyEnabled());
  return registry->Unregister(req.name());
}

}  // namespace

// Register / unregister map and unmap on the gRPC thread: bounded work (an mmap, a CUDA IPC open;
// an unregister waits at most regions::kUnregisterWait for a copy in progress).
grpc::ServerUnaryReactor* DraftHeadService::RegisterRegion(grpc::CallbackServerContext* ctx,
                                                           const v1::RegisterRegionRequest* req,
                                                           v1::RegisterRegionResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(RegisterRegionStatus(regions_, *req)));
  return reactor;
}

grpc::ServerUnaryReactor* DraftHeadService::UnregisterRegion(grpc::CallbackServerContext* ctx,
                                                             const v1::UnregisterRegionRequest* req,
                                                             v1::UnregisterRegionResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(UnregisterRegionStatus(regions_, *req)));
  return reactor;
}

namespace {
absl::Status LanesOff() {
  return absl::FailedPreconditionError("same-host lanes are off: start the server with --lanes=N");
}
}  // namespace

// Opening maps the caller's object, registers its regions and starts the lane's thread: bounded.
grpc::ServerUnaryReactor* DraftHeadService::OpenLane(grpc::CallbackServerContext* ctx,
                                                     const v1::OpenLaneRequest* req,
                                                     v1::OpenLaneResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s;
  if (lanes_ == nullptr || !lanes_->enabled()) {
    s = LanesOff();
  } else if (!ready_) {
    s = absl::UnavailableError("the rank group is not ready (weights still loading)");
  } else {
    auto opened = lanes_->Open(*req);
    if (opened.ok()) *resp = *std::move(opened);
    s = opened.status();
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* DraftHeadService::CloseLane(grpc::CallbackServerContext* ctx,
                                                      const v1::CloseLaneRequest* req,
                                                      v1::CloseLaneResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Status s = lanes_ == nullptr || !lanes_->enabled() ? LanesOff() : lanes_->Close(req->lane_id());
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// One stream: requests are read continuously and queued as they come (so a stream's requests
// batch with each other and with everyone else's, the stream one caller of the batcher's fair
// queueing); answers are written strictly in request order. A bad or failed request is answered
// in-band (LogitsResponse.error) and the stream goes on. Each answer is serialized once when it is
// ready and held only as that buffer until gRPC has written it; answers not yet written count
// against the stream's and the server's budgets (account_, stream_budget.h): at its budget a stream
// is not read further; one that reads nothing is cancelled.
class DraftHeadService::StreamReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static constexpr size_t kMaxInFlight = 256;  // stop reading past this many unanswered

  StreamReactor(DraftHeadService* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), ctx_(ctx), account_(*svc->stream_budget_, [ctx] { ctx->TryCancel(); }) {
    flow_.reading = true;
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish;
      {
        absl::MutexLock l(&mu_);
        flow_.reading = false;
        flow_.reads_done = true;
        finish = PumpLocked();
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    // Parsed out of the read buffer, and the next read is asked for before this one is
    // submitted: the submission may run it here (the engine idle) while the stream reads on.
    v1::LogitsRequest req;
    const absl::Status parsed = ParseRequest(&req_, &req);
    std::shared_ptr<Slot> slot = std::make_shared<Slot>();
    slot->bytes = ExpectedAnswerBytes(req, svc_->limits_.vocab_size);
    account_.Reserve(slot->bytes);
    {
      absl::MutexLock l(&mu_);
      slots_.push_back(slot);
      flow_.reading = false;
      PumpLocked();  // never true here: this request's slot is unanswered
    }
    auto answer = [this, slot, id = req.request_id()](const absl::Status& s, v1::LogitsResponse* r) {
      absl::Status serialized = !s.ok()          ? s
                                : r == nullptr ? absl::InternalError("no answer")
                                               : SerializeLogitsResponse(r, &slot->answer);
      if (r != nullptr) r->Clear();  // the buffer is the one copy held from here on
      if (!serialized.ok()) {  // answered in-band
        v1::LogitsResponse failed;
        failed.set_request_id(id);
        failed.mutable_error()->set_code(static_cast<int>(serialized.code()));
        failed.mutable_error()->set_message(std::string(serialized.message()));
        SerializeAnswer(failed, &slot->answer).IgnoreError();  // a few bytes
      }
      const uint64_t actual = slot->answer.Length();
      account_.Settle(slot->bytes, actual);
      bool finish;
      {
        absl::MutexLock l(&mu_);
        slot->ready = true;
        slot->bytes = actual;
        finish = PumpLocked();
      }
      if (finish) Finish(grpc::Status::OK);
    };
    if (!parsed.ok()) return answer(parsed, nullptr);
    svc_->Submit(ctx_, req, std::move(answer), /*may_run_inline=*/true, absl::InfiniteDuration(),
                 CallerKey{"stream", reinterpret_cast<uintptr_t>(this)});
  }

  void OnWriteDone(bool ok) override {
    bool finish;
    {
      absl::MutexLock l(&mu_);
      flow_.writing = false;
      account_.WriteDone();
      account_.Release(slots_.front()->bytes);
      slots_.pop_front();
      if (!ok) flow_.broken = true;
      finish = PumpLocked();
    }
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  // `ready` is read and written under the reactor's mu_ (a nested struct cannot say so to the
  // compiler); `answer` is filled before ready is set and written out only after.
  struct Slot {
    grpc::ByteBuffer answer;  // the serialized LogitsResponse
    bool ready = false;
    uint64_t bytes = 0;  // held in account_: expected until ready, then answer.Length()
  };

  // Starts the next write / read as allowed; returns true when the caller must Finish (outside
  // the lock: Finish may lead to OnDone, which deletes this).
  bool PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!flow_.writing && !slots_.empty() && slots_.front()->ready) {
      if (flow_.broken) {
        // The client is gone: drop answers nobody can read.
        while (!slots_.empty() && slots_.front()->ready) {
          account_.Release(slots_.front()->bytes);
          slots_.pop_front();
        }
      } else {
        flow_.writing = true;
        account_.WriteStarted();
        StartWrite(&slots_.front()->answer);  // gRPC refers to the buffer's slices: no copy
      }
    }
    if (flow_.MayRead(slots_.size(), kMaxInFlight, account_)) {
      flow_.reading = true;
      StartRead(&req_);
    }
    return flow_.Finishing(slots_.size());
  }

  DraftHeadService* svc_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer req_;  // the read in flight's target (one read at a time: flow_.reading)
  absl::Mutex mu_;
  // Unanswered requests in arrival order; the front one is written first.
  std::deque<std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  StreamFlow flow_ ABSL_GUARDED_BY(mu_);
  StreamAccount account_;  // last: unregistered from the budget's watchdog before the rest goes
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DraftHeadService::StreamLogits(
    grpc::CallbackServerContext* ctx) {
  return new StreamReactor(this, ctx);
}

}  // namespace drafthead
