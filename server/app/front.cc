#include "server/app/front.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/version.h"

namespace drafthead {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  DH_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(tls.cert));
  DH_ASSIGN_OR_RETURN(pair.private_key, ReadFile(tls.key));
  opts.pem_key_cert_pairs.push_back(pair);
  if (!tls.client_ca.empty()) {
    DH_ASSIGN_OR_RETURN(opts.pem_root_certs, ReadFile(tls.client_ca));
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

// The boot id names this host (and this boot) for a client asking "same host?".
std::string HostId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

v1::ModelInfo MakeModelInfo(const ServerConfig& c, const ModelLayout& m) {
  const bool keep_bf16 = c.backend_options.keep_bf16;
  v1::ModelInfo info;
  info.set_hidden_size(static_cast<uint32_t>(m.geo.hidden));
  info.set_vocab_size(static_cast<uint32_t>(m.vocab));
  info.set_padded_vocab(static_cast<uint32_t>(m.geo.padded_vocab));
  info.set_tp(static_cast<uint32_t>(c.world));
  info.set_shard_rows(static_cast<uint32_t>(m.geo.shard_rows));
  info.set_max_rows(c.batcher.max_rows);
  info.set_max_top_k(static_cast<uint32_t>(std::min<int64_t>(c.max_top_k, m.vocab)));
  info.set_backend(c.backend);
  info.set_comm(c.comm);
  info.add_heads(v1::FP8_TWIN);
  if (keep_bf16) info.add_heads(v1::BF16_EXACT);
  info.set_weights(m.shape.source + (c.weights.twin.empty() ? "" : " + twin " + c.weights.twin));
  info.set_version(kVersion);
  if (c.shared_memory.system) info.add_shared_memory(v1::SYSTEM);
  if (c.shared_memory.cuda) info.add_shared_memory(v1::CUDA_IPC);
  info.set_lanes(c.lanes);
  info.set_host_id(HostId());
  return info;
}

}  // namespace

void Front::SetServing(bool serving) {
  service->SetReady(serving);
  health.SetServing(serving);
  metrics->SetServing(serving);
}

namespace {

// gRPC replaces whatever file sits at a unix: listening path, a live server's socket included; so
// a second server would silently take the path over, where on TCP it fails (no SO_REUSEPORT).
// Refuse when something accepts there; a stale socket (connection refused) or no file is fine.
// The probe and gRPC's bind are not atomic: two servers started at the same instant can still race.
absl::Status CheckSocketPathFree(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return absl::OkStatus();  // CheckListenAddress refused it
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();  // cannot probe: gRPC's bind decides
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const bool live = rc == 0 || errno == EAGAIN;  // EAGAIN: a listener whose backlog is full
  close(fd);
  if (live) return absl::FailedPreconditionError(absl::StrCat("a server already listens on unix:", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Front>> StartFront(const ServerConfig& c, const ModelLayout& m) {
  auto f = std::make_unique<Front>();
  f->metrics = std::make_unique<Metrics>(c.world);
  if (!c.metrics_listen.empty()) {
    auto ms = MetricsServer::Start(c.metrics_listen, f->metrics.get());
    if (!ms.ok()) return StepFailed("metrics_failed", ms.status());
    f->metrics_server = std::move(*ms);
    Log(LogLevel::kInfo, "metrics_listening", "port", f->metrics_server->port());
  }
  f->regions = std::make_unique<regions::RegionRegistry>(c.shared_memory);
  f->batcher = std::make_unique<Batcher>(c.batcher);
  ServingLimits limits;
  limits.hidden = m.geo.hidden;
  limits.vocab_size = m.vocab;
  limits.max_rows = c.batcher.max_rows;
  limits.max_top_k = c.max_top_k;
  limits.has_bf16 = c.backend_options.keep_bf16;
  const v1::ModelInfo info = MakeModelInfo(c, m);
  f->service = std::make_unique<DraftHeadService>(*f->batcher, limits, info, f->metrics.get(),
                                                c.unary_api);
  f->service->SetRegions(f->regions.get());
  f->service->SetStreamBudget(c.stream_budget);
  LaneOptions lane_options;
  lane_options.max_lanes = c.lanes;
  lane_options.spin = c.lane_spin;
  lane_options.max_rows = c.batcher.max_rows;
  lane_options.max_top_k = c.max_top_k;
  DraftHeadService* service = f->service.get();
  f->lanes = std::make_unique<LaneManager>(
      lane_options, f->regions.get(),
      [service](const v1::LogitsRequest& req, CallControl call,
                std::function<void(const absl::Status&, v1::LogitsResponse*)> done) {
        service->Submit(req, std::move(call), std::move(done));
      });
  f->service->SetLanes(f->lanes.get());
  f->metrics->SetExtraRenderer([lanes = f->lanes.get()](std::string* out) { lanes->RenderMetrics(out); });
  f->kserve = std::make_unique<KServeService>(*f->service, f->health, kserve::DescribeModel(info, c.model_name),
                                              f->regions.get());

  if (std::optional<std::string> path = UnixSocketPath(c.listen)) {
    if (absl::Status s = CheckSocketPathFree(*path); !s.ok()) return StepFailed("listen_failed", s);
  }
  auto creds = ServerCredentials(c.tls);
  if (!creds.ok()) return StepFailed("bad_flags", creds.status());
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(c.listen, *creds, &bound_port);
  const int64_t max_msg = static_cast<int64_t>(c.batcher.max_rows) *
                              std::max<int64_t>(m.vocab * 4, m.geo.hidden * 4) + (1 << 20);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_msg, INT32_MAX)));
  builder.SetMaxSendMessageSize(static_cast<int>(std::min<int64_t>(max_msg, INT32_MAX)));
  // No SO_REUSEPORT: a second server on the same port must fail, not silently share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (c.unary_api == UnaryApi::kSync) {
    // A sync call holds its polling thread until answered; a thread done with one goes back to
    // polling only while fewer than MAX_POLLERS poll, else it exits (gRPC's default 2 started and
    // ended a thread per call under load: c = 64 on the CPU 43k against 60k rows/s with 256).
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                static_cast<int>(c.sync_max_pollers));
  }
  builder.RegisterService(f->service.get());
  builder.RegisterService(&f->health);
  builder.RegisterService(f->kserve.get());
  f->server = builder.BuildAndStart();
  if (!f->server || bound_port == 0)
    return StepFailed("listen_failed", absl::UnavailableError(absl::StrCat("cannot listen on ", c.listen)));
  f->health.SetServing(false);
  Log(LogLevel::kInfo, "grpc_listening", "address", c.listen, "port", bound_port, "tls", c.tls.mode(), "queue_policy",
      QueuePolicyName(c.batcher.policy), "unary_api", UnaryApiName(c.unary_api));
  return f;
}

}  // namespace drafthead
