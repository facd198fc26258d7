// Deadline-bounded I/O on non-blocking stream sockets, shared by the rendezvous store and the
// same-host links: no call here blocks past its deadline (a silent peer, or one that stops reading,
// is waited out only that long).
// Codes: DEADLINE_EXCEEDED when the deadline passes; UNAVAILABLE for a closed peer or a socket
// error. Every message starts with `who` ("rendezvous", "same-host link").
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace drafthead::sockio {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// UNAVAILABLE "<who>: <what>: <strerror(errno)>".
absl::Status Errno(absl::string_view who, absl::string_view what);

// Waits until `fd` is ready for `events` (or has an error or hang-up, which the next call on it
// reports), or the deadline passes: DEADLINE_EXCEEDED "<who>: <what> timed out".
absl::Status WaitReady(int fd, short events, Deadline deadline, absl::string_view who, absl::string_view what);

// Sends every byte of the buffers (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE).
// `iov` is consumed (advanced past what was sent).
absl::Status WriteAllV(int fd, iovec* iov, int iovcnt, Deadline deadline, absl::string_view who);
absl::Status WriteAll(int fd, const void* p, size_t n, Deadline deadline, absl::string_view who);

// Receives exactly n bytes. Tries the socket first and waits only when it is empty, so a message
// already there costs one system call.
absl::Status ReadAll(int fd, void* p, size_t n, Deadline deadline, absl::string_view who);

}  // namespace drafthead::sockio
