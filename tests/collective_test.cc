// Every Collective reports a broken group the same way (collective.h): UNAVAILABLE, for a peer that
// never calls, a peer that is gone, and every call after a failure; one case per collective
// call, per implementation run here (Gloo over loopback TCP, Gloo with its same-host Unix-socket
// links, the in-process one). The NCCL ones are in cuda_backend_test.cc (GPU machines only).
// Then the links themselves: how a group agrees on them, large and multi-rank exchanges, a frame
// out of step.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "server/comm/gloo_collective.h"
#include "server/comm/inproc_collective.h"
#include "server/comm/rendezvous.h"

namespace drafthead {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kOpTimeout = std::chrono::milliseconds(300);
constexpr auto kSlack = std::chrono::seconds(5);  // a loaded 2-core machine
constexpr int kWorld = 2;

// A group of kWorld ranks in this process; each rank's collective made on its own thread.
struct Group {
  std::unique_ptr<KvServer> store;
  std::vector<std::unique_ptr<KvClient>> clients;
  std::shared_ptr<testing::InProcGroup> inproc;
  std::vector<std::unique_ptr<Collective>> ranks;
};

// kind: "inproc", "gloo" (TCP pairs) or "gloo_unix" (same-host links); `links`: each rank's wish
// for them (default: from kind).
Group MakeGroup(const std::string& kind, int world = kWorld, std::vector<bool> links = {}) {
  Group g;
  g.ranks.resize(world);
  if (links.empty()) links.assign(world, kind == "gloo_unix");
  if (kind == "inproc") {
    g.inproc = std::make_shared<testing::InProcGroup>(world);
    for (int r = 0; r < world; ++r)
      g.ranks[r] = std::make_unique<testing::InProcCollective>(g.inproc, r, world);
    return g;
  }
  auto store = KvServer::Start("127.0.0.1", 0);
  EXPECT_TRUE(store.ok()) << store.status();
  g.store = std::move(*store);
  std::vector<std::thread> joins;
  g.clients.resize(world);
  for (int r = 0; r < world; ++r) {
    auto c = KvClient::Connect("127.0.0.1:" + std::to_string(g.store->port()), std::chrono::seconds(30));
    EXPECT_TRUE(c.ok()) << c.status();
    g.clients[r] = std::move(*c);
    joins.emplace_back([&g, r, world, want = links[r]] {
      auto c = MakeGlooCollective(r, world, "127.0.0.1", *g.clients[r], std::chrono::seconds(30), want);
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) g.ranks[r] = std::move(*c);
    });
  }
  for (auto& t : joins) t.join();
  if (kind == "gloo_unix") {
    for (auto& c : g.ranks) EXPECT_TRUE(c && c->transport() == "unix") << "the links were not set up";
  }
  return g;
}

// One call of either kind, on rank `r`, with a 64-byte buffer.
using Call = std::function<absl::Status(Collective&, std::chrono::milliseconds)>;
absl::Status Broadcast(Collective& c, std::chrono::milliseconds t) {
  std::vector<uint8_t> buf(64, static_cast<uint8_t>(c.rank() == 0 ? 7 : 0));
  absl::Status s = c.Broadcast(buf.data(), buf.size(), MemorySpace::kHost, t);
  if (s.ok() && buf != std::vector<uint8_t>(64, 7)) return absl::InternalError("broadcast: wrong bytes");
  return s;
}
absl::Status Gather(Collective& c, std::chrono::milliseconds t) {
  std::vector<uint8_t> send(64, static_cast<uint8_t>(c.rank() + 1)), recv(64 * kWorld);
  absl::Status s = c.Gather(send.data(), send.size(), recv.data(), MemorySpace::kHost, t);
  if (s.ok() && c.rank() == 0)
    for (int r = 0; r < kWorld; ++r)
      if (recv[r * 64] != r + 1) return absl::InternalError("gather: wrong bytes");
  return s;
}

struct Case {
  std::string kind;  // "gloo", "gloo_unix" or "inproc"
  std::string call;  // "broadcast" or "gather"
};

class CollectiveFailure : public ::testing::TestWithParam<Case> {
 protected:
  Call call() const { return GetParam().call == "broadcast" ? Call(Broadcast) : Call(Gather); }
  Call other() const { return GetParam().call == "broadcast" ? Call(Gather) : Call(Broadcast); }
  // The rank that waits on the other: a broadcast's receiver (the root may finish as soon as its
  // bytes are in the socket), a gather's root.
  int waiter() const { return GetParam().call == "broadcast" ? 1 : 0; }
  int peer() const { return 1 - waiter(); }
};

// Both ranks call: it works (so the failures below are failures of the group, not of the setup).
TEST_P(CollectiveFailure, WorksWithEveryRank) {
  Group g = MakeGroup(GetParam().kind);
  std::thread peer_thread([&] { EXPECT_TRUE(call()(*g.ranks[peer()], std::chrono::seconds(30)).ok()); });
  EXPECT_TRUE(call()(*g.ranks[waiter()], std::chrono::seconds(30)).ok());
  peer_thread.join();
}

