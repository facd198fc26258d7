// drafthead client library: what a scheduler links to replace its local LM head with the service.
//
//   auto client = drafthead::client::DraftHeadClient::Connect("10.0.0.7:50051", {});
//   if (!client.ok()) ...;
//   auto top = (*client)->TopK(HiddenRows::Bf16(bits, rows), {.k = 8});
//
// Contract:
// - Every call returns absl::Status / absl::StatusOr. A grpc::Status is converted once, at the
//   edge (FromGrpcStatus); a response carrying an in-band `error` becomes that non-OK status, and a
//   response whose sizes do not match the request becomes INTERNAL: a returned value is well formed.
// - A call's deadline covers all its attempts. UNAVAILABLE is retried with exponential backoff
//   and jitter up to RetryPolicy::max_attempts (the only code a retry cannot make worse: the
//   request did not reach a server that acted on it). Other codes are returned at once.
// - Thread-safe: one DraftHeadClient serves any number of threads; async callbacks run on gRPC's
//   callback threads and must not block for long.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/synchronization/mutex.h"
#include "client/lane/lane_client.h"
#include "drafthead/v1/drafthead.grpc.pb.h"

namespace drafthead::client {

// A full-logits answer for 64 rows of the default vocabulary in fp32, plus headroom for the other
// fields and framing; applied both ways (the same bound covers 64 fp32 hidden rows many times).
inline constexpr int kDefaultMaxMessageBytes = 64 * 129280 * 4 + (4 << 20);

// grpc::Status -> absl::Status (the codes share numbers).
absl::Status FromGrpcStatus(const grpc::Status& s);

struct TlsOptions {
  bool enabled = false;
  std::string root_ca_pem;           // empty: the system's roots
  std::string cert_chain_pem;        // mTLS client certificate, with private_key_pem
  std::string private_key_pem;
  std::string server_name_override;  // the name the server's certificate must carry

  // Reads PEM files; any empty path is skipped. enabled = true when any of ca/cert/key is given.
  static absl::StatusOr<TlsOptions> FromFiles(const std::string& ca_file, const std::string& cert_file,
                                              const std::string& key_file, const std::string& server_name);
};

struct RetryPolicy {
  int max_attempts = 3;  // total attempts, >= 1 (1: no retries)
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  double multiplier = 2.0;
  double jitter = 0.2;  // each backoff is scaled by a uniform factor in [1 - jitter, 1 + jitter]
};

struct ClientOptions {
  TlsOptions tls;
  int max_message_bytes = kDefaultMaxMessageBytes;  // send and receive
  absl::Duration default_deadline = absl::Seconds(30);
  RetryPolicy retry;
  // Queue calls while the channel (re)connects instead of failing them with UNAVAILABLE at once.
  bool wait_for_ready = false;
  // Independent channels (TCP connections); calls go round robin. One is enough for a scheduler;
  // the load tester uses more to spread work over server threads.
  int channels = 1;
  // Several replicas behind one name (e.g. "dns:///drafthead-headless.NS.svc.cluster.local:50051"
  // or "ipv4:10.0.0.1:50051,10.0.0.2:50051"): calls go round robin over the addresses whose
  // grpc.health.v1 Watch says SERVING (a draining or failed replica leaves the rotation at once).
  // Off for one server: it would make a NOT_SERVING (still loading) server unreachable, even for
  // WaitUntilServing.
  bool balance_replicas = false;
  // The same-host lane (docs/lane.md): kAuto uses one when the server is on this host and offers
  // lanes (else gRPC; a lane that breaks sends later calls over gRPC), kRequired fails calls with
  // the reason when no lane opens, kOff never tries. Synchronous calls (Compute, Logits, TopK,
  // Argmax, Sample) whose hidden rows are inline use it; async calls and requests naming regions
  // go over gRPC.
  LaneMode lane = LaneMode::kAuto;
  LaneClientOptions lane_options;
};

// A view of rows x hidden_size hidden states, row-major, little-endian; not owned. Or, with
// `region` naming a registered shared-memory region (client/regions.h), where the server reads
// them itself (bytes unused).
struct HiddenRows {
  uint32_t rows = 0;
  v1::DType dtype = v1::BF16;
  std::string_view bytes;
  v1::RegionSlice region = {};

  static HiddenRows InRegion(v1::RegionSlice slice, uint32_t rows, v1::DType dtype = v1::BF16) {
    return {rows, dtype, {}, std::move(slice)};
  }

