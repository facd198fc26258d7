// The load tester's engine (drafthead-client load): drives ComputeLogits or StreamLogits with a
// fixed request shape and measures what came back.
//
// - Closed loop (rps == 0): `concurrency` requests in flight at all times; each answer starts the
//   next one from the completion callback.
// - Open loop (rps > 0): requests are sent on a schedule (constant or Poisson arrivals) whatever the
//   server does; latency is measured from the *scheduled* send time, so a client that falls behind
//   (or a server that queues) shows up as latency, not as a lower send rate (no coordinated
//   omission). In-flight requests are bounded by max_inflight as a safety valve only.
// - Both stop after `duration` or `requests` (whichever first) past a time-based warmup whose
//   requests are not measured. Every call has a deadline; the run always ends.
//
// Efficiency: the gRPC callback API on a generic stub with pre-serialized request ByteBuffers
// (refcounted slices: no per-request serialization or copy of the hidden rows); responses are
// scanned in place for the few fields measured (timing, error), never parsed into messages.
// Statistics go to per-thread histograms (thread_local, registered once per thread and merged at the
// end): the hot path takes no lock and allocates nothing of its own (the per-second timeline grows
// once a second, the per-caller figures once per caller, the optional per-request records
// amortized).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/drafthead_client.h"
#include "client/histogram.h"
#include "client/response_scan.h"

namespace drafthead::client {

enum class Arrival { kConstant, kPoisson };
// Which API the requests speak: drafthead.v1 (ComputeLogits / StreamLogits) or KServe v2
// (inference.GRPCInferenceService ModelInfer / ModelStreamInfer, client/kserve_wire.h).
enum class Protocol { kNative, kKServe };

struct LoadProgress {
  double elapsed_s = 0;      // since the start, warmup included
  bool warming_up = false;
  uint64_t completed = 0;    // answers (ok or not), warmup included
  uint64_t errors = 0;
  int64_t inflight = 0;
};

struct LoadOptions {
  std::string target;
  ClientOptions client;      // TLS and message sizes; `channels` is taken from `connections`
  // Independent channels (TCP connections), used round robin. 0: one per caller: in closed loop
  // `concurrency` channels, so that each in-flight slot (a unary call slot, or with `stream` its own
  // stream) is a caller of its own to the server's fair queue (it tells unary callers apart by
  // connection, streams by stream); in open loop 1.
  int connections = 0;
  Protocol protocol = Protocol::kNative;
  bool stream = false;       // StreamLogits instead of ComputeLogits (KServe: ModelStreamInfer)
  // A same-host lane (docs/lane.md) instead of gRPC: `concurrency` threads share one lane of that
  // depth, each calling synchronously (closed loop, native protocol only).
  bool lane = false;
  int64_t lane_spin_ns = -1;  // -1: the ring's automatic budget (LaneRing::Wait)
  // Unary calls through the C++ client library's blocking call (DraftHeadClient::Compute), each of
  // `concurrency` threads with its own connection (closed loop, native protocol): what a C++
  // caller waiting for its answer sees. The default drives gRPC's callback API, which on Debian's
  // gRPC 1.51 hands every answer to a pool thread before the next call goes out.
  bool blocking = false;
  int streams = 0;           // stream mode: number of streams (0: one per connection)
  int concurrency = 1;       // closed loop: requests in flight
  double rps = 0;            // > 0: open loop at this rate
  Arrival arrival = Arrival::kConstant;
  uint64_t arrival_seed = 1;
  absl::Duration duration = absl::Seconds(10);  // measured time; InfiniteDuration: until `requests`
  int64_t requests = 0;      // measured requests to send (0: no count bound)
  absl::Duration warmup = absl::ZeroDuration();
  absl::Duration timeout = absl::Seconds(10);   // each unary call's deadline
  int64_t max_inflight = 20000;                 // open loop safety valve
  bool record_requests = false;                 // keep one RequestRecord per request (CSV)
  // Called about every 200 ms from the thread that runs RunLoad.
  std::function<void(const LoadProgress&)> progress;
};

struct RequestRecord {
  uint64_t seq = 0;          // order of sending (scheduling order in open loop)
  int64_t start_ns = 0;      // scheduled (open loop) or actual (closed loop) send, from measurement start
  int64_t latency_ns = 0;
  int32_t code = 0;          // gRPC status code; an in-band error's code when set
  uint32_t queue_us = 0, compute_us = 0, batch_rows = 0;
};

struct SecondStats {         // one second of the measured window, by completion time
  uint64_t ok = 0, errors = 0, rows = 0;
  LogLinearHistogram latency{4};  // ns, 3% resolution is plenty for a time series
};

// One caller as the server's fair queue sees it (server/sched/batcher.h's CallerKey): a channel's
// unary calls, a stream, or the lane. In closed loop with `connections` 0 caller i is worker
// (in-flight slot) i.
struct CallerStats {
  uint64_t ok = 0, errors = 0;       // measured answers
  LogLinearHistogram latency{6};     // ns, OK answers (<= 0.8% relative error)
};

struct LoadResult {
  int concurrency = 0;       // closed loop
  double rps_target = 0;     // open loop
  double elapsed_s = 0;      // measured window: warmup end to the last measured answer
  uint64_t issued = 0;       // measured requests sent
  uint64_t ok = 0;
  uint64_t errors = 0;
  std::map<int, uint64_t> errors_by_code;
  std::map<int, std::string> error_examples;  // first message seen per code
  uint64_t rows = 0;         // rows answered OK
  double requests_per_s = 0; // answered (ok + errors) per second of the window
  double ok_per_s = 0;
  double rows_per_s = 0;
  LogLinearHistogram latency{7};     // ns, OK answers
  LogLinearHistogram queue_us{7};    // server Timing.queue_us
  LogLinearHistogram compute_us{7};  // server Timing.compute_us
  LogLinearHistogram overhead{7};    // ns: latency - queue - compute = network + client + server framing
  LogLinearHistogram batch_rows{7};
  // us: the server's Timing stages (kTimingStageNames order)
  std::vector<LogLinearHistogram> stage_us = std::vector<LogLinearHistogram>(kTimingStages, LogLinearHistogram(7));
  LogLinearHistogram send_lag{7};    // ns: open loop, actual send - scheduled send
  std::vector<SecondStats> timeline;
  std::vector<RequestRecord> records;  // by seq, with LoadOptions::record_requests
  int64_t stream_failures = 0;         // streams that ended with an error
  // Per caller, by caller index (every caller the run opened, answered or not); `caller_kind` says
  // what one is: "channel" (unary calls), "stream" or "lane".
  std::vector<CallerStats> callers;
  std::string caller_kind;
};

// Runs one load test. `requests` are serialized LogitsRequests (KServe: ModelInferRequests), used
// round robin (a small pool of distinct hidden states); `rows_per_request` is their row count,
// counted for rows/s when an answer does not carry its own `rows`.
absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const std::vector<std::string>& requests,
                                   uint32_t rows_per_request);

}  // namespace drafthead::client
