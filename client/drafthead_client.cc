// DraftHeadClient: channels, retries with backoff, the blocking calls, streams and the async
// calls. One file (~570 lines): one class's implementation, whose sync and async paths share the
// retry and deadline helpers at the top.
#include "client/drafthead_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/caller_header.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/numeric.h"

namespace drafthead::client {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " file ", path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

size_t DTypeSize(v1::DType d) { return d == v1::FP32 ? 4 : 2; }

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::chrono::system_clock::time_point::max();
  return absl::ToChronoTime(t);
}

// The in-band error field, if set, as a status.
absl::Status InBandError(const v1::LogitsResponse& resp) {
  if (!resp.has_error() || resp.error().code() == 0) return absl::OkStatus();
  int code = resp.error().code();
  if (code < 0 || code > 16) code = static_cast<int>(absl::StatusCode::kUnknown);
  return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat("server: ", resp.error().message()));
}

ServerTiming TimingOf(const v1::LogitsResponse& r) {
  return {r.timing().queue_us(), r.timing().compute_us(), r.timing().batch_rows()};
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<TlsOptions> TlsOptions::FromFiles(const std::string& ca_file, const std::string& cert_file,
                                                 const std::string& key_file, const std::string& server_name) {
  TlsOptions t;
  t.server_name_override = server_name;
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together (mTLS needs both)");
  }
  if (!ca_file.empty()) {
    absl::StatusOr<std::string> s = ReadFile(ca_file, "TLS root CA");
    if (!s.ok()) return s.status();
    t.root_ca_pem = *std::move(s);
  }
  if (!cert_file.empty()) {
    absl::StatusOr<std::string> c = ReadFile(cert_file, "TLS certificate");
    if (!c.ok()) return c.status();
    absl::StatusOr<std::string> k = ReadFile(key_file, "TLS key");
    if (!k.ok()) return k.status();
    t.cert_chain_pem = *std::move(c);
    t.private_key_pem = *std::move(k);
  }
  t.enabled = !ca_file.empty() || !cert_file.empty();
  return t;
}

// Client-side balancing over replicas (ClientOptions::balance_replicas): round robin over the
// resolved addresses, each health-checked through grpc.health.v1 Watch of service "".
constexpr char kBalancedServiceConfig[] =
    R"({"loadBalancingConfig":[{"round_robin":{}}],"healthCheckConfig":{"serviceName":""}})";

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target, const ClientOptions& options,
                                                           int channel_index) {
  if (target.empty()) return absl::InvalidArgumentError("empty target (want HOST:PORT or unix:PATH)");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Separate connections per channel index: without a local pool, equal channels share one
  // subchannel (one TCP connection) and --connections would change nothing.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("drafthead.channel_index", channel_index);
  // Our own bounded retries; gRPC's transparent retry policy would hide attempts from the caller.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (options.balance_replicas) args.SetServiceConfigJSON(kBalancedServiceConfig);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls.root_ca_pem;
    ssl.pem_cert_chain = options.tls.cert_chain_pem;
    ssl.pem_private_key = options.tls.private_key_pem;
    creds = grpc::SslCredentials(ssl);
    if (!options.tls.server_name_override.empty()) {
      args.SetSslTargetNameOverride(options.tls.server_name_override);
    }
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  std::shared_ptr<grpc::Channel> ch = grpc::CreateCustomChannel(target, creds, args);
  if (!ch) return absl::InternalError(absl::StrCat("cannot create a channel to ", target));
  return ch;
}

// ---- results ----------------------------------------------------------------------------------

std::string_view LogitsResult::bytes() const {
  if (in_region == nullptr) return data;
  return {reinterpret_cast<const char*>(in_region),
          static_cast<size_t>(rows) * vocab_size * DTypeSize(dtype)};
}

float LogitsResult::At(uint32_t row, uint32_t col) const {
  const size_t i = static_cast<size_t>(row) * vocab_size + col;
  const char* src = bytes().data();
  if (dtype == v1::FP32) {
    float f;
    std::memcpy(&f, src + 4 * i, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, src + 2 * i, 2);
  return Bf16ToFloat(b);
}

std::vector<float> LogitsResult::ToFloat() const {
  const size_t n = static_cast<size_t>(rows) * vocab_size;
  std::vector<float> out(n);
  const char* src = bytes().data();
  if (dtype == v1::FP32) {
    std::memcpy(out.data(), src, 4 * n);
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      out[i] = Bf16ToFloat(b);
    }
  }
  return out;
}

