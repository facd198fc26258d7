#include "server/comm/same_host_links.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/comm/collective.h"

namespace drafthead {
namespace {

constexpr char kWho[] = "same-host link";
constexpr uint32_t kMagic = 0x4c534844;  // "DHSL"
constexpr uint32_t kOpHello = 1, kOpBroadcast = 2, kOpGather = 3;

struct Frame {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;    // the hello's: the nonce rank 0 published
  uint64_t bytes;  // the hello's: the sender's rank
};

// The abstract-namespace address of rank 0's listening socket for `name` (no file to clean up).
socklen_t AbstractAddress(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  const std::string path = "drafthead-links-" + name;
  std::memcpy(a->sun_path + 1, path.data(), std::min(path.size(), sizeof(a->sun_path) - 2));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
}

int UnixSocket() {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    const int buf = 4 << 20;  // a batch or a payload in one write where the system allows it
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  }
  return fd;
}

// Closes its descriptor when it goes (-1: none).
struct OwnedFd {
  explicit OwnedFd(int f = -1) : fd(f) {}
  OwnedFd(const OwnedFd&) = delete;  // one owner: a copy would close twice
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

std::string KeyOk(int rank) { return absl::StrCat("links/ok/", rank); }

}  // namespace

absl::StatusOr<std::unique_ptr<SameHostLinks>> SameHostLinks::Establish(int rank, int world, bool want, KvClient& kv,
                                                                        std::chrono::milliseconds timeout) {
  if (world < 2) return nullptr;
  const sockio::Deadline deadline = sockio::Clock::now() + timeout;
  // Owns every socket from here on: a path that gives up drops it, and its destructor closes them.
  std::unique_ptr<SameHostLinks> links(new SameHostLinks(rank, world, std::vector<int>(rank == 0 ? world : 1, -1)));
  std::vector<int>& fds = links->fds_;
  if (rank == 0) {
    // Listen on a fresh random name, publish it, learn whether every worker reached it.
    std::random_device rd;
    const uint64_t nonce = (uint64_t{rd()} << 32) | rd();
    const std::string name = absl::StrFormat("%016x", nonce);
    OwnedFd listening;
    if (want) {
      listening.fd = UnixSocket();
      sockaddr_un a;
      const socklen_t len = AbstractAddress(name, &a);
      if (listening.fd >= 0 && (::bind(listening.fd, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
                                ::listen(listening.fd, world) != 0)) {
        ::close(listening.fd);
        listening.fd = -1;
      }
    }
    DH_RETURN_IF_ERROR(kv.Set("links/addr", listening.fd >= 0 ? name : ""));
    bool all = listening.fd >= 0;
    for (int r = 1; r < world; ++r) {
      absl::StatusOr<std::string> ok = kv.Get(KeyOk(r), timeout);
      if (!ok.ok()) return ok.status();
      all = all && *ok == "1";
    }
    // Every worker connected and wrote its hello before saying so: accept and identify them.
    for (int n = 1; all && n < world; ++n) {
      all = sockio::WaitReady(listening.fd, POLLIN, deadline, kWho, "accept").ok();
      OwnedFd peer{all ? ::accept4(listening.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC) : -1};
      Frame h{};
      all = peer.fd >= 0 && sockio::ReadAll(peer.fd, &h, sizeof(h), deadline, kWho).ok() && h.magic == kMagic &&
            h.op == kOpHello && h.seq == nonce && h.bytes >= 1 && h.bytes < static_cast<uint64_t>(world) &&
            fds[h.bytes] < 0;
      if (all) std::swap(fds[h.bytes], peer.fd);
    }
    DH_RETURN_IF_ERROR(kv.Set("links/use", all ? "1" : "0"));
    return all ? std::move(links) : nullptr;
  }
  // A worker: connect to rank 0's name if it has one, say whether that worked, follow rank 0.
  absl::StatusOr<std::string> name = kv.Get("links/addr", timeout);
  if (!name.ok()) return name.status();
  uint64_t nonce = 0;
  bool ok = want && !name->empty() && absl::SimpleHexAtoi(*name, &nonce);
  if (ok) {
    fds[0] = UnixSocket();
    sockaddr_un a;
    const socklen_t len = AbstractAddress(*name, &a);
    // Rank 0's backlog holds every worker, so a connect completes at once or fails (EAGAIN: full).
    ok = fds[0] >= 0 && ::connect(fds[0], reinterpret_cast<sockaddr*>(&a), len) == 0;
    const Frame hello{kMagic, kOpHello, nonce, static_cast<uint64_t>(rank)};
    ok = ok && sockio::WriteAll(fds[0], &hello, sizeof(hello), deadline, kWho).ok();
  }
  DH_RETURN_IF_ERROR(kv.Set(KeyOk(rank), ok ? "1" : "0"));
  absl::StatusOr<std::string> use = kv.Get("links/use", timeout);
  if (!use.ok()) return use.status();
  return ok && *use == "1" ? std::move(links) : nullptr;
}

SameHostLinks::~SameHostLinks() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

absl::Status SameHostLinks::Fail(int peer, const absl::Status& s) {
  broken_ = true;
  return GroupFailure(absl::Status(s.code(), absl::StrCat(kWho, " to rank ", peer, ": ", s.message())));
}

absl::Status SameHostLinks::Send(int peer, uint32_t op, const void* data, size_t bytes, sockio::Deadline deadline) {
  Frame h{kMagic, op, seq_, bytes};
  iovec v[2] = {{&h, sizeof(h)}, {const_cast<void*>(data), bytes}};
  absl::Status s = sockio::WriteAllV(fds_[rank_ == 0 ? peer : 0], v, 2, deadline, kWho);
  return s.ok() ? s : Fail(peer, s);
}

absl::Status SameHostLinks::Receive(int peer, uint32_t op, void* data, size_t bytes, sockio::Deadline deadline) {
  const int fd = fds_[rank_ == 0 ? peer : 0];
  Frame h{};
  absl::Status s = sockio::ReadAll(fd, &h, sizeof(h), deadline, kWho);
  if (s.ok() && (h.magic != kMagic || h.op != op || h.seq != seq_ || h.bytes != bytes)) {
    s = absl::InternalError(absl::StrCat("out of step: got op ", h.op, " call ", h.seq, " of ", h.bytes,
                                         " bytes, expected op ", op, " call ", seq_, " of ", bytes));
  }
  if (s.ok()) s = sockio::ReadAll(fd, data, bytes, deadline, kWho);
  return s.ok() ? s : Fail(peer, s);
}

absl::Status SameHostLinks::Broadcast(void* data, size_t bytes, sockio::Deadline deadline) {
  if (broken_) return absl::UnavailableError("same-host link: the group is broken by an earlier failure");
  if (bytes == 0) return absl::OkStatus();
  ++seq_;
  if (rank_ != 0) return Receive(0, kOpBroadcast, data, bytes, deadline);
  for (int r = 1; r < world_; ++r) DH_RETURN_IF_ERROR(Send(r, kOpBroadcast, data, bytes, deadline));
  return absl::OkStatus();
}

absl::Status SameHostLinks::Gather(const void* send, size_t bytes, void* recv, sockio::Deadline deadline) {
  if (broken_) return absl::UnavailableError("same-host link: the group is broken by an earlier failure");
  if (bytes == 0) return absl::OkStatus();
  ++seq_;
  if (rank_ != 0) return Send(0, kOpGather, send, bytes, deadline);
  if (recv != send) std::memcpy(recv, send, bytes);
  for (int r = 1; r < world_; ++r)
    DH_RETURN_IF_ERROR(Receive(r, kOpGather, static_cast<char*>(recv) + r * bytes, bytes, deadline));
  return absl::OkStatus();
}

}  // namespace drafthead
