// Rank 0's public face: the DraftHead gRPC service with health and reflection, the request queue
// behind it, and the Prometheus endpoint. It comes up before the group has loaded (health
// NOT_SERVING, logits RPCs UNAVAILABLE "weights still loading") so that probes and clients get an
// answer at once; the rank process turns it to serving once every rank holds its shard.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "server/api/health.h"
#include "server/api/kserve_service.h"
#include "server/api/service.h"
#include "server/app/config.h"
#include "server/lane/lane_manager.h"
#include "server/group/shard_geometry.h"
#include "server/sched/batcher.h"
#include "server/sched/metrics.h"
#include "server/weights/shard_weights.h"

namespace drafthead {

// The head as served: its shape in the checkpoint, the vocabulary answered, this rank's rows.
struct ModelLayout {
  HeadShape shape;
  int64_t vocab = 0;  // --vocab-size, or every row of the head
  ShardGeometry geo;
};

// Start-up steps log their failure under their own event name (operators grep for them) and pass
// the error on; the rank process then exits 1.
inline absl::Status StepFailed(std::string_view event, absl::Status s) {
  Log(LogLevel::kError, event, "error", std::string(s.message()));
  return s;
}

// Members in construction order (destroyed in reverse: the gRPC server first).
struct Front {
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<MetricsServer> metrics_server;  // null without --metrics-listen
  std::unique_ptr<regions::RegionRegistry> regions;  // outlives the service and every request
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<DraftHeadService> service;
  std::unique_ptr<LaneManager> lanes;  // --lanes; its threads submit to `service`, so it goes first
  HealthService health;
  std::unique_ptr<KServeService> kserve;  // inference.GRPCInferenceService on the same port, onto `service`
  std::unique_ptr<grpc::Server> server;

  ~Front() {
    if (metrics) metrics->SetExtraRenderer(nullptr);  // the lanes go before the metrics endpoint
  }
  // Health, metrics and the service's readiness together.
  void SetServing(bool serving);
};

// Starts the metrics endpoint and the gRPC server, NOT_SERVING. On failure it logs the step's event
// (metrics_failed, bad_flags for unreadable TLS files, listen_failed) and returns the error.
absl::StatusOr<std::unique_ptr<Front>> StartFront(const ServerConfig& config, const ModelLayout& model);

}  // namespace drafthead
