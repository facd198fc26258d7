#include "server/api/kserve_service.h"

#include <algorithm>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/api/kserve_shm.h"
#include "server/api/raw_messages.h"

namespace drafthead {
namespace {

// Answers a unary RPC at once.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

std::vector<std::string> Extensions(const regions::RegionRegistry* regions, const Metrics* metrics) {
  std::vector<std::string> e = {"model_configuration", "parameters"};
  if (metrics != nullptr) e.push_back("statistics");  // listed only where the counts are kept
  if (regions != nullptr)
    for (std::string& kind : kserve::SharedMemoryExtensions(*regions)) e.push_back(std::move(kind));
  return e;
}

// Answers a shared-memory RPC: FAILED_PRECONDITION without a registry, else `rpc`'s status.
template <typename Rpc>
grpc::ServerUnaryReactor* WithRegions(grpc::CallbackServerContext* ctx, regions::RegionRegistry* regions,
                                      Rpc rpc) {
  if (regions == nullptr) return Answer(ctx, regions::SharedMemoryOff());
  return Answer(ctx, rpc(*regions));
}

}  // namespace

KServeService::KServeService(DraftHeadService& native, const HealthService& health,
                             kserve::ModelDescription model, regions::RegionRegistry* regions)
    : native_(native),
      health_(health),
      model_(std::move(model)),
      regions_(regions),
      extensions_(Extensions(regions, native.metrics())) {}

grpc::ServerUnaryReactor* KServeService::ServerLive(grpc::CallbackServerContext* ctx,
                                                    const inference::ServerLiveRequest*,
                                                    inference::ServerLiveResponse* resp) {
  resp->set_live(true);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ServerReady(grpc::CallbackServerContext* ctx,
                                                     const inference::ServerReadyRequest*,
                                                     inference::ServerReadyResponse* resp) {
  resp->set_ready(health_.serving());
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelReady(grpc::CallbackServerContext* ctx,
                                                    const inference::ModelReadyRequest* req,
                                                    inference::ModelReadyResponse* resp) {
  const absl::Status s = kserve::CheckModel(model_, req->name(), req->version());
  if (s.ok()) resp->set_ready(health_.serving());
  return Answer(ctx, s);
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(grpc::CallbackServerContext* ctx,
                                                        const inference::ServerMetadataRequest*,
                                                        inference::ServerMetadataResponse* resp) {
  *resp = kserve::ServerMetadata(extensions_);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                       const inference::ModelMetadataRequest* req,
                                                       inference::ModelMetadataResponse* resp) {
  const absl::Status s = kserve::CheckModel(model_, req->name(), req->version());
  if (s.ok()) *resp = kserve::ModelMetadata(model_);
  return Answer(ctx, s);
}

grpc::ServerUnaryReactor* KServeService::ModelConfig(grpc::CallbackServerContext* ctx,
                                                     const inference::ModelConfigRequest* req,
                                                     inference::ModelConfigResponse* resp) {
  const absl::Status s = kserve::CheckModel(model_, req->name(), req->version());
  if (s.ok()) *resp->mutable_config() = kserve::ModelConfig(model_);
  return Answer(ctx, s);
}

grpc::ServerUnaryReactor* KServeService::ModelStatistics(grpc::CallbackServerContext* ctx,
                                                         const inference::ModelStatisticsRequest* req,
                                                         inference::ModelStatisticsResponse* resp) {
  const Metrics* metrics = native_.metrics();
  if (metrics == nullptr) return Answer(ctx, absl::UnimplementedError("statistics are not kept by this server"));
  if (!req->name().empty()) {
    if (absl::Status s = kserve::CheckModel(model_, req->name(), req->version()); !s.ok()) return Answer(ctx, s);
  } else if (!req->version().empty() && req->version() != kserve::kModelVersion) {
    return Answer(ctx, kserve::CheckModel(model_, model_.name, req->version()));
  }
  *resp->add_model_stats() = kserve::ModelStatistics(model_, metrics->inference_stats());
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::RepositoryIndex(grpc::CallbackServerContext* ctx,
                                                         const inference::RepositoryIndexRequest* req,
                                                         inference::RepositoryIndexResponse* resp) {
  *resp = kserve::RepositoryIndex(model_, health_.serving(), req->ready());
  return Answer(ctx, absl::OkStatus());
}

void KServeService::Infer(grpc::CallbackServerContext* ctx, inference::ModelInferRequest req,
                          std::function<void(const absl::Status&, inference::ModelInferResponse*)> done,
                          const std::function<void(const v1::LogitsRequest&)>& admitted, bool may_run_inline,
                          std::optional<CallerKey> caller) {
  auto translated = kserve::TranslateRequest(std::move(req), model_);
  if (!translated.ok()) return done(translated.status(), nullptr);
  if (absl::Status s = kserve::CheckSharedMemoryOutputs(regions_, *translated); !s.ok()) return done(s, nullptr);
  auto t = std::make_shared<const kserve::TranslatedRequest>(std::move(translated).value());
  if (admitted) admitted(t->native);
  native_.Submit(ctx, t->native, [this, t, done = std::move(done)](const absl::Status& s,
                                                                   v1::LogitsResponse* native) {
    if (!s.ok() || native == nullptr) return done(kserve::InTensorTerms(s), nullptr);
    inference::ModelInferResponse resp;
    kserve::TranslateResponse(*t, model_, *native, &resp);
    const absl::Status written = kserve::WriteSharedMemoryOutputs(regions_, *t, &resp);
    done(written, written.ok() ? &resp : nullptr);
  }, may_run_inline, t->timeout_us > 0 ? absl::Microseconds(std::min<uint64_t>(t->timeout_us, uint64_t{1} << 62))
                                        : absl::InfiniteDuration(), std::move(caller));
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(grpc::CallbackServerContext* ctx,
                                                    const inference::ModelInferRequest* req,
                                                    inference::ModelInferResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Infer(
      ctx, *req,
      [reactor, resp](const absl::Status& s, inference::ModelInferResponse* r) {
        if (s.ok() && r != nullptr) resp->Swap(r);
        reactor->Finish(ToGrpcStatus(s));
      },
      nullptr, /*may_run_inline=*/true);
  return reactor;
}

// One stream: requests are read continuously and submitted as they come (so they batch with each
// other and with everyone else's; the stream is one caller of the batcher's fair queueing); each
// gets a slot in `answers_` at read time, in request order, filled when it completes (a refused one
// at once) with its answer serialized once, and slots are written from the front only when filled:
// answers go out strictly in request order, as Triton answers a non-decoupled model's stream.
// Backpressure as StreamLogits has it (stream_budget.h, the native service's budget): answers
// waiting to be written (filled slots, also those behind an earlier one still in compute) count
// against the stream's and the server's bytes, and a caller that reads nothing is cancelled. An
// answer still in compute holds its expected size (ExpectedAnswerBytes of the translated request,
// reserved as Infer admits it). At most kMaxInFlight slots.
class KServeService::StreamReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static constexpr size_t kMaxInFlight = 256;

  StreamReactor(KServeService* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), ctx_(ctx), account_(svc->native_.stream_budget(), [ctx] { ctx->TryCancel(); }) {
    flow_.reading = true;
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Settle([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        flow_.reading = false;
        flow_.reads_done = true;
      });
      return;
    }
    // Parsed out of the read buffer, and the next read is asked for before this one is
    // submitted: the submission may run it here (the engine idle) while the stream reads on.
    inference::ModelInferRequest req;
    const absl::Status parsed = ParseRequest(&req_, &req);
    std::string id = req.id();
    const bool final_flag = kserve::WantsFinalResponseFlag(req);
    uint64_t seq;
    Settle([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {  // never finishes: this request is unanswered
      seq = next_seq_++;
      answers_.emplace_back();  // its slot, in request order
      flow_.reading = false;
    });
    // Reserved on admission; a request refused before it stays 0 (its answer is an error text).
    auto reserved = std::make_shared<uint64_t>(0);
    auto admitted = [this, reserved](const v1::LogitsRequest& native) {
      *reserved = ExpectedAnswerBytes(native, svc_->model_.vocab_size);
      account_.Reserve(*reserved);
    };
    auto done = [this, reserved, seq, final_flag, id = std::move(id)](const absl::Status& s,
                                                                      inference::ModelInferResponse* r) {
      inference::ModelStreamInferResponse answer;
      if (s.ok() && r != nullptr) answer.mutable_infer_response()->Swap(r);
      // Every answer is its request's last (the model is not decoupled), so no empty one follows.
      auto mark_final = [final_flag](inference::ModelInferResponse* resp) {
        if (final_flag) (*resp->mutable_parameters())["triton_final_response"].set_bool_param(true);
      };
      mark_final(answer.mutable_infer_response());
      grpc::ByteBuffer bytes;
      absl::Status serialized = !s.ok()          ? s
                                : r == nullptr ? absl::InternalError("no answer")
                                               : SerializeAnswer(answer, &bytes);
      if (!serialized.ok()) {  // answered in-band, in its place
        answer.Clear();
        answer.set_error_message(
            absl::StrCat(absl::StatusCodeToString(serialized.code()), ": ", serialized.message()));
        auto* echo = answer.mutable_infer_response();
        echo->set_model_name(svc_->model_.name);
        echo->set_model_version(kserve::kModelVersion);
        echo->set_id(id);
        mark_final(echo);
        SerializeAnswer(answer, &bytes).IgnoreError();  // a few bytes
      }
      answer.Clear();  // the buffer is the one copy held from here on
      account_.Settle(*reserved, bytes.Length());
      Settle([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        answers_[seq - first_seq_] = std::make_unique<grpc::ByteBuffer>(std::move(bytes));
      });
    };
    if (!parsed.ok()) return done(parsed, nullptr);
    svc_->Infer(ctx_, std::move(req), std::move(done), admitted, /*may_run_inline=*/true,
                CallerKey{"kserve_stream", reinterpret_cast<uintptr_t>(this)});
  }

  void OnWriteDone(bool ok) override {
    Settle([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      flow_.writing = false;
      account_.WriteDone();
      PopFrontLocked();
      if (!ok) flow_.broken = true;
    });
  }

  void OnDone() override { delete this; }

 private:
  // Applies `change` under the lock, starts the next write / read as allowed, and finishes the
  // stream when it is over (outside the lock: Finish may lead to OnDone, which deletes this).
  template <typename Change>
  void Settle(Change change) {
    bool finish;
    {
      absl::MutexLock l(&mu_);
      change();
      finish = PumpLocked();
    }
    if (finish) Finish(grpc::Status::OK);
  }

  void PopFrontLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    account_.Release(answers_.front()->Length());
    answers_.pop_front();
    ++first_seq_;
  }

  bool PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!flow_.writing && flow_.broken) {
      // The client is gone: drop the answers nobody can read, in order as they fill.
      while (!answers_.empty() && answers_.front() != nullptr) PopFrontLocked();
    } else if (!flow_.writing && !answers_.empty() && answers_.front() != nullptr) {
      flow_.writing = true;
      account_.WriteStarted();
      StartWrite(answers_.front().get());  // gRPC refers to the buffer's slices: no copy
    }
    if (flow_.MayRead(answers_.size(), kMaxInFlight, account_)) {
      flow_.reading = true;
      StartRead(&req_);
    }
    return flow_.Finishing(answers_.size());
  }

  KServeService* svc_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer req_;  // the read in flight's target (one read at a time: flow_.reading)
  absl::Mutex mu_;
  // One slot per request read and not yet written (or dropped), in request order; null until its
  // answer is ready (serialized). The front one is being written while flow_.writing.
  std::deque<std::unique_ptr<grpc::ByteBuffer>> answers_ ABSL_GUARDED_BY(mu_);
  uint64_t first_seq_ ABSL_GUARDED_BY(mu_) = 0;  // the request number of answers_.front()
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;   // the next request read gets this number
  StreamFlow flow_ ABSL_GUARDED_BY(mu_);
  StreamAccount account_;  // last: unregistered from the budget's watchdog before the rest goes
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KServeService::ModelStreamInfer(
    grpc::CallbackServerContext* ctx) {
  return new StreamReactor(this, ctx);
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
    inference::SystemSharedMemoryRegisterResponse*) {
  return WithRegions(ctx, regions_, [req](auto& r) { return kserve::RegisterSystem(r, *req); });
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return WithRegions(ctx, regions_, [req](auto& r) {
    return kserve::Unregister(r, req->name(), regions::RegionKind::kSystem);
  });
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
    inference::SystemSharedMemoryStatusResponse* resp) {
  return WithRegions(ctx, regions_, [req, resp](auto& r) {
    auto status = kserve::SystemStatus(r, req->name());
    if (status.ok()) *resp = std::move(status).value();
    return status.status();
  });
}

grpc::ServerUnaryReactor* KServeService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryRegisterRequest* req,
    inference::CudaSharedMemoryRegisterResponse*) {
  return WithRegions(ctx, regions_, [req](auto& r) { return kserve::RegisterCuda(r, *req); });
}

grpc::ServerUnaryReactor* KServeService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryUnregisterRequest* req,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return WithRegions(ctx, regions_, [req](auto& r) {
    return kserve::Unregister(r, req->name(), regions::RegionKind::kCudaIpc);
  });
}

grpc::ServerUnaryReactor* KServeService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryStatusRequest* req,
    inference::CudaSharedMemoryStatusResponse* resp) {
  return WithRegions(ctx, regions_, [req, resp](auto& r) {
    auto status = kserve::CudaStatus(r, req->name());
    if (status.ok()) *resp = std::move(status).value();
    return status.status();
  });
}

}  // namespace drafthead
