#include "client/lane/lane_client.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/lane/doorbell.h"

namespace drafthead::client {
namespace {

absl::Status FromLane(const lane::LaneError& e) {
  return absl::Status(static_cast<absl::StatusCode>(e.code), e.message);
}

int64_t MonotonicDeadline(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return INT64_MAX;
  return lane::MonotonicNanos() + absl::ToInt64Nanoseconds(std::max(deadline - absl::Now(), absl::ZeroDuration()));
}

lane::LaneSlice Slice(uint32_t region, uint64_t offset, uint64_t bytes) {
  return lane::LaneSlice{region, 0, offset, bytes};
}

}  // namespace

std::string LocalHostId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

v1::OpenLaneRequest OpenLaneRequestFor(const lane::LaneRing& ring, const std::string& arena_name) {
  v1::OpenLaneRequest req;
  req.set_shm_key(ring.key());
  req.set_byte_size(ring.bytes());
  req.set_nonce(ring.nonce());
  req.set_layout_version(lane::kLaneLayoutVersion);
  req.set_pid(getpid());
  if (!ring.arena_key().empty()) {
    v1::RegisterRegionRequest* arena = req.add_regions();
    arena->set_name(arena_name);
    arena->set_kind(v1::SYSTEM);
    arena->set_shm_key(ring.arena_key());
    arena->set_byte_size(ring.arena_bytes());
  }
  return req;
}

absl::StatusOr<std::unique_ptr<LaneClient>> LaneClient::Open(v1::DraftHead::Stub* stub, const v1::ModelInfo& info,
                                                             const LaneClientOptions& options) {
  if (info.lanes() == 0)
    return absl::FailedPreconditionError("the server offers no lanes (started without --lanes)");
  if (info.host_id().empty() || info.host_id() != LocalHostId())
    return absl::FailedPreconditionError("the server is on another host (its boot id differs)");
  bool system = false;
  for (int k : info.shared_memory()) system |= k == v1::SYSTEM;
  if (!system) return absl::FailedPreconditionError("the server serves no system shared memory (--shared-memory)");
  lane::LaneRingConfig config;
  config.depth = options.depth;
  config.spin_ns = options.spin_ns;
  const uint64_t rows = info.max_rows();
  config.inline_bytes = static_cast<uint32_t>(
      std::min<uint64_t>(lane::kMaxInlineBytes, rows * std::max<uint32_t>(info.max_top_k(), 1) * 12));
  config.hidden_slot_bytes = lane::RoundUp(rows * info.hidden_size() * 4, 4096);
  config.output_slot_bytes = lane::RoundUp(rows * info.vocab_size() * 4, 4096);
  lane::LaneError err;
  std::unique_ptr<lane::LaneRing> ring = lane::LaneRing::Create(config, &err);
  if (ring == nullptr) return FromLane(err);

  const v1::OpenLaneRequest req =
      OpenLaneRequestFor(*ring, absl::StrCat("lane-arena-", getpid(), "-", ring->nonce()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::OpenLaneResponse resp;
  const grpc::Status s = stub->OpenLane(&ctx, req, &resp);
  ring->Unlink();  // mapped by the server now (or refused): no name left behind
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat("OpenLane: ", s.error_message()));
  std::unique_ptr<LaneClient> c(new LaneClient());
  c->stub_ = stub;
  c->ring_ = std::move(ring);
  c->lane_id_ = resp.lane_id();
  c->hidden_size_ = info.hidden_size();
  c->vocab_size_ = info.vocab_size();
  if (lane::LaneError a = c->ring_->Attach(resp.server_pid()); !a.ok()) return FromLane(a);
  return c;
}

LaneClient::~LaneClient() {
  if (lane_id_ == 0) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::CloseLaneRequest req;
  req.set_lane_id(lane_id_);
  v1::CloseLaneResponse resp;
  stub_->CloseLane(&ctx, req, &resp);  // best effort: the server also frees it when we exit
}

bool LaneClient::Carries(const v1::LogitsRequest& req) {
  return !req.has_hidden_region() && !req.has_logits_region();
}

absl::StatusOr<v1::LogitsResponse> LaneClient::Compute(const v1::LogitsRequest& req, absl::Time deadline) {
  absl::StatusOr<Pending> call = Start(req, deadline);
  if (!call.ok()) return call.status();
  return Finish(*call, deadline);
}

absl::StatusOr<LaneClient::Pending> LaneClient::Start(const v1::LogitsRequest& req, absl::Time deadline) {
  const lane::LaneRingConfig& cfg = ring_->config();
  lane::LaneRequest d{};
  d.request_id = req.request_id();
  d.rows = req.rows();
  d.hidden_dtype = static_cast<uint8_t>(req.hidden_dtype());
  d.mode = static_cast<uint8_t>(req.mode());
  d.logits_dtype = static_cast<uint8_t>(req.logits_dtype());
  d.head = static_cast<uint8_t>(req.head());
  d.top_k = req.top_k();
  d.flags = req.return_probs() ? uint32_t{lane::kFlagReturnProbs} : 0u;
  d.temperature = req.temperature();
  d.seed = req.seed();
  d.output = Slice(lane::kNoRegion, 0, 0);
  uint64_t logits_bytes = 0;
  if (req.mode() == v1::FULL_LOGITS) {
    // Exactly rows x vocab x dtype (the server refuses any other size, as for a logits_region).
    logits_bytes = uint64_t{req.rows()} * vocab_size_ * (req.logits_dtype() == v1::FP32 ? 4 : 2);
    if (logits_bytes > cfg.output_slot_bytes)
      logits_bytes = cfg.output_slot_bytes;  // rows beyond max_rows: the server names `rows`
    d.output = Slice(0, 0, logits_bytes);  // the slot's output area
  }
  uint64_t seq = 0;
  if (lane::LaneError e = ring_->Submit(d, req.hidden().data(), req.hidden().size(), MonotonicDeadline(deadline), &seq);
      !e.ok())
    return FromLane(e);
  return Pending{seq, req.mode(), logits_bytes};
}

absl::StatusOr<v1::LogitsResponse> LaneClient::Finish(const Pending& call, absl::Time deadline, bool copy_logits) {
  const lane::LaneRingConfig& cfg = ring_->config();
  const uint64_t seq = call.seq;
  const uint32_t slot = static_cast<uint32_t>(seq % ring_->depth());
  const lane::LaneCompletion* c = nullptr;
  if (lane::LaneError e = ring_->Wait(seq, MonotonicDeadline(deadline), &c); !e.ok()) return FromLane(e);
  v1::LogitsResponse resp;
  absl::Status status;
  if (c->code != 0) {
    status = absl::Status(static_cast<absl::StatusCode>(c->code),
                          std::string(c->message, std::min<uint32_t>(c->message_len, lane::kMessageBytes)));
  } else {
    resp.set_request_id(c->request_id);
    resp.set_rows(c->rows);
    resp.set_vocab_size(c->vocab_size);
    resp.set_logits_dtype(static_cast<v1::DType>(c->logits_dtype));
    v1::Timing* t = resp.mutable_timing();
    const uint32_t* tm = c->timing;
    t->set_queue_us(tm[0]); t->set_compute_us(tm[1]); t->set_batch_rows(tm[2]); t->set_validate_us(tm[3]);
    t->set_broadcast_us(tm[4]); t->set_h2d_us(tm[5]); t->set_gemv_us(tm[6]); t->set_epilogue_us(tm[7]);
    t->set_gather_us(tm[8]); t->set_d2h_us(tm[9]); t->set_combine_us(tm[10]); t->set_server_us(tm[11]);
    t->set_step_untimed((c->flags & lane::kDoneStepUntimed) != 0);
    if (call.mode == v1::FULL_LOGITS) {
      if (copy_logits) resp.set_logits(reinterpret_cast<const char*>(ring_->output_area(slot)), call.logits_bytes);
    } else {
      const size_t n = size_t{c->rows} * c->k;
      const bool probs = (c->flags & lane::kDoneProbs) != 0;
      if ((c->flags & lane::kDoneIds64) != 0) {
        status = absl::InternalError("the lane answered int64 ids, which this call did not ask for");
      } else if (lane::TokenAnswerBytes(n, 1, probs) >
                 ((c->flags & lane::kDoneInOutput) ? cfg.output_slot_bytes : ring_->inline_bytes())) {
        status = absl::InternalError("the lane's answer is larger than its slot");
      } else {
        const uint8_t* src = (c->flags & lane::kDoneInOutput)
                                 ? ring_->output_area(slot)
                                 : reinterpret_cast<const uint8_t*>(c) + lane::kCompletionHeaderBytes;
        resp.mutable_token_ids()->Resize(static_cast<int>(n), 0);
        std::memcpy(resp.mutable_token_ids()->mutable_data(), src, n * 4);
        resp.mutable_values()->Resize(static_cast<int>(n), 0.f);
        std::memcpy(resp.mutable_values()->mutable_data(), src + n * 4, n * 4);
        if (probs) {
          resp.mutable_probs()->Resize(static_cast<int>(n), 0.f);
          std::memcpy(resp.mutable_probs()->mutable_data(), src + n * 8, n * 4);
        }
      }
    }
  }
  ring_->Release(seq);
  if (!status.ok()) return status;
  return resp;
}

}  // namespace drafthead::client
