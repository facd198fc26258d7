#include "server/api/health.h"

namespace drafthead {

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const grpc::health::v1::HealthCheckRequest* req,
                                               grpc::health::v1::HealthCheckResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!req->service().empty() && req->service() != "drafthead.v1.DraftHead") {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + req->service()));
    return reactor;
  }
  resp->set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                            : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace drafthead
