// A request split across batches (BatcherOptions::split_requests): a batch that would otherwise
// end short of max_rows takes the first rows of the request that does not fit, and the rest waits
// at its caller's head. Rows are batch-invariant (every backend's answer for a row is independent
// of its batch mates), so the parts compute exactly the rows the whole would have.
//
// SplitRequest holds the answered parts' payload rows until the last one, then answers the request
// once, from those rows laid out as a batch of the request alone (row0 0), through the request's
// own completion callback: the API edges that build the answer see no difference. The first
// failed or dropped part answers the request with its status; later parts are then ignored.
//
// Threads: parts may be answered on any thread (the completer, its helpers, Take for drops, Close's
// caller), in any order; one mutex. Ownership: shared by the parts' callbacks (PartDone).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/sched/prepared_request.h"

namespace drafthead {

class SplitRequest : public std::enable_shared_from_this<SplitRequest> {
 public:
  using Done = std::function<void(const absl::Status&, const BatchRowsResult*)>;
  // `done`: the request's completion (BatchItem::done), called exactly once; `rows`: the request's.
  SplitRequest(Done done, uint32_t rows) : done_(std::move(done)), rows_(rows) {}

  // The completion of the part of rows [begin, begin + count): OK with that part's result (its
  // rows at result->row0 of its batch) or its failure.
  Done PartDone(uint32_t begin, uint32_t count);

 private:
  void OnPart(uint32_t begin, uint32_t count, const absl::Status& s, const BatchRowsResult* result);

  absl::Mutex mu_;
  Done done_ ABSL_GUARDED_BY(mu_);
  const uint32_t rows_;
  uint32_t answered_ ABSL_GUARDED_BY(mu_) = 0;  // rows held
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // done_ called (or being called)
  // Every rank's block of rows_ payload rows (row_bytes_ each), filled part by part under mu_;
  // once finished_, only the thread that set it reads them (and writes layout_).
  std::vector<uint8_t> held_;
  size_t row_bytes_ = 0;
  PayloadLayout layout_;  // rows_ rows of row_bytes_
};

}  // namespace drafthead