  static HiddenRows Bf16(std::span<const uint16_t> bits, uint32_t rows) {
    return {rows, v1::BF16, {reinterpret_cast<const char*>(bits.data()), bits.size_bytes()}};
  }
  static HiddenRows Fp32(std::span<const float> values, uint32_t rows) {
    return {rows, v1::FP32, {reinterpret_cast<const char*>(values.data()), values.size_bytes()}};
  }
};

// Where FULL_LOGITS go instead of the response: a slice of a registered region and, for a host
// region this process maps, where those bytes are here (LogitsResult then views them in place).
struct LogitsTarget {
  v1::RegionSlice slice;          // an empty region name: the logits come in the response
  const uint8_t* host = nullptr;  // the slice's first byte in this process; nullptr: device memory
};

struct RequestOptions {
  LogitsTarget logits_region;         // Logits(): into a region (client/regions.h makes targets)
  v1::DType logits_dtype = v1::BF16;  // Logits()
  uint32_t k = 1;                     // TopK()
  bool probs = false;                 // TopK(): softmax(logits / T) of each returned id
  float temperature = 1.0f;           // TopK probs; Sample() (must be > 0)
  uint64_t seed = 0;                  // Sample()
  v1::Head head = v1::FP8_TWIN;
  uint64_t request_id = 0;            // echoed by the server
  absl::Duration deadline = absl::ZeroDuration();  // zero: ClientOptions::default_deadline
};

struct ServerTiming {
  uint32_t queue_us = 0;
  uint32_t compute_us = 0;
  uint32_t batch_rows = 0;
};

struct LogitsResult {
  uint32_t rows = 0;
  uint32_t vocab_size = 0;
  v1::DType dtype = v1::BF16;
  std::string data;  // rows x vocab_size elements of dtype (bf16 as uint16 bits), little-endian
  ServerTiming timing;
  // Set when the logits were written into a host region (RequestOptions::logits_region): they
  // are there, valid while the region is, and `data` is empty.
  const uint8_t* in_region = nullptr;

  // The logits' bytes, wherever they are (empty for a device region: read them on the device).
  std::string_view bytes() const;
  float At(uint32_t row, uint32_t col) const;
  std::vector<float> ToFloat() const;  // widens bf16 exactly
};

struct TokensResult {
  uint32_t rows = 0;
  uint32_t k = 0;                  // 1 for Argmax and Sample
  std::vector<int32_t> token_ids;  // rows x k, best first
  std::vector<float> values;       // the logits of token_ids
  std::vector<float> probs;        // rows x k with RequestOptions::probs, else empty
  ServerTiming timing;
};

// Checks a response against its request and converts it (an in-band error becomes the status).
absl::StatusOr<LogitsResult> ToLogitsResult(const v1::LogitsRequest& req, v1::LogitsResponse resp);
absl::StatusOr<TokensResult> ToTokensResult(const v1::LogitsRequest& req, v1::LogitsResponse resp);
// Builds the request for `mode` from hidden rows and options (copies the hidden bytes).
v1::LogitsRequest BuildRequest(v1::Mode mode, const HiddenRows& hidden, const RequestOptions& options);

// Synchronous bidirectional stream over StreamLogits: answers come one per request, in order.
// Send() and Receive() may be called from two different threads (one sender, one receiver).
class LogitsStream {
 public:
  ~LogitsStream();
  absl::Status Send(const v1::LogitsRequest& request);
  // The next answer. An in-band error becomes its non-OK status and the stream goes on; after the
  // server has closed the stream, returns the final status (OUT_OF_RANGE when it closed cleanly).
  absl::StatusOr<v1::LogitsResponse> Receive();
  // No more requests: the server closes the stream after the outstanding answers.
  absl::Status CloseSend();
  // Waits for the server's final status (call after reading every answer).
  absl::Status Finish();

 private:
  friend class DraftHeadClient;
  LogitsStream() = default;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::LogitsRequest, v1::LogitsResponse>> stream_;
  bool send_closed_ = false;
  bool finished_ = false;
  absl::Status final_;
};

class DraftHeadClient {
 public:
  template <typename T>
  using Callback = absl::AnyInvocable<void(absl::StatusOr<T>) &&>;

  // Creates the channel(s); does not wait for a connection (see WaitUntilServing).
  static absl::StatusOr<std::unique_ptr<DraftHeadClient>> Connect(const std::string& target,
                                                                  ClientOptions options = {});
  ~DraftHeadClient();

  // GetModelInfo (retried like any call).
  absl::StatusOr<v1::ModelInfo> Info(absl::Duration deadline = absl::ZeroDuration());
  // One grpc.health.v1 Health/Check of `service` ("" = the whole server): OK iff SERVING;
  // UNAVAILABLE carrying the serving status otherwise.
  absl::Status CheckHealth(const std::string& service = "", absl::Duration deadline = absl::Seconds(2));
  // Polls CheckHealth until SERVING or `wait` runs out (then the last failure, as DEADLINE_EXCEEDED).
  absl::Status WaitUntilServing(absl::Duration wait, absl::Duration poll_every = absl::Milliseconds(200));

