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

namespace drafthead {
namespace {

constexpr uint32_t kMaxFrame = 64u << 20;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Frame: op (1 byte), then two length-prefixed strings.
bool WriteFrame(int fd, char op, const std::string& a, const std::string& b) {
  std::string f;
  f.push_back(op);
  for (const std::string* s : {&a, &b}) {
    uint32_t n = htonl(static_cast<uint32_t>(s->size()));
    f.append(reinterpret_cast<const char*>(&n), 4);
    f.append(*s);
  }
  return WriteAll(fd, f.data(), f.size());
}

bool ReadFrame(int fd, char* op, std::string* a, std::string* b) {
  if (!ReadAll(fd, op, 1)) return false;
  for (std::string* s : {a, b}) {
    uint32_t n;
    if (!ReadAll(fd, &n, 4)) return false;
    n = ntohl(n);
    if (n > kMaxFrame) return false;
    s->resize(n);
    if (n > 0 && !ReadAll(fd, s->data(), n)) return false;
  }
  return true;
}

}  // namespace

absl::Status SplitHostPort(const std::string& hostport, std::string* host, int* port) {
  std::string h, p;
  if (!hostport.empty() && hostport[0] == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string::npos || close + 1 >= hostport.size() || hostport[close + 1] != ':')
      return absl::InvalidArgumentError(absl::StrCat("bad address '", hostport, "': want [v6]:port"));
    h = hostport.substr(1, close - 1);
    p = hostport.substr(close + 2);
  } else {
    const size_t colon = hostport.rfind(':');
    if (colon == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("bad address '", hostport, "': want HOST:PORT"));
    h = hostport.substr(0, colon);
    p = hostport.substr(colon + 1);
  }
  int v;
  if (!absl::SimpleAtoi(p, &v) || v < 0 || v > 65535)
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", hostport, "'"));
  *host = h.empty() ? "0.0.0.0" : h;
  *port = v;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvServer>> KvServer::Start(const std::string& host, int port) {
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
    return Errno("rendezvous: socket");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
    absl::Status s = Errno(absl::StrCat("rendezvous: cannot listen on ", host, ":", port));
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
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock l(&mu_);
    conn_fds_.push_back(fd);
    conns_.emplace_back([this, fd] { Serve(fd); });
  }
}

void KvServer::Serve(int fd) {
  char op;
  std::string key, value;
  while (!stop_ && ReadFrame(fd, &op, &key, &value)) {
    bool ok;
    if (op == 'S') {
      {
        absl::MutexLock l(&mu_);
        kv_[key] = value;
      }
      ok = WriteFrame(fd, 'K', "", "");
    } else if (op == 'G') {
      std::string v;
      bool found;
      {
        absl::MutexLock l(&mu_);
        auto it = kv_.find(key);
        found = it != kv_.end();
        if (found) v = it->second;
      }
      ok = WriteFrame(fd, found ? 'V' : 'N', "", v);
    } else {
      ok = false;
    }
    if (!ok) break;
  }
  ::close(fd);
}

absl::StatusOr<std::unique_ptr<KvClient>> KvClient::Connect(const std::string& hostport,
                                                            std::chrono::milliseconds timeout) {
  std::string host;
  int port;
  if (absl::Status s = SplitHostPort(hostport, &host, &port); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
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
        int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          freeaddrinfo(res);
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return std::unique_ptr<KvClient>(new KvClient(fd, hostport));
        }
        last = std::strerror(errno);
        ::close(fd);
      }
      freeaddrinfo(res);
    } else {
      last = gai_strerror(rc);
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return absl::UnavailableError(
          absl::StrCat("cannot reach the leader's rendezvous at ", hostport, ": ", last));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

KvClient::~KvClient() { ::close(fd_); }

absl::StatusOr<std::string> KvClient::Roundtrip(char op, const std::string& key,
                                                const std::string& value, char* reply_op) {
  std::string a, b;
  if (!WriteFrame(fd_, op, key, value) || !ReadFrame(fd_, reply_op, &a, &b))
    return absl::UnavailableError(absl::StrCat("lost the leader's rendezvous at ", peer_));
  return b;
}

absl::Status KvClient::Set(const std::string& key, const std::string& value) {
  char op;
  auto r = Roundtrip('S', key, value, &op);
  if (!r.ok()) return r.status();
  return op == 'K' ? absl::OkStatus() : absl::InternalError("rendezvous: bad reply to set");
}

absl::StatusOr<std::string> KvClient::Get(const std::string& key,
                                          std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    char op;
    auto r = Roundtrip('G', key, "", &op);
    if (!r.ok()) return r.status();
    if (op == 'V') return r;
    if (std::chrono::steady_clock::now() >= deadline)
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous: key '", key, "' did not appear at ", peer_, " within ", timeout.count(),
          " ms (a rank did not join)"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace drafthead
