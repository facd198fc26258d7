// The load tester's third and fourth ways in (--shared-memory=system|cuda): the request pool's
// hidden rows moved into a registered region, and FULL_LOGITS answers written into one, so a run
// compares bytes, POSIX and CUDA IPC under the same report. Each pool request gets its own hidden
// and logits slices (requests in flight that share a pool entry overwrite the same logits slice:
// harmless for a measurement).
//
// Ownership: the returned object owns the regions (and, for cuda, the device buffer); keep it until
// the runs are over. Failure: the server's codes (FAILED_PRECONDITION without --shared-memory).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/drafthead_client.h"

namespace drafthead::client {

class LoadRegions {
 public:
  virtual ~LoadRegions() = default;
};

// Rewrites each serialized request of `pool` to read its hidden rows from a region (and write its
// FULL_LOGITS into one); `kind` is "system" or "cuda"; vocab_size and the requests' shapes size
// the slices.
absl::StatusOr<std::unique_ptr<LoadRegions>> MoveToRegions(DraftHeadClient& client,
                                                           const std::string& kind,
                                                           uint32_t vocab_size,
                                                           std::vector<std::string>* pool);

}  // namespace drafthead::client