v1::LogitsRequest BuildRequest(v1::Mode mode, const HiddenRows& hidden, const RequestOptions& o) {
  v1::LogitsRequest r;
  r.set_request_id(o.request_id);
  r.set_rows(hidden.rows);
  if (hidden.region.region().empty()) {
    r.set_hidden(hidden.bytes.data(), hidden.bytes.size());
  } else {
    *r.mutable_hidden_region() = hidden.region;
  }
  r.set_hidden_dtype(hidden.dtype);
  r.set_mode(mode);
  r.set_head(o.head);
  switch (mode) {
    case v1::FULL_LOGITS:
      r.set_logits_dtype(o.logits_dtype);
      if (!o.logits_region.slice.region().empty()) *r.mutable_logits_region() = o.logits_region.slice;
      break;
    case v1::TOP_K:
      r.set_top_k(o.k);
      r.set_return_probs(o.probs);
      r.set_temperature(o.temperature);
      break;
    case v1::SAMPLE:
      r.set_temperature(o.temperature);
      r.set_seed(o.seed);
      break;
    default:
      break;
  }
  return r;
}

absl::StatusOr<LogitsResult> ToLogitsResult(const v1::LogitsRequest& req, v1::LogitsResponse resp) {
  if (absl::Status e = InBandError(resp); !e.ok()) return e;
  LogitsResult out;
  out.rows = resp.rows();
  out.vocab_size = resp.vocab_size();
  out.dtype = resp.logits_dtype();
  out.timing = TimingOf(resp);
  if (out.rows != req.rows()) {
    return absl::InternalError(absl::StrCat("malformed response: ", out.rows, " rows for a ", req.rows(), "-row request"));
  }
  if (out.dtype != req.logits_dtype()) return absl::InternalError("malformed response: logits_dtype differs from the request's");
  const size_t want = static_cast<size_t>(out.rows) * out.vocab_size * DTypeSize(out.dtype);
  if (req.has_logits_region()) {  // written into the region: nothing in the response
    if (!resp.logits().empty() || req.logits_region().byte_size() != want)
      return absl::InternalError(absl::StrCat("malformed response: logits_region of ",
                                              req.logits_region().byte_size(), " bytes for ", out.rows,
                                              " x ", out.vocab_size, " logits, ", resp.logits().size(),
                                              " bytes in the response"));
    return out;
  }
  if (resp.logits().size() != want) {
    return absl::InternalError(absl::StrCat("malformed response: logits has ", resp.logits().size(), " bytes, expected ",
                                            out.rows, " x ", out.vocab_size, " x ", DTypeSize(out.dtype)));
  }
  out.data = std::move(*resp.mutable_logits());
  return out;
}

absl::StatusOr<TokensResult> ToTokensResult(const v1::LogitsRequest& req, v1::LogitsResponse resp) {
  if (absl::Status e = InBandError(resp); !e.ok()) return e;
  TokensResult out;
  out.rows = resp.rows();
  out.k = req.mode() == v1::TOP_K ? req.top_k() : 1;
  out.timing = TimingOf(resp);
  if (out.rows != req.rows()) {
    return absl::InternalError(absl::StrCat("malformed response: ", out.rows, " rows for a ", req.rows(), "-row request"));
  }
  const size_t n = static_cast<size_t>(out.rows) * out.k;
  if (static_cast<size_t>(resp.token_ids_size()) != n || static_cast<size_t>(resp.values_size()) != n) {
    return absl::InternalError(absl::StrCat("malformed response: ", resp.token_ids_size(), " token_ids and ",
                                            resp.values_size(), " values, expected ", n));
  }
  const bool want_probs = req.mode() == v1::TOP_K && req.return_probs();
  if (want_probs && static_cast<size_t>(resp.probs_size()) != n) {
    return absl::InternalError(absl::StrCat("malformed response: ", resp.probs_size(), " probs, expected ", n));
  }
  out.token_ids.assign(resp.token_ids().begin(), resp.token_ids().end());
  out.values.assign(resp.values().begin(), resp.values().end());
  if (want_probs) out.probs.assign(resp.probs().begin(), resp.probs().end());
  return out;
}

