// grpc.health.v1.Health for rank 0. Our own (rather than gRPC's default service, which starts out
// SERVING and so would answer SERVING for an instant before the weights load): NOT_SERVING until
// SetServing(true). Check and Watch answer for "" and "drafthead.v1.DraftHead"; other names get
// NOT_FOUND (the protocol's rule). Watch streams the status at once and at every change: it is
// what gRPC's client-side health checking uses (round_robin over replicas, docs/operations.md
// "Many replicas"), so a draining replica leaves its clients' rotation at once. EndWatches()
// finishes every Watch stream (before the server's shutdown, which would otherwise wait out its
// deadline for these endless streams).
// Thread-safe.
#pragma once

#include <atomic>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace drafthead {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  void SetServing(bool serving);
  void EndWatches();
  bool serving() const { return serving_; }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req) override;

 private:
  class Watcher;
  std::atomic<bool> serving_{false};
  absl::Mutex mu_;  // before any Watcher's own lock
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace drafthead