  // Synchronous calls.
  absl::StatusOr<LogitsResult> Logits(const HiddenRows& hidden, const RequestOptions& options = {});
  absl::StatusOr<TokensResult> TopK(const HiddenRows& hidden, const RequestOptions& options);
  absl::StatusOr<TokensResult> Argmax(const HiddenRows& hidden, const RequestOptions& options = {});
  absl::StatusOr<TokensResult> Sample(const HiddenRows& hidden, const RequestOptions& options);
  // The same, with rows = bits.size() / hidden_size (the server's, fetched once by HiddenSize()).
  absl::StatusOr<LogitsResult> Logits(std::span<const uint16_t> bf16_rows, const RequestOptions& options = {});
  absl::StatusOr<TokensResult> TopK(std::span<const uint16_t> bf16_rows, const RequestOptions& options);
  absl::StatusOr<TokensResult> Argmax(std::span<const uint16_t> bf16_rows, const RequestOptions& options = {});
  absl::StatusOr<TokensResult> Sample(std::span<const uint16_t> bf16_rows, const RequestOptions& options);
  // ModelInfo::hidden_size, from the first successful Info() (cached).
  absl::StatusOr<uint32_t> HiddenSize();
  // The raw call: response as the server sent it except that an in-band error is the status.
  absl::StatusOr<v1::LogitsResponse> Compute(const v1::LogitsRequest& request,
                                             absl::Duration deadline = absl::ZeroDuration());

  // Asynchronous calls: `done` runs exactly once, on a gRPC callback thread. The hidden bytes are
  // copied before returning, so the caller's buffer may be reused at once.
  void ComputeAsync(v1::LogitsRequest request, Callback<v1::LogitsResponse> done,
                    absl::Duration deadline = absl::ZeroDuration());
  void LogitsAsync(const HiddenRows& hidden, const RequestOptions& options, Callback<LogitsResult> done);
  void TokensAsync(v1::Mode mode, const HiddenRows& hidden, const RequestOptions& options,
                   Callback<TokensResult> done);
  // Future flavours of the above.
  std::future<absl::StatusOr<LogitsResult>> LogitsFuture(const HiddenRows& hidden, const RequestOptions& options = {});
  std::future<absl::StatusOr<TokensResult>> TokensFuture(v1::Mode mode, const HiddenRows& hidden,
                                                          const RequestOptions& options);

  // Shared-memory regions (servers started with --shared-memory; client/regions.h wraps these).
  absl::Status RegisterRegion(const v1::RegisterRegionRequest& request,
                              absl::Duration deadline = absl::ZeroDuration());
  // An empty name: every region.
  absl::Status UnregisterRegion(const std::string& name, absl::Duration deadline = absl::ZeroDuration());

  // Opens a StreamLogits stream (not retried: a broken stream is the caller's to reopen).
  absl::StatusOr<std::unique_ptr<LogitsStream>> OpenStream(absl::Duration deadline = absl::InfiniteDuration());

  const ClientOptions& options() const { return options_; }
  // The open lane, opening it first when the options allow (nullptr: calls go over gRPC; with
  // LaneMode::kRequired the reason is returned instead).
  absl::StatusOr<std::shared_ptr<LaneClient>> Lane();
  size_t channel_count() const { return channels_.size(); }
  std::shared_ptr<grpc::Channel> channel(size_t i) const { return channels_[i % channels_.size()]; }

 private:
  struct AsyncCall;
  DraftHeadClient(ClientOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels);
  size_t NextChannel();
  absl::Duration Backoff(int attempt);  // before attempt number `attempt` (2, 3, ...)
  absl::Time DeadlineFor(absl::Duration d) const;
  void StartAttempt(std::shared_ptr<AsyncCall> call);
  // One unary call, retried on UNAVAILABLE with backoff within the deadline.
  absl::Status CallUnary(absl::Duration deadline,
                         const std::function<grpc::Status(v1::DraftHead::Stub&, grpc::ClientContext*)>& call);

  ClientOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::DraftHead::Stub>> stubs_;
  std::vector<std::string> caller_ids_;  // kCallerHeader's value on each channel
  absl::StatusOr<HiddenRows> RowsOf(std::span<const uint16_t> bf16_rows);
  std::atomic<uint64_t> next_channel_{0};
  std::atomic<uint32_t> hidden_size_{0};
  std::atomic<uint64_t> jitter_state_;
  absl::Mutex lane_mu_;
  std::shared_ptr<LaneClient> lane_ ABSL_GUARDED_BY(lane_mu_);
  absl::Status lane_status_ ABSL_GUARDED_BY(lane_mu_);  // why there is no lane
  absl::Time lane_retry_at_ ABSL_GUARDED_BY(lane_mu_) = absl::InfinitePast();  // next open attempt
  void DropLane(const std::shared_ptr<LaneClient>& lane, const absl::Status& why);
};

// Channel arguments and credentials shared by the library and the load tester.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target, const ClientOptions& options,
                                                           int channel_index);

}  // namespace drafthead::client
