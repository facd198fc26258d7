#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>

#include "common/host_port.h"
#include "server/comm/rendezvous.h"

namespace drafthead {
namespace {

TEST(RendezvousTest, SetGetAndWaitForALateKey) {
  auto srv = KvServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(srv.ok()) << srv.status();
  const std::string addr = "127.0.0.1:" + std::to_string((*srv)->port());
  auto a = KvClient::Connect(addr, std::chrono::seconds(2));
  auto b = KvClient::Connect(addr, std::chrono::seconds(2));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Set("x", std::string("\0bin\xff", 5)).ok());
  auto v = (*b)->Get("x", std::chrono::seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("\0bin\xff", 5));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (void)(*a)->Set("late", "1");
  });
  auto l = (*b)->Get("late", std::chrono::seconds(5));
  late.join();
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(*l, "1");
}

TEST(RendezvousTest, MissingKeyTimesOutNamingIt) {
  auto srv = KvServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(srv.ok());
  auto c = KvClient::Connect("127.0.0.1:" + std::to_string((*srv)->port()), std::chrono::seconds(2));
  ASSERT_TRUE(c.ok());
  auto v = (*c)->Get("rank3", std::chrono::milliseconds(200));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("rank3"), std::string::npos);
}

TEST(RendezvousTest, UnreachableLeaderIsReported) {
  auto c = KvClient::Connect("127.0.0.1:1", std::chrono::milliseconds(200));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
}

// A leader that accepts one connection and then does what `behave` says with it: the faults a
// worker must survive without waiting past its deadline.
class FakeLeader {
 public:
  explicit FakeLeader(std::function<void(int fd)> behave) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, behave] {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;
      conn_fd_ = ::accept(listen_fd_, nullptr, nullptr);
      if (conn_fd_ >= 0) behave(conn_fd_);
    });
  }
  ~FakeLeader() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    if (const int c = conn_fd_.load(); c >= 0) ::shutdown(c, SHUT_RDWR);  // ends `behave`'s waits
    thread_.join();
    if (conn_fd_ >= 0) ::close(conn_fd_);
    ::close(listen_fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int listen_fd_ = -1, port_ = 0;
  std::atomic<int> conn_fd_{-1};
  std::thread thread_;
};

using Clock = std::chrono::steady_clock;
constexpr auto kTimeout = std::chrono::milliseconds(300);
// A fault must be reported within its deadline plus this much (scheduling on a loaded machine).
constexpr auto kSlack = std::chrono::seconds(3);

// Reads one whole request frame (op, two length-prefixed strings) from a test socket.
void DrainRequest(int fd) {
  char op;
  ASSERT_EQ(::recv(fd, &op, 1, MSG_WAITALL), 1);
  for (int i = 0; i < 2; ++i) {
    uint32_t n;
    ASSERT_EQ(::recv(fd, &n, 4, MSG_WAITALL), 4);
    std::string s(ntohl(n), '\0');
    if (!s.empty()) {
      ASSERT_EQ(::recv(fd, s.data(), s.size(), MSG_WAITALL), static_cast<ssize_t>(s.size()));
    }
  }
}

TEST(RendezvousTest, SilentLeaderFailsSetWithinItsDeadline) {
  FakeLeader leader([](int fd) {  // accepts, reads, never answers; holds the connection
    char buf[256];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 5000) == 1 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  });
  auto c = KvClient::Connect(leader.address(), kTimeout);
  ASSERT_TRUE(c.ok()) << c.status();
  auto t0 = Clock::now();
  absl::Status s = (*c)->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(Clock::now() - t0, kTimeout + kSlack);
}

TEST(RendezvousTest, SilentLeaderFailsGetWithinItsTimeout) {
  FakeLeader leader([](int fd) {
    char buf[256];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 5000) == 1 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  });
  auto c = KvClient::Connect(leader.address(), std::chrono::seconds(30));
  ASSERT_TRUE(c.ok()) << c.status();
  const auto t0 = Clock::now();
  auto v = (*c)->Get("rank1", kTimeout);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_LT(Clock::now() - t0, kTimeout + kSlack);
}

TEST(RendezvousTest, LeaderClosingMidFrameIsUnavailableAtOnce) {
  FakeLeader leader([](int fd) {
    DrainRequest(fd);
    const char partial[] = {'V', 0, 0};  // op and half a length, then gone
    (void)::send(fd, partial, sizeof(partial), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_RDWR);
  });
  auto c = KvClient::Connect(leader.address(), std::chrono::seconds(30));
  ASSERT_TRUE(c.ok()) << c.status();
  const auto t0 = Clock::now();
  auto v = (*c)->Get("k", std::chrono::seconds(30));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
  EXPECT_LT(Clock::now() - t0, kSlack);
  // The connection is left mid-frame: later calls fail too, never read stale bytes.
  EXPECT_FALSE((*c)->Set("k", "v").ok());
}

