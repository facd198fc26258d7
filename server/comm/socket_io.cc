#include "server/comm/socket_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace drafthead::sockio {

absl::Status Errno(absl::string_view who, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(who, ": ", what, ": ", std::strerror(errno)));
}

absl::Status WaitReady(int fd, short events, Deadline deadline, absl::string_view who, absl::string_view what) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError(absl::StrCat(who, ": ", what, " timed out"));
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return Errno(who, what);
  }
}

absl::Status WriteAllV(int fd, iovec* iov, int iovcnt, Deadline deadline, absl::string_view who) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov, --iovcnt;
      continue;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(iovcnt);
    const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitReady(fd, POLLOUT, deadline, who, "send (the peer stopped reading)"); !s.ok()) return s;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Errno(who, "send");
    size_t done = static_cast<size_t>(w);
    while (iovcnt > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      ++iov, --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + done;
      iov->iov_len -= done;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* p, size_t n, Deadline deadline, absl::string_view who) {
  iovec v{const_cast<void*>(p), n};
  return WriteAllV(fd, &v, 1, deadline, who);
}

absl::Status ReadAll(int fd, void* p, size_t n, Deadline deadline, absl::string_view who) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitReady(fd, POLLIN, deadline, who, "receive (the peer said nothing)"); !s.ok()) return s;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return absl::UnavailableError(absl::StrCat(who, ": connection closed by the peer"));
    if (r < 0) return Errno(who, "recv");
    c += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace drafthead::sockio
