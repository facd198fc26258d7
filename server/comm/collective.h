// The collectives a rank group needs, behind one small interface (cf. leveldb's Env): rank 0
// broadcasts each batch and gathers every rank's result. Implementations: Gloo over TCP
// (gloo_collective.cc), NCCL (nccl_collective.cc, CUDA builds) and an in-process one for unit tests
// (inproc_collective.h).
//
// Threads: one thread per rank calls into a Collective; calls are not thread-safe.
// Device buffers (MemorySpace::kDevice, collectives that AcceptsDeviceMemory): the collective
// works on a stream of its own that is not ordered after any other stream, the legacy default
// stream included. So before a call, every write to a device buffer it reads must be complete, not
// just enqueued (synchronize the producing stream; note that cudaMemcpy from pageable host memory
// may return before its DMA lands), and no other work may touch its buffers until the call
// returns. On return the collective's own work on them is complete (it waits for its stream).
// Failure: every call takes a timeout and returns a non-OK status instead of blocking forever.
// One code for a broken group, whatever broke it (a lost peer, a timeout, a library or device
// error), in every implementation: UNAVAILABLE (callers retry that code only), the cause in the
// message (GroupFailure). INVALID_ARGUMENT only for a caller's misuse found before any exchange (a
// device buffer given to a host-only collective). After a failure the collective is broken: later
// calls answer UNAVAILABLE; the destructor is always valid.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/group/memory_space.h"

namespace drafthead {

// The failure of a group call as every Collective reports it: UNAVAILABLE, the original code kept
// in the message ("deadline exceeded: ..."). OK stays OK.
inline absl::Status GroupFailure(const absl::Status& s) {
  if (s.ok() || s.code() == absl::StatusCode::kUnavailable) return s;
  return absl::UnavailableError(absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message()));
}

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl", "inproc"
  // How the bytes travel, for logs: "tcp" or "unix" (Gloo), else name().
  virtual std::string transport() const { return name(); }

  // Whether buffers may live in device memory (NCCL) or must be host memory (Gloo, in-process).
  virtual bool AcceptsDeviceMemory() const { return false; }

  // Root 0's `bytes` at `data` are copied into every other rank's `data`. All ranks call with the
  // same `bytes`.
  virtual absl::Status Broadcast(void* data, size_t bytes, MemorySpace space,
                                 std::chrono::milliseconds timeout) = 0;

  // Every rank contributes `bytes` from `send`; on rank 0, `recv` receives world() * bytes, rank r's
  // block at offset r * bytes. `recv` is ignored on the other ranks.
  virtual absl::Status Gather(const void* send, size_t bytes, void* recv, MemorySpace space,
                              std::chrono::milliseconds timeout) = 0;

  // Optional, rank 0: announces the next call's Gather(_, bytes, recv, space, _) before this
  // rank's own block is ready, so the peers' blocks can travel while it computes (Gloo: the
  // receives are posted, and a peer's send goes out without waiting for them). The next collective
  // call must be that Gather; `recv` must stay untouched until it returns. Default: nothing.
  virtual absl::Status PostGather(void* recv, size_t bytes, MemorySpace space) {
    (void)recv, (void)bytes, (void)space;
    return absl::OkStatus();
  }
};

}  // namespace drafthead
