#include "server/comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/host_port.h"
#include "server/comm/socket_io.h"

namespace drafthead {
namespace {

using Clock = KvClient::Clock;
using Deadline = KvClient::Deadline;

constexpr uint32_t kMaxFrame = 64u << 20;
constexpr char kOps[] = "SGKVN";  // every op a frame may carry

constexpr char kWho[] = "rendezvous";

absl::Status Errno(const std::string& what) { return sockio::Errno(kWho, what); }
absl::Status WaitReady(int fd, short events, Deadline deadline, const char* what) {
  return sockio::WaitReady(fd, events, deadline, kWho, what);
}
absl::Status WriteAll(int fd, const void* p, size_t n, Deadline deadline) {
  return sockio::WriteAll(fd, p, n, deadline, kWho);
}
absl::Status ReadAll(int fd, void* p, size_t n, Deadline deadline) {
  return sockio::ReadAll(fd, p, n, deadline, kWho);
}

// Frame: op (1 byte), then two length-prefixed strings.
absl::Status WriteFrame(int fd, char op, const std::string& a, const std::string& b, Deadline deadline) {
  std::string f;
  f.push_back(op);
  for (const std::string* s : {&a, &b}) {
    uint32_t n = htonl(static_cast<uint32_t>(s->size()));
    f.append(reinterpret_cast<const char*>(&n), 4);
    f.append(*s);
  }
  return WriteAll(fd, f.data(), f.size(), deadline);
}

// A frame's rest after its op byte, which must arrive whole by the deadline. A frame that is not
// one (unknown op, oversized length) is INTERNAL at once.
absl::Status ReadFrameRest(int fd, char op, std::string* a, std::string* b, Deadline deadline) {
  if (op == '\0' || std::strchr(kOps, op) == nullptr)
    return absl::InternalError(absl::StrCat("rendezvous: garbage frame (op byte ", static_cast<int>(op), ")"));
  for (std::string* s : {a, b}) {
    uint32_t n;
    if (absl::Status st = ReadAll(fd, &n, 4, deadline); !st.ok()) return st;
    n = ntohl(n);
    if (n > kMaxFrame)
      return absl::InternalError(absl::StrCat("rendezvous: garbage frame (length ", n, " > ", kMaxFrame, ")"));
    s->resize(n);
    if (n > 0) {
      if (absl::Status st = ReadAll(fd, s->data(), n, deadline); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

// Connects one address without blocking past the deadline (a black-holed SYN otherwise waits
// for the kernel's retries, minutes). Returns the fd or -1 with errno set.
int ConnectBefore(const addrinfo& a, Deadline deadline) {
  int fd = ::socket(a.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::connect(fd, a.ai_addr, a.ai_addrlen) != 0) {
    if (errno != EINPROGRESS || !WaitReady(fd, POLLOUT, deadline, "connect").ok()) {
      const int e = errno == EINPROGRESS ? ETIMEDOUT : errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ::close(fd);
      errno = err;
      return -1;
    }
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvServer>> KvServer::Start(const std::string& host, int port,
                                                           std::chrono::milliseconds io_timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res); rc != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous: cannot resolve ", host, ": ", gai_strerror(rc)));
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return Errno("socket");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
    absl::Status s = Errno(absl::StrCat("cannot listen on ", host, ":", port));
    freeaddrinfo(res);
    ::close(fd);
    return s;
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  std::unique_ptr<KvServer> s(new KvServer());
  s->listen_fd_ = fd;
  s->io_timeout_ = io_timeout;
  s->port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  s->accept_thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

KvServer::~KvServer() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  std::vector<std::thread> conns;  // joined outside the lock: Serve takes it
  {
    absl::MutexLock l(&mu_);
    for (int fd : conn_fds_) ::shutdown(fd, SHUT_RDWR);
    conns.swap(conns_);
  }
  for (auto& t : conns) t.join();
}

void KvServer::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    absl::MutexLock l(&mu_);
    conn_fds_.push_back(fd);
    conns_.emplace_back([this, fd] { Serve(fd); });
  }
}

void KvServer::Serve(int fd) {
  char op;
  std::string key, value;
  // Between frames a connection may idle for the whole join (the destructor's shutdown ends that
  // wait); a frame once begun, and each reply, must complete within io_timeout_ or the
  // connection is dropped (a stalled or non-reading peer costs one thread for that long only).
  while (!stop_) {
    absl::Status st = ReadAll(fd, &op, 1, Deadline::max());
    if (st.ok()) st = ReadFrameRest(fd, op, &key, &value, Clock::now() + io_timeout_);
    if (!st.ok()) {
      if (st.code() != absl::StatusCode::kUnavailable)  // EOF is a peer's normal goodbye
        Log(LogLevel::kWarn, "rendezvous_peer_dropped", "reason", st.message());
      break;
    }
    char reply_op;
    std::string reply;
    if (op == 'S') {
      absl::MutexLock l(&mu_);
      kv_[key] = value;
      reply_op = 'K';
    } else if (op == 'G') {
      absl::MutexLock l(&mu_);
      auto it = kv_.find(key);
      reply_op = it != kv_.end() ? 'V' : 'N';
      if (it != kv_.end()) reply = it->second;
    } else {
      Log(LogLevel::kWarn, "rendezvous_peer_dropped", "reason", "a reply op sent as a request");
      break;
    }
    st = WriteFrame(fd, reply_op, "", reply, Clock::now() + io_timeout_);
    if (!st.ok()) {
      Log(LogLevel::kWarn, "rendezvous_peer_dropped", "reason", st.message());
      break;
    }
  }
  ::close(fd);
}

absl::StatusOr<std::unique_ptr<KvClient>> KvClient::Connect(const std::string& hostport,
                                                            std::chrono::milliseconds timeout) {
  std::string host;
  int port;
  if (absl::Status s = SplitHostPort(hostport, &host, &port); !s.ok()) return s;
  const auto deadline = Clock::now() + timeout;
  std::string last = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string ps = std::to_string(port);
    int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
    if (rc == 0) {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = ConnectBefore(*a, deadline);
        if (fd >= 0) {
          freeaddrinfo(res);
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return std::unique_ptr<KvClient>(new KvClient(fd, hostport, timeout));
        }
        last = std::strerror(errno);
      }
      freeaddrinfo(res);
    } else {
      last = gai_strerror(rc);
    }
    if (Clock::now() >= deadline)
      return absl::UnavailableError(
          absl::StrCat("cannot reach the leader's rendezvous at ", hostport, ": ", last));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

KvClient::~KvClient() { ::close(fd_); }

absl::StatusOr<std::string> KvClient::Roundtrip(char op, const std::string& key,
                                                const std::string& value, char* reply_op,
                                                Deadline deadline) {
  std::string a, b;
  absl::Status s = WriteFrame(fd_, op, key, value, deadline);
  if (s.ok()) s = ReadAll(fd_, reply_op, 1, deadline);
  if (s.ok()) s = ReadFrameRest(fd_, *reply_op, &a, &b, deadline);
  if (s.ok() && *reply_op != 'K' && *reply_op != 'V' && *reply_op != 'N')
    s = absl::InternalError(absl::StrCat("rendezvous: a request op (", std::string(1, *reply_op), ") sent as a reply"));
  if (!s.ok()) {
    // The connection is now mid-frame or dead: no later call may use it.
    ::shutdown(fd_, SHUT_RDWR);
    return absl::Status(s.code(), absl::StrCat("leader's rendezvous at ", peer_, ": ", s.message()));
  }
  return b;
}

absl::Status KvClient::Set(const std::string& key, const std::string& value) {
  char op;
  auto r = Roundtrip('S', key, value, &op, Clock::now() + io_timeout_);
  if (!r.ok()) return r.status();
  return op == 'K' ? absl::OkStatus() : absl::InternalError("rendezvous: bad reply to set");
}

absl::StatusOr<std::string> KvClient::Get(const std::string& key,
                                          std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  auto not_there = [&](absl::string_view why) {
    return absl::DeadlineExceededError(absl::StrCat("rendezvous: key '", key, "' did not appear at ",
                                                    peer_, " within ", timeout.count(), " ms (", why, ")"));
  };
  for (;;) {
    char op;
    auto r = Roundtrip('G', key, "", &op, deadline);
    if (r.status().code() == absl::StatusCode::kDeadlineExceeded) return not_there(r.status().message());
    if (!r.ok()) return r.status();
    if (op == 'V') return r;
    if (Clock::now() >= deadline) return not_there("a rank did not join");
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace drafthead
