#include "server/api/stream_budget.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <algorithm>
#include <memory>
#include <string>

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

absl::Status SerializeAnswer(const google::protobuf::MessageLite& answer, grpc::ByteBuffer* out) {
  bool own = false;
  const grpc::Status s = grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(
      answer, out, &own);
  if (!s.ok()) return absl::InternalError(absl::StrCat("the answer could not be serialized: ", s.error_message()));
  return absl::OkStatus();
}

absl::Status SerializeLogitsResponse(v1::LogitsResponse* answer, grpc::ByteBuffer* out) {
  // Below this the copy costs less than a second slice.
  constexpr size_t kMoveLogitsBytes = 64 << 10;
  if (answer->logits().size() < kMoveLogitsBytes) return SerializeAnswer(*answer, out);
  std::unique_ptr<std::string> logits(answer->release_logits());
  std::string head;
  if (!answer->SerializeToString(&head))
    return absl::InternalError("the answer could not be serialized");
  // The logits field's key (field number, wire type 2: length-delimited), then the length.
  static_assert(v1::LogitsResponse::kLogitsFieldNumber < 16, "a one-byte key");
  head.push_back(static_cast<char>(v1::LogitsResponse::kLogitsFieldNumber << 3 | 2));
  for (uint64_t n = logits->size(); ; n >>= 7) {
    if (n < 0x80) {
      head.push_back(static_cast<char>(n));
      break;
    }
    head.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  grpc::Slice parts[2] = {grpc::Slice(head),
                          grpc::Slice(logits->data(), logits->size(),
                                      [](void* s) { delete static_cast<std::string*>(s); }, logits.get())};
  logits.release();  // the slice owns it now
  *out = grpc::ByteBuffer(parts, 2);
  return absl::OkStatus();
}

absl::Status ParseRequest(grpc::ByteBuffer* in, google::protobuf::MessageLite* msg) {
  const grpc::Status s =
      grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::MessageLite>(in, msg);
  if (!s.ok())
    return absl::InvalidArgumentError(absl::StrCat("the message is not a ", msg->GetTypeName(), ": ", s.error_message()));
  return absl::OkStatus();
}

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