TEST(RendezvousTest, GarbageFrameFailsAtOnce) {
  for (const std::string& garbage : {std::string("Zxxxxxxxxx", 10),                 // unknown op
                                    std::string("V\xff\xff\xff\xff", 5)}) {        // 4 GB length
    FakeLeader leader([garbage](int fd) {
      DrainRequest(fd);
      (void)::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
      char b;
      pollfd p{fd, POLLIN, 0};
      (void)::poll(&p, 1, 5000);  // keep the connection open: the client must not wait for more
      (void)::recv(fd, &b, 1, 0);
    });
    auto c = KvClient::Connect(leader.address(), std::chrono::seconds(30));
    ASSERT_TRUE(c.ok()) << c.status();
    const auto t0 = Clock::now();
    auto v = (*c)->Get("k", std::chrono::seconds(30));
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal) << v.status();
    EXPECT_NE(v.status().message().find("garbage frame"), std::string::npos) << v.status();
    EXPECT_LT(Clock::now() - t0, kSlack);
  }
}

TEST(RendezvousTest, LeaderThatStopsReadingFailsSetWithinItsDeadline) {
  FakeLeader leader([](int fd) {  // never reads: the client's large Set fills the socket buffers
    char b;
    pollfd p{fd, POLLRDHUP, 0};
    (void)::poll(&p, 1, 10000);
    (void)b;
  });
  auto c = KvClient::Connect(leader.address(), kTimeout);
  ASSERT_TRUE(c.ok()) << c.status();
  const auto t0 = Clock::now();
  absl::Status s = (*c)->Set("big", std::string(32 << 20, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(Clock::now() - t0, kTimeout + kSlack);
}

// The server side: a peer that stalls mid-frame, or pipelines requests and never reads the
// replies, is dropped after the server's io_timeout (it costs one thread that long, no more).
TEST(RendezvousTest, ServerDropsStalledAndNonReadingPeers) {
  auto srv = KvServer::Start("127.0.0.1", 0, kTimeout);
  ASSERT_TRUE(srv.ok()) << srv.status();
  const std::string addr = "127.0.0.1:" + std::to_string((*srv)->port());
  auto big = KvClient::Connect(addr, std::chrono::seconds(5));
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE((*big)->Set("big", std::string(1 << 20, 'x')).ok());
  auto raw = [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>((*srv)->port()));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  };
  // Waits for the server's close: reads (and discards) until EOF or an error.
  auto closed_within = [](int fd, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    char buf[1 << 16];
    while (Clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) == 1 && ::recv(fd, buf, sizeof(buf), 0) <= 0) return true;
    }
    return false;
  };
  const int stalled = raw();
  const char half[] = {'G', 0, 0, 0, 3, 'b'};  // a key of 3 bytes, one sent
  ASSERT_EQ(::send(stalled, half, sizeof(half), 0), static_cast<ssize_t>(sizeof(half)));
  EXPECT_TRUE(closed_within(stalled, kTimeout + kSlack));
  ::close(stalled);

  const int deaf = raw();
  int small = 4096;  // small receive buffer: the replies back up quickly
  setsockopt(deaf, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const char get_big[] = {'G', 0, 0, 0, 3, 'b', 'i', 'g', 0, 0, 0, 0};
  for (int i = 0; i < 64; ++i)  // 64 MB of replies asked for, none read
    ASSERT_EQ(::send(deaf, get_big, sizeof(get_big), 0), static_cast<ssize_t>(sizeof(get_big)));
  std::this_thread::sleep_for(kTimeout * 2);  // the server's reply stalls past its io_timeout
  EXPECT_TRUE(closed_within(deaf, kTimeout + kSlack + std::chrono::seconds(5)));
  ::close(deaf);
  // The server still serves everyone else.
  auto v = (*big)->Get("big", std::chrono::seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->size(), 1u << 20);
}

TEST(RendezvousTest, SplitHostPort) {
  std::string h;
  int p;
  ASSERT_TRUE(SplitHostPort("10.0.0.1:29500", &h, &p).ok());
  EXPECT_EQ(h, "10.0.0.1");
  EXPECT_EQ(p, 29500);
  ASSERT_TRUE(SplitHostPort("[::1]:7", &h, &p).ok());
  EXPECT_EQ(h, "::1");
  EXPECT_FALSE(SplitHostPort("nohost", &h, &p).ok());
  EXPECT_FALSE(SplitHostPort("h:99999", &h, &p).ok());
}

}  // namespace
}  // namespace drafthead
