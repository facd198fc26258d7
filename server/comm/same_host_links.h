// Rank 0's link to each worker on its host, one Unix-domain stream socket each: the Gloo
// collective's data path when every rank shares rank 0's host (a launcher group, one pod).
// Why: over Gloo's TCP pairs a message wakes two threads on the receiver (Gloo's device loop reads
// the socket, then wakes the caller); here the caller waits in poll() on its own socket and reads,
// one wake-up per message and no loop thread (issue 11: tp = 2 on the CPU).
//
// Set-up agrees through the group's key-value store, so every rank makes the same choice: links
// when every rank asks for them and every worker reached rank 0's abstract socket (the same network
// namespace, hence the same kernel), otherwise none, and the caller keeps Gloo's TCP path.
// Threads: one thread per rank calls; calls are not thread-safe.
// Failure: every call has a deadline; a closed peer, a timeout or a frame out of step is a broken
// group, UNAVAILABLE as collective.h promises, the cause in the message; later calls answer
// UNAVAILABLE at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/comm/rendezvous.h"
#include "server/comm/socket_io.h"

namespace drafthead {

class SameHostLinks {
 public:
  // Every rank of the group calls this once, with the group's store (used only during the call).
  // `want`: this rank's wish (--same-host-links). nullptr when the group does not use links; an
  // error only when the store fails (the group cannot form anyway).
  static absl::StatusOr<std::unique_ptr<SameHostLinks>> Establish(int rank, int world, bool want, KvClient& kv,
                                                                  std::chrono::milliseconds timeout);
  ~SameHostLinks();
  SameHostLinks(const SameHostLinks&) = delete;
  SameHostLinks& operator=(const SameHostLinks&) = delete;

  // Collective.h's Broadcast and Gather, host memory, same arguments on every rank.
  absl::Status Broadcast(void* data, size_t bytes, sockio::Deadline deadline);
  absl::Status Gather(const void* send, size_t bytes, void* recv, sockio::Deadline deadline);

 private:
  SameHostLinks(int rank, int world, std::vector<int> fds) : rank_(rank), world_(world), fds_(std::move(fds)) {}
  absl::Status Send(int peer, uint32_t op, const void* data, size_t bytes, sockio::Deadline deadline);
  absl::Status Receive(int peer, uint32_t op, void* data, size_t bytes, sockio::Deadline deadline);
  absl::Status Fail(int peer, const absl::Status& s);

  const int rank_, world_;
  std::vector<int> fds_;  // rank 0: fds_[r] is worker r's socket (fds_[0] unused); a worker: fds_[0]
  uint64_t seq_ = 0;      // calls so far that exchanged bytes; every frame carries it
  bool broken_ = false;
};

}  // namespace drafthead
