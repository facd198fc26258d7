#include "server/api/stream_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace drafthead {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace


uint64_t ExpectedAnswerBytes(const v1::LogitsRequest& req, int64_t vocab_size) {
  const uint64_t rows = std::max<uint32_t>(req.rows(), 1);
  constexpr uint64_t kEnvelope = 256;  // ids, timing, error text
  uint64_t per_row;
  switch (req.mode()) {
    case v1::FULL_LOGITS: per_row = static_cast<uint64_t>(std::max<int64_t>(vocab_size, 1)) * 4; break;
    case v1::TOP_K: per_row = static_cast<uint64_t>(std::max<uint32_t>(req.top_k(), 1)) * 3 * 5; break;
    default: per_row = 16; break;  // ARGMAX, SAMPLE: one id and one value
  }
  return kEnvelope + rows * per_row;
}

StreamBudget::StreamBudget(StreamBudgetOptions options) : options_(options) {
  watchdog_ = std::thread([this] { Watch(); });
}

StreamBudget::~StreamBudget() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  watchdog_.join();
}

void StreamBudget::Watch() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(options_.watch_period));
    if (stop_) break;
    const int64_t now = NowNs();
    const int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.stall_limit).count();
    for (StreamAccount* a : accounts_) {
      const int64_t started = a->write_started_ns_.load();
      if (started != 0 && now - started > limit && !a->cancelled_.exchange(true)) {
        Log(LogLevel::kWarn, "stream_cancelled", "reason", "the caller read nothing", "stalled_ms",
            (now - started) / 1000000, "held_bytes", a->bytes());
        a->cancel_();
      }
    }
  }
}

StreamAccount::StreamAccount(StreamBudget& budget, std::function<void()> cancel)
    : budget_(budget), cancel_(std::move(cancel)) {
  absl::MutexLock l(&budget_.mu_);
  budget_.accounts_.insert(this);
}

StreamAccount::~StreamAccount() {
  {
    absl::MutexLock l(&budget_.mu_);  // waits out a watchdog pass that may call us
    budget_.accounts_.erase(this);
  }
  budget_.total_.fetch_sub(bytes_.load());
}

bool StreamAccount::MayRead() const {
  const uint64_t mine = bytes_.load();
  if (mine == 0) return true;
  return mine < budget_.options_.per_stream_bytes && budget_.total_.load() < budget_.options_.total_bytes;
}

void StreamAccount::Add(int64_t delta) {
  bytes_.fetch_add(static_cast<uint64_t>(delta));
  budget_.total_.fetch_add(static_cast<uint64_t>(delta));
}

void StreamAccount::Reserve(uint64_t bytes) { Add(static_cast<int64_t>(bytes)); }
void StreamAccount::Settle(uint64_t reserved, uint64_t actual) {
  Add(static_cast<int64_t>(actual) - static_cast<int64_t>(reserved));
}
void StreamAccount::Release(uint64_t bytes) { Add(-static_cast<int64_t>(bytes)); }
void StreamAccount::WriteStarted() { write_started_ns_.store(NowNs()); }
void StreamAccount::WriteDone() { write_started_ns_.store(0); }

}  // namespace drafthead
