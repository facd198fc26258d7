#include "server/api/health.h"

namespace drafthead {
namespace {

using grpc::health::v1::HealthCheckResponse;

bool KnownService(const std::string& name) { return name.empty() || name == "drafthead.v1.DraftHead"; }

HealthCheckResponse::ServingStatus StatusOf(bool serving) {
  return serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

}  // namespace

// One Watch stream: writes the status at start and whenever it changes (one write at a time; a
// change during a write is sent after it, only the latest).
class HealthService::Watcher : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* svc, bool serving) : svc_(svc) {
    absl::MutexLock l(&mu_);
    want_ = StatusOf(serving);
    PumpLocked();
  }
  void Update(bool serving) {
    absl::MutexLock l(&mu_);
    want_ = StatusOf(serving);
    PumpLocked();
  }
  void End() {
    absl::MutexLock l(&mu_);
    ending_ = true;
    PumpLocked();
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) ending_ = true;
    PumpLocked();
  }
  void OnCancel() override { End(); }
  void OnDone() override {
    {
      absl::MutexLock l(&svc_->mu_);
      svc_->watchers_.erase(this);
    }
    delete this;
  }

 private:
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (ending_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    } else if (sent_ != want_) {
      writing_ = true;
      sent_ = want_;
      resp_.set_status(sent_);
      StartWrite(&resp_);
    }
  }

  HealthService* svc_;
  absl::Mutex mu_;
  HealthCheckResponse resp_;  // the write in flight
  HealthCheckResponse::ServingStatus want_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  HealthCheckResponse::ServingStatus sent_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

void HealthService::SetServing(bool serving) {
  serving_ = serving;
  absl::MutexLock l(&mu_);
  for (Watcher* w : watchers_) w->Update(serving);
}

void HealthService::EndWatches() {
  absl::MutexLock l(&mu_);
  ended_ = true;
  for (Watcher* w : watchers_) w->End();
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const grpc::health::v1::HealthCheckRequest* req,
                                               HealthCheckResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!KnownService(req->service())) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + req->service()));
    return reactor;
  }
  resp->set_status(StatusOf(serving_));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const grpc::health::v1::HealthCheckRequest* req) {
  if (!KnownService(req->service())) {
    // The protocol: an unknown service is watched as SERVICE_UNKNOWN; we refuse it like Check.
    struct Refused : grpc::ServerWriteReactor<HealthCheckResponse> {
      Refused(const std::string& name) { Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + name)); }
      void OnDone() override { delete this; }
    };
    return new Refused(req->service());
  }
  absl::MutexLock l(&mu_);
  auto* w = new Watcher(this, serving_);
  watchers_.insert(w);
  if (ended_) w->End();
  return w;
}

}  // namespace drafthead
