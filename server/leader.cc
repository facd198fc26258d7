#include "server/leader.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace drafthead {

const char* ModeName(RowMode m) {
  switch (m) {
    case RowMode::kFullLogits: return "full_logits";
    case RowMode::kTopK: return "top_k";
    case RowMode::kArgmax: return "argmax";
    case RowMode::kSample: return "sample";
  }
  return "unknown";
}

Leader::Leader(RankEngine& engine, Batcher& batcher, Metrics* metrics,
               std::function<void(const absl::Status&)> on_failure)
    : engine_(engine), batcher_(batcher), metrics_(metrics), on_failure_(std::move(on_failure)) {}

void Leader::Stop() { stopping_ = true; }

void Leader::FailInFlight(const absl::Status& status) {
  std::vector<std::function<void(const absl::Status&, v1::LogitsResponse*)>> fail;
  {
    std::lock_guard<std::mutex> l(inflight_mu_);
    fail.swap(inflight_);
  }
  for (auto& f : fail) f(status, nullptr);
}

absl::Status Leader::RunOne(std::vector<BatchItem>& batch) {
  const int64_t K = engine_.geometry().hidden;
  uint32_t rows = 0;
  for (const auto& it : batch) rows += it.req->rows;
  ctl_.rows = rows;
  x_.resize(static_cast<size_t>(rows) * K);
  uint32_t r = 0;
  for (const auto& it : batch) {
    for (uint32_t i = 0; i < it.req->rows; ++i) {
      ctl_.tasks[r + i] = it.req->task;
      ctl_.tasks[r + i].row_in_request = i;
    }
    std::memcpy(&x_[static_cast<size_t>(r) * K], it.req->x.data(), it.req->x.size() * 2);
    r += it.req->rows;
  }
  // Each completion becomes once-only, so FailInFlight (another thread) and this one cannot both
  // answer a request.
  {
    std::lock_guard<std::mutex> l(inflight_mu_);
    inflight_.clear();
    for (auto& it : batch) {
      auto once = std::make_shared<std::atomic<bool>>(false);
      auto inner = std::make_shared<std::function<void(const absl::Status&, v1::LogitsResponse*)>>(
          std::move(it.done));
      it.done = [once, inner](const absl::Status& s, v1::LogitsResponse* r) {
        if (!once->exchange(true)) (*inner)(s, r);
      };
      inflight_.push_back(it.done);
    }
  }
  const auto t0 = Clock::now();
  auto gathered = engine_.RunBatch(ctl_, x_.data());
  const auto t1 = Clock::now();
  {
    std::lock_guard<std::mutex> l(inflight_mu_);
    inflight_.clear();
  }
  if (!gathered.ok()) {
    const absl::Status fail = absl::UnavailableError(
        absl::StrCat("the rank group failed: ", gathered.status().message()));
    for (auto& it : batch) it.done(fail, nullptr);
    return fail;
  }
  const double compute_s = std::chrono::duration<double>(t1 - t0).count();
  if (metrics_) metrics_->RecordBatch(rows, compute_s);
  uint32_t row0 = 0;
  for (auto& it : batch) {
    v1::LogitsResponse resp;
    CombineResponse(*it.req, row0, *gathered->layout, gathered->data, gathered->per_rank_bytes,
                    engine_.geometry(), &resp);
    row0 += it.req->rows;
    auto* timing = resp.mutable_timing();
    timing->set_queue_us(static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(t0 - it.enqueued).count()));
    timing->set_compute_us(static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count()));
    timing->set_batch_rows(rows);
    it.done(absl::OkStatus(), &resp);
  }
  return absl::OkStatus();
}

absl::Status Leader::Run() {
  for (;;) {
    const bool stopping = stopping_.load();
    std::vector<BatchItem> batch = batcher_.Take(std::chrono::milliseconds(stopping ? 0 : 100));
    if (metrics_) {
      metrics_->SetQueueDepth(batcher_.queued_rows(),
                              static_cast<uint32_t>(batcher_.queued_requests()));
    }
    absl::Status s;
    if (!batch.empty()) {
      s = RunOne(batch);
    } else if (stopping && batcher_.queued_requests() == 0) {
      s = engine_.Shutdown();
      if (!s.ok()) Log(LogLevel::kWarn, "shutdown_broadcast_failed", "error", std::string(s.message()));
      return absl::OkStatus();
    } else {
      s = engine_.Heartbeat();
    }
    if (!s.ok()) {
      const absl::Status fail = absl::UnavailableError(
          absl::StrCat("the rank group failed: ", s.message()));
      Log(LogLevel::kError, "group_failed", "error", std::string(s.message()));
      batcher_.Close(fail);
      if (on_failure_) on_failure_(fail);
      return fail;
    }
  }
}

}  // namespace drafthead