// ---- stream -----------------------------------------------------------------------------------

LogitsStream::~LogitsStream() {
  if (stream_ && !finished_) {
    context_->TryCancel();
    (void)stream_->Finish();
  }
}

absl::Status LogitsStream::Send(const v1::LogitsRequest& request) {
  if (send_closed_) return absl::FailedPreconditionError("Send after CloseSend");
  if (!stream_->Write(request)) return absl::UnavailableError("stream closed by the server (call Finish for its status)");
  return absl::OkStatus();
}

absl::StatusOr<v1::LogitsResponse> LogitsStream::Receive() {
  v1::LogitsResponse resp;
  if (!stream_->Read(&resp)) {
    absl::Status s = Finish();
    if (s.ok()) return absl::OutOfRangeError("stream ended");
    return s;
  }
  if (absl::Status e = InBandError(resp); !e.ok()) return e;
  return resp;
}

absl::Status LogitsStream::CloseSend() {
  if (send_closed_) return absl::OkStatus();
  send_closed_ = true;
  if (!stream_->WritesDone()) return absl::UnavailableError("stream closed before WritesDone");
  return absl::OkStatus();
}

absl::Status LogitsStream::Finish() {
  if (!finished_) {
    finished_ = true;
    final_ = FromGrpcStatus(stream_->Finish());
  }
  return final_;
}

// ---- client -----------------------------------------------------------------------------------

DraftHeadClient::DraftHeadClient(ClientOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels)
    : options_(std::move(options)),
      channels_(std::move(channels)),
      jitter_state_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))) {
  for (const auto& ch : channels_) stubs_.push_back(v1::DraftHead::NewStub(ch));
  // One caller per channel to the server's fair queue, also where peers read alike (unix:).
  caller_ids_ = NewCallerIds(channels_.size());
}

DraftHeadClient::~DraftHeadClient() = default;

absl::StatusOr<std::unique_ptr<DraftHeadClient>> DraftHeadClient::Connect(const std::string& target,
                                                                          ClientOptions options) {
  if (options.channels < 1) return absl::InvalidArgumentError("ClientOptions::channels must be >= 1");
  if (options.retry.max_attempts < 1) return absl::InvalidArgumentError("RetryPolicy::max_attempts must be >= 1");
  if (options.max_message_bytes < (1 << 20)) options.max_message_bytes = kDefaultMaxMessageBytes;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < options.channels; ++i) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = MakeChannel(target, options, i);
    if (!ch.ok()) return ch.status();
    channels.push_back(*std::move(ch));
  }
  return std::unique_ptr<DraftHeadClient>(new DraftHeadClient(std::move(options), std::move(channels)));
}

size_t DraftHeadClient::NextChannel() {
  return next_channel_.fetch_add(1, std::memory_order_relaxed) % stubs_.size();
}

absl::Duration DraftHeadClient::Backoff(int attempt) {
  const RetryPolicy& p = options_.retry;
  double b = absl::ToDoubleSeconds(p.initial_backoff) * std::pow(p.multiplier, std::max(0, attempt - 2));
  b = std::min(b, absl::ToDoubleSeconds(p.max_backoff));
  // splitmix step: cheap, lock-free jitter so that many clients do not retry in lockstep.
  const uint64_t r = Mix64(jitter_state_.fetch_add(0x9e3779b97f4a7c15ull, std::memory_order_relaxed));
  const double u = static_cast<double>(r >> 11) * 0x1.0p-53;  // [0, 1)
  b *= 1.0 + p.jitter * (2.0 * u - 1.0);
  return absl::Seconds(std::max(0.0, b));
}

