#include "server/sched/split_request.h"

#include <cstring>

namespace drafthead {

SplitRequest::Done SplitRequest::PartDone(uint32_t begin, uint32_t count) {
  return [self = shared_from_this(), begin, count](const absl::Status& s, const BatchRowsResult* r) {
    self->OnPart(begin, count, s, r);
  };
}

void SplitRequest::OnPart(uint32_t begin, uint32_t count, const absl::Status& s,
                          const BatchRowsResult* result) {
  Done done;
  {
    absl::MutexLock l(&mu_);
    if (finished_) return;
    if (!s.ok() || result == nullptr) {
      finished_ = true;
      done = std::move(done_);
    } else {
      const PayloadLayout& from = *result->layout;
      const size_t row_bytes = from.row_offset[result->row0 + 1] - from.row_offset[result->row0];
      const size_t world = static_cast<size_t>(result->geometry->tp);
      if (held_.empty()) {
        row_bytes_ = row_bytes;
        held_.resize(world * rows_ * row_bytes);
      }
      // One task for every row of the request: equal rows in every batch's layout.
      for (size_t r = 0; r < world; ++r)
        std::memcpy(held_.data() + (r * rows_ + begin) * row_bytes_,
                    result->gathered + r * result->per_rank_bytes + from.row_offset[result->row0],
                    static_cast<size_t>(count) * row_bytes_);
      answered_ += count;
      if (answered_ < rows_) return;
      finished_ = true;
      done = std::move(done_);
    }
  }
  if (!s.ok() || result == nullptr) {
    done(s.ok() ? absl::InternalError("a split request's part finished without a result") : s, nullptr);
    return;
  }
  // Every part is in: the request as a batch of its own rows (the last part's timings).
  layout_.row_offset.resize(rows_ + 1);
  for (uint32_t i = 0; i <= rows_; ++i) layout_.row_offset[i] = i * row_bytes_;
  BatchRowsResult whole = *result;
  whole.layout = &layout_;
  whole.gathered = held_.data();
  whole.per_rank_bytes = static_cast<size_t>(rows_) * row_bytes_;
  whole.row0 = 0;
  whole.logits_on_device = false;  // split only without a device destination (Batcher)
  done(absl::OkStatus(), &whole);
}

}  // namespace drafthead
