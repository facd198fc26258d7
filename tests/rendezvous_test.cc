#include <gtest/gtest.h>

#include <thread>

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