absl::Time DraftHeadClient::DeadlineFor(absl::Duration d) const {
  if (d == absl::ZeroDuration()) d = options_.default_deadline;
  if (d == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + d;
}

absl::Status DraftHeadClient::CallUnary(
    absl::Duration deadline,
    const std::function<grpc::Status(v1::DraftHead::Stub&, grpc::ClientContext*)>& call) {
  const absl::Time until = DeadlineFor(deadline);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToChrono(until));
    ctx.set_wait_for_ready(options_.wait_for_ready);
    const size_t ch = NextChannel();
    ctx.AddMetadata(kCallerHeader, caller_ids_[ch]);
    absl::Status s = FromGrpcStatus(call(*stubs_[ch], &ctx));
    if (s.ok()) return s;
    if (s.code() != absl::StatusCode::kUnavailable || attempt >= options_.retry.max_attempts) return s;
    const absl::Duration b = Backoff(attempt + 1);
    if (absl::Now() + b >= until) return s;
    absl::SleepFor(b);
  }
}

absl::StatusOr<v1::ModelInfo> DraftHeadClient::Info(absl::Duration deadline) {
  v1::ModelInfo info;
  DH_RETURN_IF_ERROR(CallUnary(deadline, [&](v1::DraftHead::Stub& stub, grpc::ClientContext* ctx) {
    info.Clear();
    return stub.GetModelInfo(ctx, v1::ModelInfoRequest(), &info);
  }));
  return info;
}

absl::Status DraftHeadClient::RegisterRegion(const v1::RegisterRegionRequest& request,
                                             absl::Duration deadline) {
  return CallUnary(deadline, [&](v1::DraftHead::Stub& stub, grpc::ClientContext* ctx) {
    v1::RegisterRegionResponse resp;
    return stub.RegisterRegion(ctx, request, &resp);
  });
}

absl::Status DraftHeadClient::UnregisterRegion(const std::string& name, absl::Duration deadline) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  return CallUnary(deadline, [&](v1::DraftHead::Stub& stub, grpc::ClientContext* ctx) {
    v1::UnregisterRegionResponse resp;
    return stub.UnregisterRegion(ctx, request, &resp);
  });
}

absl::Status DraftHeadClient::CheckHealth(const std::string& service, absl::Duration deadline) {
  auto stub = grpc::health::v1::Health::NewStub(channels_[0]);
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(absl::Now() + deadline));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  absl::Status s = FromGrpcStatus(stub->Check(&ctx, req, &resp));
  if (!s.ok()) return s;
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat("health: ",
                                               grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())));
  }
  return absl::OkStatus();
}

absl::Status DraftHeadClient::WaitUntilServing(absl::Duration wait, absl::Duration poll_every) {
  const absl::Time until = absl::Now() + wait;
  absl::Status last;
  for (;;) {
    const absl::Duration left = until - absl::Now();
    last = CheckHealth("", std::clamp(left, absl::Milliseconds(100), absl::Seconds(2)));
    if (last.ok()) return last;
    if (absl::Now() + poll_every >= until) break;
    absl::SleepFor(poll_every);
  }
  return absl::DeadlineExceededError(absl::StrCat("not SERVING within ", absl::FormatDuration(wait),
                                                  "; last: ", last.ToString()));
}

absl::StatusOr<std::shared_ptr<LaneClient>> DraftHeadClient::Lane() {
  if (options_.lane == LaneMode::kOff) return std::shared_ptr<LaneClient>();
  {  // the common case, shared by every calling thread
    absl::ReaderMutexLock r(&lane_mu_);
    if (lane_ != nullptr) return lane_;
  }
  absl::MutexLock l(&lane_mu_);
  if (lane_ != nullptr || absl::Now() < lane_retry_at_) {
    if (lane_ == nullptr && options_.lane == LaneMode::kRequired) return lane_status_;
    return lane_;
  }
  absl::StatusOr<v1::ModelInfo> info = Info(absl::Seconds(5));
  absl::StatusOr<std::unique_ptr<LaneClient>> opened =
      info.ok() ? LaneClient::Open(stubs_[0].get(), *info, options_.lane_options) : info.status();
  if (opened.ok()) {
    lane_ = std::move(*opened);
    return lane_;
  }
  lane_status_ = absl::Status(opened.status().code(), absl::StrCat("no same-host lane: ", opened.status().message()));
  // A server that cannot give a lane now is asked again later, not on every call.
  lane_retry_at_ = absl::Now() + absl::Seconds(5);
  if (options_.lane == LaneMode::kRequired) return lane_status_;
  return std::shared_ptr<LaneClient>();
}