// The peer is alive but never calls: the waiter's call ends within its timeout, UNAVAILABLE, and
// the collective is broken: the next call of either kind is UNAVAILABLE too.
TEST_P(CollectiveFailure, APeerThatNeverCallsIsUnavailable) {
  Group g = MakeGroup(GetParam().kind);
  const auto t0 = Clock::now();
  absl::Status s = call()(*g.ranks[waiter()], kOpTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(Clock::now() - t0, kOpTimeout + kSlack);
  for (const Call& next : {call(), other()}) {
    const auto t1 = Clock::now();
    absl::Status n = next(*g.ranks[waiter()], kOpTimeout);
    EXPECT_EQ(n.code(), absl::StatusCode::kUnavailable) << n;
    EXPECT_LT(Clock::now() - t1, kOpTimeout + kSlack);
  }
}

// The peer is gone (its collective destroyed: sockets closed): UNAVAILABLE within the timeout.
TEST_P(CollectiveFailure, APeerThatIsGoneIsUnavailable) {
  Group g = MakeGroup(GetParam().kind);
  g.ranks[peer()].reset();
  const auto t0 = Clock::now();
  absl::Status s = call()(*g.ranks[waiter()], kOpTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(Clock::now() - t0, kOpTimeout + kSlack);
}

INSTANTIATE_TEST_SUITE_P(All, CollectiveFailure,
                         ::testing::Values(Case{"gloo", "broadcast"}, Case{"gloo", "gather"},
                                           Case{"gloo_unix", "broadcast"}, Case{"gloo_unix", "gather"},
                                           Case{"inproc", "broadcast"}, Case{"inproc", "gather"}),
                         [](const auto& info) { return info.param.kind + "_" + info.param.call; });

// Runs fn(rank) on one thread per rank and joins them.
void OnEveryRank(Group& g, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < static_cast<int>(g.ranks.size()); ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

// The links are used only when every rank asks for them; otherwise every rank keeps TCP, and the
// group works either way.
TEST(SameHostLinks, OneRankWithoutThemKeepsTheGroupOnTcp) {
  for (int no : {0, 2}) {
    std::vector<bool> want(3, true);
    want[no] = false;
    Group g = MakeGroup("gloo", 3, want);
    OnEveryRank(g, [&](int r) {
      ASSERT_NE(g.ranks[r], nullptr);
      EXPECT_EQ(g.ranks[r]->transport(), "tcp") << "rank " << r << " with rank " << no << " not asking";
      std::vector<uint8_t> b(64, r == 0 ? 9 : 0);
      EXPECT_TRUE(g.ranks[r]->Broadcast(b.data(), b.size(), MemorySpace::kHost, std::chrono::seconds(30)).ok());
      EXPECT_EQ(b, std::vector<uint8_t>(64, 9));
    });
  }
}

// Three ranks, messages far larger than a socket buffer, the gather's receives announced first (as
// the engine does), several rounds: every rank's block lands at its offset, in every round.
TEST(SameHostLinks, LargeExchangesAcrossThreeRanks) {
  constexpr int kRanks = 3;
  constexpr size_t kBytes = 3 << 20;
  Group g = MakeGroup("gloo_unix", kRanks);
  OnEveryRank(g, [&](int r) {
    Collective& c = *g.ranks[r];
    std::vector<uint8_t> msg(kBytes), block(kBytes), all(r == 0 ? kBytes * kRanks : 0);
    for (int round = 0; round < 3; ++round) {
      if (r == 0)
        for (size_t i = 0; i < kBytes; ++i) msg[i] = static_cast<uint8_t>(i * 7 + round);
      ASSERT_TRUE(c.Broadcast(msg.data(), kBytes, MemorySpace::kHost, std::chrono::seconds(30)).ok());
      for (size_t i = 0; i < kBytes; i += 4099) ASSERT_EQ(msg[i], static_cast<uint8_t>(i * 7 + round)) << i;
      if (r == 0) {
        ASSERT_TRUE(c.PostGather(all.data(), kBytes, MemorySpace::kHost).ok());
      }
      for (size_t i = 0; i < kBytes; ++i) block[i] = static_cast<uint8_t>(i + 31 * r + round);
      ASSERT_TRUE(c.Gather(block.data(), kBytes, all.data(), MemorySpace::kHost, std::chrono::seconds(30)).ok());
      if (r != 0) continue;
      for (int q = 0; q < kRanks; ++q)
        for (size_t i = 0; i < kBytes; i += 4099)
          ASSERT_EQ(all[q * kBytes + i], static_cast<uint8_t>(i + 31 * q + round)) << "rank " << q << " byte " << i;
    }
  });
}

// Ranks that disagree on a call's size are out of step: the receiver's call is UNAVAILABLE naming
// it, at once (not at its timeout), and the group is broken.
TEST(SameHostLinks, AFrameOutOfStepIsUnavailable) {
  Group g = MakeGroup("gloo_unix");
  std::thread root([&] {
    std::vector<uint8_t> b(64, 1);
    EXPECT_TRUE(g.ranks[0]->Broadcast(b.data(), b.size(), MemorySpace::kHost, std::chrono::seconds(30)).ok());
  });
  std::vector<uint8_t> b(32);
  const auto t0 = Clock::now();
  absl::Status s = g.ranks[1]->Broadcast(b.data(), b.size(), MemorySpace::kHost, std::chrono::seconds(30));
  root.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("out of step"), absl::string_view::npos) << s;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));
  EXPECT_EQ(Broadcast(*g.ranks[1], kOpTimeout).code(), absl::StatusCode::kUnavailable);
}

TEST(GroupFailure, EveryCodeBecomesUnavailableKeepingTheCause) {
  EXPECT_TRUE(GroupFailure(absl::OkStatus()).ok());
  const absl::Status d = GroupFailure(absl::DeadlineExceededError("nccl: ncclBroadcast did not complete"));
  EXPECT_EQ(d.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.message(), "DEADLINE_EXCEEDED: nccl: ncclBroadcast did not complete");
  EXPECT_EQ(GroupFailure(absl::FailedPreconditionError("x")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GroupFailure(absl::UnavailableError("y")).message(), "y");
}

}  // namespace
}  // namespace drafthead
