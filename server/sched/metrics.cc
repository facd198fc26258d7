#include "server/sched/metrics.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_port.h"

namespace drafthead {
namespace {

std::string Num(double v) { return absl::StrFormat("%.9g", v); }

std::vector<double> LatencyBounds() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0};
}

// The stages of drafthead_stage_seconds, in Timing's order (proto/drafthead/v1/drafthead.proto).
enum StageIndex { kValidate, kBroadcast, kH2d, kGemv, kEpilogue, kGather, kD2h, kCombine, kAnswer, kStages };
constexpr const char* kStageNames[kStages] = {"validate", "broadcast", "h2d", "gemv", "epilogue",
                                              "gather", "d2h", "combine", "answer"};

void Header(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"", Num(bounds_[i]), "\"} ", cum, "\n");
  }
  cum += counts_.back();
  absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"+Inf\"} ", cum, "\n");
  const std::string l = labels.empty() ? "" : absl::StrCat("{", labels, "}");
  absl::StrAppend(out, name, "_sum", l, " ", Num(sum_), "\n", name, "_count", l, " ", count_, "\n");
}

Metrics::Metrics(int world)
    : world_(world),
      batch_rows_({1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 48, 64, 96, 128, 256}),
      queue_s_(LatencyBounds()),
      compute_s_(LatencyBounds()),
      total_s_(LatencyBounds()),
      stage_s_(kStages, Histogram(LatencyBounds())),
      rank_up_(world, 0),
      weight_bytes_(world, 0) {}

void Metrics::RecordRequest(const std::string& mode, int code, uint32_t rows) {
  absl::MutexLock l(&mu_);
  ++requests_[{mode, code}];
  if (code == 0) rows_[mode] += rows;
}

namespace {

constexpr uint64_t kNsPerUs = 1000;

// The batch's part of the compute split (InferenceStats' comment), in ns. `compute_us`: the
// batch's wall time, standing in for the device stages when they were not timed.
void AddBatchCompute(const StageTimes& st, uint64_t compute_us, ComputeStats* c) {
  if (st.step_untimed) {
    const uint64_t collectives = uint64_t{st.broadcast_us} + st.gather_us;
    c->input.Add(uint64_t{st.broadcast_us} * kNsPerUs);
    c->infer.Add((std::max(compute_us, collectives) - st.broadcast_us) * kNsPerUs);
    c->output.Add(0);
    return;
  }
  c->input.Add((uint64_t{st.broadcast_us} + st.h2d_us) * kNsPerUs);
  c->infer.Add((uint64_t{st.gemv_us} + st.epilogue_us + st.gather_us) * kNsPerUs);
  c->output.Add(uint64_t{st.d2h_us} * kNsPerUs);
}

}  // namespace

void Metrics::RecordInference(bool ok, uint64_t arrived_ms, uint64_t total_ns, const RequestStages* st) {
  absl::MutexLock l(&mu_);
  inference_.last_inference_ms = std::max(inference_.last_inference_ms, arrived_ms);
  if (!ok || st == nullptr) {
    inference_.fail.Add(total_ns);
    return;
  }
  ++inference_.inference_count;
  inference_.success.Add(total_ns);
  inference_.queue.Add(uint64_t{st->queue_us} * kNsPerUs);
  ComputeStats& c = inference_.compute;
  AddBatchCompute(st->batch, st->compute_us, &c);
  // The request's own stages on top of its batch's.
  c.input.ns += uint64_t{st->validate_us} * kNsPerUs;
  c.output.ns += uint64_t{st->combine_us} * kNsPerUs;
}

void Metrics::CountBatchTakenAhead(bool launched) {
  absl::MutexLock l(&mu_);
  ++ahead_batches_;
  if (launched) ++launched_ahead_batches_;
}

InferenceStats Metrics::inference_stats() const {
  absl::MutexLock l(&mu_);
  return inference_;
}

void Metrics::RecordBatch(uint32_t rows, uint32_t requests, double compute_seconds, const StageTimes& st) {
  absl::MutexLock l(&mu_);
  ++batches_;
  if (st.graph) ++graph_batches_;
  ++inference_.execution_count;
  AddBatchCompute(st, static_cast<uint64_t>(compute_seconds * 1e6 + 0.5), &inference_.batches[requests]);
  batch_rows_.Observe(rows);
  compute_s_.Observe(compute_seconds);
  const std::pair<StageIndex, uint32_t> stages[] = {
      {kBroadcast, st.broadcast_us}, {kH2d, st.h2d_us},       {kGemv, st.gemv_us},
      {kEpilogue, st.epilogue_us},   {kGather, st.gather_us}, {kD2h, st.d2h_us}};
  for (const auto& [i, us] : stages) {
    const bool device_stage = i == kH2d || i == kGemv || i == kEpilogue || i == kD2h;
    if (!(st.step_untimed && device_stage)) stage_s_[i].Observe(us * 1e-6);  // unmeasured: no sample
  }
}

