// The lane library's C ABI (client/lane/lane_c_api.h) when dh_lane_destroy races the other entries:
// a call waiting in another thread ends with UNAVAILABLE, entries after the destroy are refused
// instead of touching freed memory, and an answer held across the destroy stays readable until its
// release. No server: the test writes the one answer it needs into the completion slot itself.
// The sanitizer stage runs it under ASan, which is where a use after free would show.
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/lane/lane_c_api.h"
#include "common/lane/lane_layout.h"

namespace drafthead::lane {
namespace {

using Clock = std::chrono::steady_clock;

dh_lane* NewLane(int64_t spin_ns) {
  int code = -1;
  char msg[256] = {};
  dh_lane* l = dh_lane_create(4, 4096, 4096, 4096, spin_ns, &code, msg, sizeof msg);
  EXPECT_NE(l, nullptr) << msg;
  return l;
}

LaneRequest Request(uint64_t id) {
  LaneRequest d{};
  d.request_id = id;
  d.rows = 1;
  d.hidden.region = d.output.region = kNoRegion;
  return d;
}

// dh_lane_call: its result, its message.
int64_t Call(dh_lane* l, int64_t timeout_ns, std::string* why = nullptr) {
  const LaneRequest d = Request(7);
  const char rows[64] = {};
  char msg[256] = {};
  const int64_t n = dh_lane_call(l, &d, rows, sizeof rows, timeout_ns, msg, sizeof msg);
  if (why != nullptr) *why = msg;
  return n;
}

constexpr int kUnavailable = 14;

TEST(LaneCApi, DestroyEndsAWaitInAnotherThread) {
  for (const int64_t spin_ns : {int64_t{0}, int64_t{2'000'000}}) {  // asleep on the doorbell, spinning
    dh_lane* l = NewLane(spin_ns);
    ASSERT_NE(l, nullptr);
    int64_t got = 0;
    std::string why;
    std::atomic<bool> in{false};
    std::thread waiter([&] {
      in.store(true);
      got = Call(l, 10'000'000'000, &why);  // nobody answers: only the destroy ends it
    });
    while (!in.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t0 = Clock::now();
    dh_lane_destroy(l);
    waiter.join();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    EXPECT_EQ(got, -kUnavailable) << why;
    EXPECT_NE(why.find("closed"), std::string::npos) << why;
    EXPECT_LT(ms, 1000.0) << "spin_ns " << spin_ns;  // a sleep slice is 20 ms; a wake is at once
  }
}

TEST(LaneCApi, EntriesAfterDestroyAreRefusedNotFreedMemory) {
  dh_lane* l = NewLane(0);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(dh_lane_depth(l), 4u);
  EXPECT_STRNE(dh_lane_key(l), "");
  dh_lane_destroy(l);
  std::string why;
  EXPECT_EQ(Call(l, 1'000'000, &why), -kUnavailable);
  EXPECT_NE(why.find("dh_lane_destroy"), std::string::npos) << why;
  EXPECT_EQ(dh_lane_depth(l), 0u);
  EXPECT_STREQ(dh_lane_key(l), "");
  EXPECT_EQ(dh_lane_completion(l, 0), nullptr);
  EXPECT_EQ(dh_lane_hidden_area(l, 0), nullptr);
  uint64_t seq = 0;
  char msg[128];
  EXPECT_EQ(dh_lane_reserve(l, 1'000'000, &seq, msg, sizeof msg), kUnavailable);
  EXPECT_EQ(dh_lane_attach(l, 1, msg, sizeof msg), kUnavailable);
  EXPECT_EQ(dh_lane_stream_synchronize(l, 0, msg, sizeof msg), kUnavailable);
  EXPECT_EQ(dh_lane_finish_stream(l, 0, nullptr, 0, 1, 0, msg, sizeof msg), kUnavailable);
  dh_lane_release(l, 0);  // no answer held: nothing happens
  dh_lane_unlink(l);
  dh_lane_destroy(l);  // a second destroy: nothing happens
}

TEST(LaneCApi, AnAnswerHeldAcrossTheDestroyStaysReadableUntilItsRelease) {
  dh_lane* l = NewLane(2'000'000'000);  // the caller spins: the answer below needs no doorbell
  ASSERT_NE(l, nullptr);
  // The server's part for submission 0: the answer, then done_seq (what the caller waits for).
  std::thread server([l] {
    auto* c = static_cast<LaneCompletion*>(const_cast<void*>(dh_lane_completion(l, 0)));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c->request_id = 7;
    c->code = 0;
    c->rows = 1;
    c->done_seq.store(1, std::memory_order_release);
  });
  std::string why;
  const int64_t n = Call(l, 5'000'000'000, &why);
  server.join();
  ASSERT_EQ(n, 0) << why;
  dh_lane_destroy(l);
  const auto* c = static_cast<const LaneCompletion*>(dh_lane_completion(l, 0));
  ASSERT_NE(c, nullptr);  // still mapped: the answer's count keeps it
  EXPECT_EQ(c->request_id, 7u);
  EXPECT_EQ(dh_lane_depth(l), 4u);
  EXPECT_EQ(Call(l, 1'000'000), -kUnavailable);  // but no new call
  dh_lane_release(l, 0);  // the last count: the ring goes now
  EXPECT_EQ(dh_lane_completion(l, 0), nullptr);
  EXPECT_EQ(dh_lane_depth(l), 0u);
}

TEST(LaneCApi, CallsRacingTheDestroyEndCleanly) {
  // Threads calling in a loop (no server: each call ends at its 1 ms deadline) while the main
  // thread destroys the lane, many times over; every call ends with DEADLINE_EXCEEDED,
  // RESOURCE_EXHAUSTED (no slot before the deadline) or UNAVAILABLE, and nothing crashes.
  for (int round = 0; round < 20; ++round) {
    dh_lane* l = NewLane(100'000);
    ASSERT_NE(l, nullptr);
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0}, calls{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t) {
      callers.emplace_back([&] {
        while (!stop.load()) {
          const int64_t n = Call(l, 1'000'000);
          calls.fetch_add(1);
          if (n != -4 && n != -8 && n != -kUnavailable) bad.fetch_add(1);
          if (n >= 0) dh_lane_release(l, static_cast<uint64_t>(n));
          (void)dh_lane_depth(l);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    dh_lane_destroy(l);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    stop.store(true);
    for (std::thread& t : callers) t.join();
    EXPECT_EQ(bad.load(), 0) << "round " << round;
    EXPECT_GT(calls.load(), 0);
  }
}

}  // namespace
}  // namespace drafthead::lane