void DraftHeadClient::DropLane(const std::shared_ptr<LaneClient>& lane, const absl::Status& why) {
  absl::MutexLock l(&lane_mu_);
  if (lane_ != lane) return;
  lane_.reset();
  lane_status_ = why;
  lane_retry_at_ = absl::Now() + absl::Seconds(1);
}

absl::StatusOr<v1::LogitsResponse> DraftHeadClient::Compute(const v1::LogitsRequest& request, absl::Duration deadline) {
  if (options_.lane != LaneMode::kOff && LaneClient::Carries(request)) {
    absl::StatusOr<std::shared_ptr<LaneClient>> lane = Lane();
    if (!lane.ok()) return lane.status();
    if (*lane != nullptr) {
      absl::StatusOr<v1::LogitsResponse> r = (*lane)->Compute(request, DeadlineFor(deadline));
      if (r.ok() || r.status().code() != absl::StatusCode::kUnavailable) return r;
      // The lane is gone (the server closed it or exited): later calls reopen or use gRPC; this
      // one is retried over gRPC when allowed (the head is a pure function: a repeat is harmless).
      DropLane(*lane, r.status());
      if (options_.lane == LaneMode::kRequired) return r;
    }
  }
  v1::LogitsResponse resp;
  DH_RETURN_IF_ERROR(CallUnary(deadline, [&](v1::DraftHead::Stub& stub, grpc::ClientContext* ctx) {
    resp.Clear();
    return stub.ComputeLogits(ctx, request, &resp);
  }));
  if (absl::Status e = InBandError(resp); !e.ok()) return e;
  return resp;
}

absl::StatusOr<LogitsResult> DraftHeadClient::Logits(const HiddenRows& hidden, const RequestOptions& o) {
  v1::LogitsRequest req = BuildRequest(v1::FULL_LOGITS, hidden, o);
  absl::StatusOr<v1::LogitsResponse> resp = Compute(req, o.deadline);
  if (!resp.ok()) return resp.status();
  absl::StatusOr<LogitsResult> out = ToLogitsResult(req, *std::move(resp));
  if (out.ok()) out->in_region = o.logits_region.host;
  return out;
}

absl::StatusOr<TokensResult> DraftHeadClient::TopK(const HiddenRows& hidden, const RequestOptions& o) {
  v1::LogitsRequest req = BuildRequest(v1::TOP_K, hidden, o);
  absl::StatusOr<v1::LogitsResponse> resp = Compute(req, o.deadline);
  if (!resp.ok()) return resp.status();
  return ToTokensResult(req, *std::move(resp));
}

absl::StatusOr<TokensResult> DraftHeadClient::Argmax(const HiddenRows& hidden, const RequestOptions& o) {
  v1::LogitsRequest req = BuildRequest(v1::ARGMAX, hidden, o);
  absl::StatusOr<v1::LogitsResponse> resp = Compute(req, o.deadline);
  if (!resp.ok()) return resp.status();
  return ToTokensResult(req, *std::move(resp));
}

absl::StatusOr<TokensResult> DraftHeadClient::Sample(const HiddenRows& hidden, const RequestOptions& o) {
  v1::LogitsRequest req = BuildRequest(v1::SAMPLE, hidden, o);
  absl::StatusOr<v1::LogitsResponse> resp = Compute(req, o.deadline);
  if (!resp.ok()) return resp.status();
  return ToTokensResult(req, *std::move(resp));
}

absl::StatusOr<uint32_t> DraftHeadClient::HiddenSize() {
  if (const uint32_t k = hidden_size_.load(std::memory_order_relaxed)) return k;
  absl::StatusOr<v1::ModelInfo> info = Info();
  if (!info.ok()) return info.status();
  if (info->hidden_size() == 0) return absl::InternalError("server reports hidden_size 0");
  hidden_size_.store(info->hidden_size(), std::memory_order_relaxed);
  return info->hidden_size();
}