void Metrics::RecordRequestStages(uint32_t validate_us, uint32_t combine_us, uint32_t answer_us) {
  absl::MutexLock l(&mu_);
  stage_s_[kValidate].Observe(validate_us * 1e-6);
  stage_s_[kCombine].Observe(combine_us * 1e-6);
  stage_s_[kAnswer].Observe(answer_us * 1e-6);
}

void Metrics::RecordLatency(double queue_seconds, double total_seconds) {
  absl::MutexLock l(&mu_);
  queue_s_.Observe(queue_seconds);
  total_s_.Observe(total_seconds);
}

void Metrics::SetQueueDepth(uint32_t rows, uint32_t requests) {
  absl::MutexLock l(&mu_);
  queue_rows_ = rows;
  queue_requests_ = requests;
}

void Metrics::SetCallerQueues(const std::map<std::string, std::pair<uint32_t, uint32_t>>& by_class) {
  absl::MutexLock l(&mu_);
  for (auto& [cls, depth] : caller_queues_) depth = {0, 0};
  for (const auto& [cls, depth] : by_class) caller_queues_[cls] = depth;
}

void Metrics::RecordCallerWait(const std::string& cls, double seconds) {
  absl::MutexLock l(&mu_);
  auto it = caller_wait_s_.find(cls);
  if (it == caller_wait_s_.end()) it = caller_wait_s_.emplace(cls, Histogram(LatencyBounds())).first;
  it->second.Observe(seconds);
}

void Metrics::SetRankHealth(int rank, bool up) {
  absl::MutexLock l(&mu_);
  if (rank >= 0 && rank < world_) rank_up_[rank] = up ? 1 : 0;
}

void Metrics::SetWeightBytes(int rank, uint64_t bytes) {
  absl::MutexLock l(&mu_);
  if (rank >= 0 && rank < world_) weight_bytes_[rank] = bytes;
}

void Metrics::SetServing(bool serving) {
  absl::MutexLock l(&mu_);
  serving_ = serving;
}

void Metrics::SetExtraRenderer(std::function<void(std::string*)> render) {
  absl::MutexLock l(&mu_);
  extra_ = std::move(render);
}

