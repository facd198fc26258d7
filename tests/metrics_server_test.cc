// The metrics HTTP server never waits forever on a scraper (server/sched/metrics.h): one that
// sends half a request, or idles on a keep-alive connection, is dropped after io_timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "gtest/gtest.h"
#include "server/sched/metrics.h"

namespace drafthead {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kIoTimeout = std::chrono::milliseconds(300);
constexpr auto kSlack = std::chrono::seconds(5);

int ConnectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Reads until the server closes (returns what came) or the limit passes (sets *closed = false).
std::string ReadUntilClosed(int fd, std::chrono::milliseconds limit, bool* closed) {
  std::string got;
  const auto end = Clock::now() + limit;
  *closed = false;
  char buf[4096];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(MetricsServer, DropsAStalledOrIdleScraperAfterItsTimeout) {
  Metrics metrics(2);
  auto srv = MetricsServer::Start("127.0.0.1:0", &metrics, kIoTimeout);
  ASSERT_TRUE(srv.ok()) << srv.status();
  const int port = (*srv)->port();

  // Half a request, then nothing.
  const int half = ConnectTo(port);
  const std::string part = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  ASSERT_EQ(::send(half, part.data(), part.size(), 0), static_cast<ssize_t>(part.size()));
  bool closed;
  const auto t0 = Clock::now();
  ReadUntilClosed(half, std::chrono::duration_cast<std::chrono::milliseconds>(kIoTimeout + kSlack), &closed);
  EXPECT_TRUE(closed) << "a half request held the connection open";
  EXPECT_LT(Clock::now() - t0, kIoTimeout + kSlack);
  ::close(half);

  // A whole request is answered, and the kept-alive connection is closed once idle.
  const int idle = ConnectTo(port);
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(idle, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  const std::string answer = ReadUntilClosed(idle, std::chrono::seconds(1) + kSlack, &closed);
  EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer;
  EXPECT_NE(answer.find("drafthead_serving"), std::string::npos);
  EXPECT_TRUE(closed) << "an idle keep-alive connection was never closed";
  ::close(idle);
}

}  // namespace
}  // namespace drafthead