absl::StatusOr<HiddenRows> DraftHeadClient::RowsOf(std::span<const uint16_t> bits) {
  absl::StatusOr<uint32_t> k = HiddenSize();
  if (!k.ok()) return k.status();
  if (bits.empty() || bits.size() % *k != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden: ", bits.size(), " bf16 values is not a whole number of rows of ", *k));
  }
  return HiddenRows::Bf16(bits, static_cast<uint32_t>(bits.size() / *k));
}

absl::StatusOr<LogitsResult> DraftHeadClient::Logits(std::span<const uint16_t> b, const RequestOptions& o) {
  absl::StatusOr<HiddenRows> h = RowsOf(b);
  if (!h.ok()) return h.status();
  return Logits(*h, o);
}
absl::StatusOr<TokensResult> DraftHeadClient::TopK(std::span<const uint16_t> b, const RequestOptions& o) {
  absl::StatusOr<HiddenRows> h = RowsOf(b);
  if (!h.ok()) return h.status();
  return TopK(*h, o);
}
absl::StatusOr<TokensResult> DraftHeadClient::Argmax(std::span<const uint16_t> b, const RequestOptions& o) {
  absl::StatusOr<HiddenRows> h = RowsOf(b);
  if (!h.ok()) return h.status();
  return Argmax(*h, o);
}
absl::StatusOr<TokensResult> DraftHeadClient::Sample(std::span<const uint16_t> b, const RequestOptions& o) {
  absl::StatusOr<HiddenRows> h = RowsOf(b);
  if (!h.ok()) return h.status();
  return Sample(*h, o);
}

// One async call across its attempts; kept alive by the shared_ptr captured in gRPC's callback.
struct DraftHeadClient::AsyncCall {
  v1::LogitsRequest request;
  grpc::Alarm alarm;
  absl::Time deadline;
  int attempt = 0;
  Callback<v1::LogitsResponse> done;
  // Holds the call while its retry alarm is pending. The alarm's function keeps only a raw
  // pointer: a shared_ptr stored in the alarm (a member of the call) would be a cycle.
  std::shared_ptr<AsyncCall> self;
};

namespace {

// One attempt of an async call. gRPC's reactor contract makes OnDone the last thing to touch the
// attempt's ClientContext, so the attempt (context, response) is deleted there; with the plain
// callback form the context was owned by the callback itself and could be destroyed while gRPC was
// still completing the call (an intermittent ref-count assertion).
class AttemptReactor : public grpc::ClientUnaryReactor {
 public:
  using Finish = std::function<void(const grpc::Status&, v1::LogitsResponse&&)>;
  explicit AttemptReactor(Finish finish) : finish_(std::move(finish)) {}
  grpc::ClientContext context;
  v1::LogitsResponse response;
  void OnDone(const grpc::Status& s) override {
    Finish f = std::move(finish_);
    v1::LogitsResponse r = std::move(response);
    delete this;
    f(s, std::move(r));
  }

 private:
  Finish finish_;
};

}  // namespace

void DraftHeadClient::StartAttempt(std::shared_ptr<AsyncCall> call) {
  ++call->attempt;
  AsyncCall* raw_call = call.get();
  auto* attempt = new AttemptReactor([this, call](const grpc::Status& gs, v1::LogitsResponse&& response) {
    absl::Status s = FromGrpcStatus(gs);
    if (s.ok()) {
      if (absl::Status e = InBandError(response); !e.ok()) {
        std::move(call->done)(e);
      } else {
        std::move(call->done)(std::move(response));
      }
      return;
    }
    if (s.code() == absl::StatusCode::kUnavailable && call->attempt < options_.retry.max_attempts) {
      const absl::Time at = absl::Now() + Backoff(call->attempt + 1);
      if (at < call->deadline) {
        // The alarm fires on a callback thread; the retry starts from there, never blocking.
        AsyncCall* raw = call.get();
        raw->self = call;
        raw->alarm.Set(ToChrono(at), [this, raw](bool ok) {
          std::shared_ptr<AsyncCall> keep = std::move(raw->self);
          if (ok) {
            StartAttempt(std::move(keep));
          } else {
            std::move(keep->done)(absl::CancelledError("retry alarm cancelled"));
          }
        });
        return;
      }
    }
    std::move(call->done)(s);
  });
  attempt->context.set_deadline(ToChrono(raw_call->deadline));
  attempt->context.set_wait_for_ready(options_.wait_for_ready);
  const size_t ch = NextChannel();
  attempt->context.AddMetadata(kCallerHeader, caller_ids_[ch]);
  stubs_[ch]->async()->ComputeLogits(&attempt->context, &raw_call->request, &attempt->response,
                                     attempt);
  attempt->StartCall();
}

