// Collective over NCCL (CUDA builds only): one GPU per rank, buffers in device memory or host
// memory (host buffers are staged through device buffers). The communicator is created
// non-blocking (ncclConfig_t.blocking = 0) and every operation is polled against its timeout:
// ncclCommGetAsyncError for the communicator, cudaStreamQuery for completion. On an error or a
// timeout the communicator is aborted (ncclCommAbort) and the call returns UNAVAILABLE (a NCCL or
// peer failure) or DEADLINE_EXCEEDED; afterwards the collective is broken
// (server/comm/collective.h).
//
// Threads: one thread per rank (the engine's). The NCCL unique id goes from rank 0 to the others
// through the leader's key-value store under "nccl/uid".
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "server/comm/collective.h"
#include "server/comm/rendezvous.h"

namespace drafthead {

// device: the CUDA device this rank uses, the very number its compute backend was given (the
// server decides it once: server/app/config.h ChooseDevice); required (>= 0).
absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(int rank, int world, int device,
                                                              KvClient& store,
                                                              std::chrono::milliseconds timeout);

}  // namespace drafthead
