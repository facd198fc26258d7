// Prometheus metrics of rank 0, rendered in the text exposition format (version 0.0.4) and
// served by an HTTP endpoint (--metrics-listen). Thread-safe: every method may be called from any
// thread; recording takes one short mutex.
#pragma once

#include <chrono>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/group/stage_times.h"

namespace drafthead {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void Observe(double v);
  // Appends name_bucket / _sum / _count lines with the given extra labels ("" or `mode="x"`).
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Triton's statistics extension's figures (KServe ModelStatistics), cumulative since start, of
// every request through either API. Compute splits as Triton names it: input = validate (checks,
// bf16 conversion, a region read) + broadcast + h2d; infer = gemv + epilogue + gather; output =
// d2h + combine. Recorded as the answer is ready, before gRPC sends it. A batch whose device
// stages were not timed (StageTimes::step_untimed) counts its compute wall time less broadcast as
// infer (gather included, as above): the totals stay whole, only its h2d / d2h are not split out.
struct DurationStat {
  uint64_t count = 0;
  uint64_t ns = 0;
  void Add(uint64_t d_ns) { ++count; ns += d_ns; }
};
struct ComputeStats {
  DurationStat input, infer, output;
};
struct InferenceStats {
  uint64_t last_inference_ms = 0;  // the last request's arrival, ms since the epoch; 0: none yet
  uint64_t inference_count = 0;    // successful requests (one inference each: the model has no batch dim)
  uint64_t execution_count = 0;    // batches run
  DurationStat success, fail, queue;  // success / fail: arrival -> answered or refused
  ComputeStats compute;               // per successful request
  std::map<uint64_t, ComputeStats> batches;  // per batch, by the number of requests it ran
};

// One request's stages in microseconds (the native Timing's fields).
struct RequestStages {
  uint32_t queue_us = 0, validate_us = 0, combine_us = 0;
  uint32_t compute_us = 0;  // the batch's wall time (the device stages' stand-in when untimed)
  StageTimes batch;
};

class Metrics {
 public:
  explicit Metrics(int world);

  void RecordRequest(const std::string& mode, int grpc_code, uint32_t rows);
  // `requests`: how many requests the batch ran. Device stages not timed (stages.step_untimed)
  // add no sample to their histograms.
  void RecordBatch(uint32_t rows, uint32_t requests, double compute_seconds, const StageTimes& stages);
  // A batch taken and prepared while the one before it was on the device (BatchLoop's ahead);
  // `launched`: also launched behind it.
  void CountBatchTakenAhead(bool launched);
  // One request's outcome for InferenceStats: `stages` only when ok. `arrived_ms`: system clock.
  void RecordInference(bool ok, uint64_t arrived_ms, uint64_t total_ns, const RequestStages* stages);
  InferenceStats inference_stats() const;
  void RecordLatency(double queue_seconds, double total_seconds);
  // One answered request's own stages: validation, combining its shards, handing the answer to
  // gRPC (serializing it: unary Finish / stream StartWrite).
  void RecordRequestStages(uint32_t validate_us, uint32_t combine_us, uint32_t answer_us);
  void SetQueueDepth(uint32_t rows, uint32_t requests);
  // What waits per caller class (batcher.h's CallerKey::cls): class -> (rows, callers with
  // something queued). A class seen before and absent now reads 0.
  void SetCallerQueues(const std::map<std::string, std::pair<uint32_t, uint32_t>>& by_class);
  // One request's wait in the queue (enqueue to its batch's start), by caller class.
  void RecordCallerWait(const std::string& cls, double seconds);
  void SetRankHealth(int rank, bool up);
  void SetWeightBytes(int rank, uint64_t bytes);
  void SetServing(bool serving);
  // Families kept by other layers (the lanes'), appended to Render's text; nullptr: none.
  void SetExtraRenderer(std::function<void(std::string*)> render);

  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  const int world_;
  // (mode, code) -> count
  std::map<std::pair<std::string, int>, uint64_t> requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> rows_ ABSL_GUARDED_BY(mu_);  // mode -> rows
  Histogram batch_rows_ ABSL_GUARDED_BY(mu_);
  Histogram queue_s_ ABSL_GUARDED_BY(mu_), compute_s_ ABSL_GUARDED_BY(mu_),
      total_s_ ABSL_GUARDED_BY(mu_);
  // drafthead_stage_seconds{stage=...}: kStageNames order (metrics.cc).
  std::vector<Histogram> stage_s_ ABSL_GUARDED_BY(mu_);
  uint64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t graph_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ahead_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t launched_ahead_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t queue_rows_ ABSL_GUARDED_BY(mu_) = 0, queue_requests_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::pair<uint32_t, uint32_t>> caller_queues_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Histogram> caller_wait_s_ ABSL_GUARDED_BY(mu_);
  std::vector<int> rank_up_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> weight_bytes_ ABSL_GUARDED_BY(mu_);
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(std::string*)> extra_ ABSL_GUARDED_BY(mu_);
  InferenceStats inference_ ABSL_GUARDED_BY(mu_);
};

// Serves GET /metrics on host:port on its own thread until destroyed. Never waits forever on a
// scraper: reading a request, writing an answer and an idle keep-alive connection are each bounded
// by io_timeout (a stalled or non-reading scraper is dropped then).
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& hostport, const Metrics* metrics,
      std::chrono::milliseconds io_timeout = std::chrono::seconds(5));
  ~MetricsServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drafthead