void DraftHeadClient::ComputeAsync(v1::LogitsRequest request, Callback<v1::LogitsResponse> done,
                                   absl::Duration deadline) {
  auto call = std::make_shared<AsyncCall>();
  call->request = std::move(request);
  call->deadline = DeadlineFor(deadline);
  call->done = std::move(done);
  StartAttempt(std::move(call));
}

void DraftHeadClient::LogitsAsync(const HiddenRows& hidden, const RequestOptions& o, Callback<LogitsResult> done) {
  v1::LogitsRequest req = BuildRequest(v1::FULL_LOGITS, hidden, o);
  v1::LogitsRequest shape;  // what ToLogitsResult checks against, without the hidden bytes
  shape.set_rows(req.rows());
  shape.set_logits_dtype(req.logits_dtype());
  if (req.has_logits_region()) *shape.mutable_logits_region() = req.logits_region();
  ComputeAsync(
      std::move(req),
      [shape, host = o.logits_region.host, done = std::move(done)](absl::StatusOr<v1::LogitsResponse> r) mutable {
        if (!r.ok()) return std::move(done)(r.status());
        absl::StatusOr<LogitsResult> out = ToLogitsResult(shape, *std::move(r));
        if (out.ok()) out->in_region = host;
        std::move(done)(std::move(out));
      },
      o.deadline);
}

void DraftHeadClient::TokensAsync(v1::Mode mode, const HiddenRows& hidden, const RequestOptions& o,
                                  Callback<TokensResult> done) {
  v1::LogitsRequest req = BuildRequest(mode, hidden, o);
  v1::LogitsRequest shape = req;
  shape.clear_hidden();
  ComputeAsync(
      std::move(req),
      [shape, done = std::move(done)](absl::StatusOr<v1::LogitsResponse> r) mutable {
        if (!r.ok()) return std::move(done)(r.status());
        std::move(done)(ToTokensResult(shape, *std::move(r)));
      },
      o.deadline);
}

std::future<absl::StatusOr<LogitsResult>> DraftHeadClient::LogitsFuture(const HiddenRows& hidden,
                                                                        const RequestOptions& o) {
  std::promise<absl::StatusOr<LogitsResult>> p;
  auto f = p.get_future();
  LogitsAsync(hidden, o, [p = std::move(p)](absl::StatusOr<LogitsResult> r) mutable { p.set_value(std::move(r)); });
  return f;
}

std::future<absl::StatusOr<TokensResult>> DraftHeadClient::TokensFuture(v1::Mode mode, const HiddenRows& hidden,
                                                                        const RequestOptions& o) {
  std::promise<absl::StatusOr<TokensResult>> p;
  auto f = p.get_future();
  TokensAsync(mode, hidden, o, [p = std::move(p)](absl::StatusOr<TokensResult> r) mutable { p.set_value(std::move(r)); });
  return f;
}

absl::StatusOr<std::unique_ptr<LogitsStream>> DraftHeadClient::OpenStream(absl::Duration deadline) {
  std::unique_ptr<LogitsStream> s(new LogitsStream());
  s->context_ = std::make_unique<grpc::ClientContext>();
  if (deadline != absl::InfiniteDuration()) s->context_->set_deadline(ToChrono(absl::Now() + deadline));
  s->context_->set_wait_for_ready(options_.wait_for_ready);
  s->stream_ = stubs_[NextChannel()]->StreamLogits(s->context_.get());
  if (!s->stream_) return absl::InternalError("cannot open StreamLogits");
  return s;
}

}  // namespace drafthead::client