std::string Metrics::Render() const {
  static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  absl::MutexLock l(&mu_);
  std::string out;
  Header(&out, "drafthead_requests_total", "counter", "Logits requests answered, by mode and gRPC status code.");
  for (const auto& [key, n] : requests_) {
    const char* code = key.second >= 0 && key.second <= 16 ? kCodes[key.second] : "UNKNOWN";
    absl::StrAppend(&out, "drafthead_requests_total{mode=\"", key.first, "\",code=\"", code, "\"} ", n, "\n");
  }
  Header(&out, "drafthead_rows_total", "counter", "Hidden rows computed successfully, by mode.");
  for (const auto& [mode, n] : rows_)
    absl::StrAppend(&out, "drafthead_rows_total{mode=\"", mode, "\"} ", n, "\n");
  Header(&out, "drafthead_batches_total", "counter", "Batches run across the rank group.");
  absl::StrAppend(&out, "drafthead_batches_total ", batches_, "\n");
  Header(&out, "drafthead_graph_batches_total", "counter",
         "Batches whose device step on rank 0 replayed a captured CUDA graph (--cuda-graphs).");
  absl::StrAppend(&out, "drafthead_graph_batches_total ", graph_batches_, "\n");
  Header(&out, "drafthead_ahead_batches_total", "counter",
         "Batches taken and prepared while the batch before them was on the device (tp = 1).");
  absl::StrAppend(&out, "drafthead_ahead_batches_total ", ahead_batches_, "\n");
  Header(&out, "drafthead_launched_ahead_batches_total", "counter",
         "Of those, batches also launched behind the batch on the device (--launch-ahead).");
  absl::StrAppend(&out, "drafthead_launched_ahead_batches_total ", launched_ahead_batches_, "\n");
  Header(&out, "drafthead_batch_rows", "histogram", "Rows per batch.");
  batch_rows_.Render("drafthead_batch_rows", "", &out);
  Header(&out, "drafthead_queue_seconds", "histogram", "Time a request waited in rank 0's queue.");
  queue_s_.Render("drafthead_queue_seconds", "", &out);
  Header(&out, "drafthead_compute_seconds", "histogram", "Time of one batch across the group (broadcast, compute, gather).");
  compute_s_.Render("drafthead_compute_seconds", "", &out);
  Header(&out, "drafthead_stage_seconds", "histogram",
         "Time of one stage: per batch (broadcast, h2d, gemv, epilogue, gather, d2h; device time "
         "for h2d..d2h on a GPU, from the batches timed: one in --cuda-stage-events-every) or per "
         "request (validate, combine, answer = handing it to gRPC).");
  for (int i = 0; i < kStages; ++i)
    stage_s_[i].Render("drafthead_stage_seconds", absl::StrCat("stage=\"", kStageNames[i], "\""), &out);
  Header(&out, "drafthead_request_seconds", "histogram", "Time from a request's arrival to its answer.");
  total_s_.Render("drafthead_request_seconds", "", &out);
  Header(&out, "drafthead_queue_rows", "gauge", "Rows waiting in the queue.");
  absl::StrAppend(&out, "drafthead_queue_rows ", queue_rows_, "\n");
  Header(&out, "drafthead_queue_requests", "gauge", "Requests waiting in the queue.");
  absl::StrAppend(&out, "drafthead_queue_requests ", queue_requests_, "\n");
  Header(&out, "drafthead_caller_queue_rows", "gauge", "Rows waiting in the queue, by caller class.");
  for (const auto& [cls, depth] : caller_queues_)
    absl::StrAppend(&out, "drafthead_caller_queue_rows{class=\"", cls, "\"} ", depth.first, "\n");
  Header(&out, "drafthead_caller_queue_callers", "gauge", "Callers with requests waiting, by caller class.");
  for (const auto& [cls, depth] : caller_queues_)
    absl::StrAppend(&out, "drafthead_caller_queue_callers{class=\"", cls, "\"} ", depth.second, "\n");
  Header(&out, "drafthead_caller_queue_seconds", "histogram",
         "Time a request waited in the queue (enqueue to its batch's start), by caller class.");
  for (const auto& [cls, h] : caller_wait_s_)
    h.Render("drafthead_caller_queue_seconds", absl::StrCat("class=\"", cls, "\""), &out);
  Header(&out, "drafthead_rank_up", "gauge", "1 while a rank has its shard and answers.");
  for (int r = 0; r < world_; ++r)
    absl::StrAppend(&out, "drafthead_rank_up{rank=\"", r, "\"} ", rank_up_[r], "\n");
  Header(&out, "drafthead_weight_bytes", "gauge", "Weight bytes resident per rank (twin plus any bf16 head).");
  for (int r = 0; r < world_; ++r)
    absl::StrAppend(&out, "drafthead_weight_bytes{rank=\"", r, "\"} ", weight_bytes_[r], "\n");
  Header(&out, "drafthead_serving", "gauge", "1 while the service reports SERVING.");
  absl::StrAppend(&out, "drafthead_serving ", serving_ ? 1 : 0, "\n");
  if (extra_) extra_(&out);
  return out;
}

struct MetricsServer::Impl {
  httplib::Server http;
  std::thread thread;
  int port = 0;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& hostport,
                                                                    const Metrics* metrics,
                                                                    std::chrono::milliseconds io_timeout) {
  std::string host;
  int port;
  if (absl::Status s = SplitHostPort(hostport, &host, &port); !s.ok()) return s;
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->impl_ = std::make_unique<Impl>();
  // Every blocking call on a scraper's socket is bounded (httplib's select/poll with these).
  const auto sec = std::chrono::duration_cast<std::chrono::seconds>(io_timeout);
  const auto usec = std::chrono::duration_cast<std::chrono::microseconds>(io_timeout - sec);
  m->impl_->http.set_read_timeout(sec.count(), usec.count());
  m->impl_->http.set_write_timeout(sec.count(), usec.count());
  m->impl_->http.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>(std::ceil(io_timeout.count() / 1000.0))));
  m->impl_->http.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (port == 0) {
    m->impl_->port = m->impl_->http.bind_to_any_port(host);
  } else {
    m->impl_->port = m->impl_->http.bind_to_port(host, port) ? port : -1;
  }
  if (m->impl_->port < 0)
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", hostport));
  Impl* impl = m->impl_.get();
  impl->thread = std::thread([impl] { impl->http.listen_after_bind(); });
  return m;
}

MetricsServer::~MetricsServer() {
  if (impl_) {
    impl_->http.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  }
}

int MetricsServer::port() const { return impl_->port; }

}  // namespace drafthead
