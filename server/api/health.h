// grpc.health.v1.Health for rank 0. Our own (rather than gRPC's default service, which starts out
// SERVING and so would answer SERVING for an instant before the weights load): NOT_SERVING until
// SetServing(true). Check answers for "" and "drafthead.v1.DraftHead"; other names get NOT_FOUND
// (the protocol's rule). Watch is not offered (UNIMPLEMENTED): probes use Check.
// Thread-safe.
#pragma once

#include <atomic>

#include "grpc/health/v1/health.grpc.pb.h"

namespace drafthead {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  void SetServing(bool serving) { serving_ = serving; }
  bool serving() const { return serving_; }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::health::v1::HealthCheckResponse* resp) override;

 private:
  std::atomic<bool> serving_{false};
};

}  // namespace drafthead
