#include "server/api/response.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/shard_reduce.h"
#include "kernels/numeric.h"

namespace drafthead {
namespace {

// The answer's fields other than its values; FULL_LOGITS: returns the bytes of a logit (else 0).
size_t SetAnswerFields(const PreparedRequest& req, const ShardGeometry& geo, v1::LogitsResponse* resp) {
  resp->set_request_id(req.request_id);
  resp->set_rows(req.rows);
  resp->set_vocab_size(static_cast<uint32_t>(geo.vocab_size));
  if (req.task.mode != RowMode::kFullLogits) {
    resp->set_logits_dtype(v1::FP32);
    return 0;
  }
  const bool bf16 = req.task.dtype == OutDType::kBf16;
  resp->set_logits_dtype(bf16 ? v1::BF16 : v1::FP32);
  return bf16 ? 2 : 4;
}

}  // namespace

void CombineResponse(const PreparedRequest& req, uint32_t row0, const PayloadLayout& layout,
                     const uint8_t* gathered, size_t per_rank_bytes, const ShardGeometry& geo,
                     v1::LogitsResponse* resp, uint8_t* logits_out) {
  const RowTask& t = req.task;
  const int tp = geo.tp;
  const int64_t S = geo.shard_rows, V = geo.vocab_size;
  const size_t es = SetAnswerFields(req, geo, resp);
  if (t.mode == RowMode::kFullLogits) {
    uint8_t* out = logits_out;
    if (out == nullptr) {
      std::string* bytes = resp->mutable_logits();
      bytes->resize(static_cast<size_t>(req.rows) * V * es);
      out = reinterpret_cast<uint8_t*>(bytes->data());
    }
    for (uint32_t i = 0; i < req.rows; ++i) {
      const size_t off = layout.row_offset[row0 + i];
      for (int r = 0; r < tp; ++r) {
        const int64_t cols = geo.ForRank(r).valid_cols();
        if (cols <= 0) continue;
        std::memcpy(out + (static_cast<size_t>(i) * V + r * S) * es,
                    gathered + r * per_rank_bytes + off, cols * es);
      }
    }
    return;
  }
  const uint32_t k = t.k;
  std::vector<const Candidate*> lists(tp);
  std::vector<const SoftmaxPartial*> parts(tp);
  std::vector<Candidate> best(k);
  for (uint32_t i = 0; i < req.rows; ++i) {
    const size_t off = layout.row_offset[row0 + i];
    for (int r = 0; r < tp; ++r) {
      const uint8_t* blk = gathered + r * per_rank_bytes + off;
      parts[r] = reinterpret_cast<const SoftmaxPartial*>(blk);
      lists[r] = reinterpret_cast<const Candidate*>(blk + sizeof(SoftmaxPartial));
    }
    cpu::MergeCandidates(lists.data(), tp, k, k, best.data());
    cpu::SoftmaxTotal total{};
    if (t.mode == RowMode::kTopK && t.want_probs) total = cpu::CombineSoftmax(parts.data(), tp);
    for (uint32_t j = 0; j < k; ++j) {
      resp->add_token_ids(best[j].id);
      resp->add_values(best[j].logit);
      if (t.mode == RowMode::kTopK && t.want_probs)
        resp->add_probs(cpu::SoftmaxProb(total, best[j].logit, t.temperature));
    }
  }
}

namespace {

void SetTiming(const BatchRowsResult& result, v1::LogitsResponse* resp) {
  auto* timing = resp->mutable_timing();
  timing->set_queue_us(result.queue_us);
  timing->set_compute_us(result.compute_us);
  timing->set_batch_rows(result.batch_rows);
  const StageTimes& st = result.stages;
  timing->set_broadcast_us(st.broadcast_us);
  timing->set_h2d_us(st.h2d_us);
  timing->set_gemv_us(st.gemv_us);
  timing->set_epilogue_us(st.epilogue_us);
  timing->set_gather_us(st.gather_us);
  timing->set_d2h_us(st.d2h_us);
  timing->set_step_untimed(st.step_untimed);
}

}  // namespace

void BuildResponse(const PreparedRequest& req, const BatchRowsResult& result,
                   v1::LogitsResponse* resp) {
  CombineResponse(req, result.row0, *result.layout, result.gathered, result.per_rank_bytes,
                  *result.geometry, resp);
  SetTiming(result, resp);
}

absl::Status BuildResponse(const PreparedRequest& req, const BatchRowsResult& result,
                           const LogitsDestination& dest, v1::LogitsResponse* resp) {
  if (!dest.region) {
    BuildResponse(req, result, resp);
    return absl::OkStatus();
  }
  if (result.logits_on_device) {  // the backend wrote them there (BatchItem::device_logits)
    SetAnswerFields(req, *result.geometry, resp);
    SetTiming(result, resp);
    return absl::OkStatus();
  }
  // The access holds the region mapped while the rows are written; an unregister waits for it.
  auto access = dest.region.Access(dest.offset, dest.byte_size, "logits_region");
  if (!access.ok()) return access.status();
  uint8_t* host = access->host_data();
  if (host != nullptr) {
    CombineResponse(req, result.row0, *result.layout, result.gathered, result.per_rank_bytes,
                    *result.geometry, resp, host);
  } else {
    // Device memory: each rank's block of the rows in one strided copy straight from the gathered
    // payload (pinned at tp = 1), not combined in a staging buffer first and copied again.
    const ShardGeometry& geo = *result.geometry;
    const size_t es = SetAnswerFields(req, geo, resp);
    const PayloadLayout& layout = *result.layout;
    const size_t first = layout.row_offset[result.row0];
    const size_t pitch = layout.row_offset[result.row0 + 1] - first;  // one task: equal rows
    for (int r = 0; r < geo.tp; ++r) {
      const int64_t cols = geo.ForRank(r).valid_cols();
      if (cols <= 0) continue;
      DH_RETURN_IF_ERROR(access->WriteRows(static_cast<uint64_t>(r) * geo.shard_rows * es, geo.vocab_size * es,
                                           result.gathered + r * result.per_rank_bytes + first, pitch,
                                           static_cast<uint64_t>(cols) * es, req.rows));
    }
  }
  SetTiming(result, resp);
  return absl::OkStatus();
}

}  // namespace drafthead
