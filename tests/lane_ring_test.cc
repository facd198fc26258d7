// LaneRing (client/lane/lane_ring.h) in one process: its waiting, a responder thread playing the
// server, answering each published submission after a fixed delay; and its slots shared between
// host calls and stream-ordered ones (a slot holder, the consumed word).
#include <chrono>
#include <climits>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/lane/lane_ring.h"
#include "common/lane/doorbell.h"
#include "common/lane/lane_layout.h"

namespace drafthead::lane {
namespace {

struct Outcome {
  uint64_t slept = 0;        // waits of the last calls - warmup calls that found the answer asleep
  int64_t budget_after = 0;  // SpinBudgetNs() after the calls
  int64_t budget_crowded = 0;  // SpinBudgetNs(false): a submission among others
};

// `calls` calls, each answered at least `delay` after the caller starts waiting (0: before its
// wait), so every wait lasts `delay` however late a loaded host runs the caller. `once_asleep`: the
// answer also waits (up to 2 s) for the caller to be asleep, so it cannot be caught spinning.
Outcome Calls(int64_t spin_ns, std::chrono::microseconds delay, int calls, int warmup,
              bool once_asleep = false) {
  LaneRingConfig c;
  c.depth = 4;
  c.inline_bytes = 4096;
  c.spin_ns = spin_ns;
  LaneError e;
  auto ring = LaneRing::Create(c, &e);
  EXPECT_NE(ring, nullptr) << e.message;
  if (ring == nullptr) return {};
  auto* hdr = reinterpret_cast<LaneHeader*>(ring->base());
  uint64_t slept_before = 0;
  for (int i = 0; i < calls; ++i) {
    if (i == warmup) slept_before = ring->sleep_waits();
    uint64_t seq;
    EXPECT_TRUE(ring->Reserve(MonotonicNanos() + 1'000'000'000, &seq).ok());
    LaneRequest d{};
    d.hidden.region = d.output.region = kNoRegion;
    ring->Publish(seq, d);
    auto answer = [&, seq] {  // the server's answer: done_seq, the count, a wake if asleep
      ring->completion(seq)->done_seq.store(seq + 1, std::memory_order_release);
      hdr->cq_count.fetch_add(1, std::memory_order_release);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (hdr->client_sleeping.load(std::memory_order_relaxed) != 0) FutexWake(&hdr->cq_count, INT_MAX);
    };
    std::thread server;
    std::atomic<bool> waiting{false};
    if (delay.count() == 0) {
      answer();  // before the wait
    } else {
      server = std::thread([&] {
        // Up to 2 s for each condition: a caller that never waits or never sleeps fails its checks.
        auto await = [](auto&& cond) {
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
          while (!cond() && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        };
        await([&] { return waiting.load(std::memory_order_acquire); });
        std::this_thread::sleep_for(delay);
        if (once_asleep) await([&] { return hdr->client_sleeping.load(std::memory_order_acquire) != 0; });
        answer();
      });
    }
    const LaneCompletion* done = nullptr;
    waiting.store(true, std::memory_order_release);
    const LaneError w = ring->Wait(seq, MonotonicNanos() + 5'000'000'000, &done);
    EXPECT_TRUE(w.ok()) << w.message;
    EXPECT_EQ(done, ring->completion(seq));
    if (server.joinable()) server.join();
    ring->Release(seq);
  }
  EXPECT_EQ(ring->spin_waits() + ring->sleep_waits(), static_cast<uint64_t>(calls));
  return {ring->sleep_waits() - slept_before, ring->SpinBudgetNs(), ring->SpinBudgetNs(false)};
}

// Answers that take longer than a fixed 200 us budget (the old default) find the caller asleep
// every time. They wait for that: on a loaded host (ASan on 2 cores) a caller once reached its
// wait so late that a 700 us answer came inside its 200 us spin; a budget that never stops
// spinning still fails here, its answers coming 2 s late and found spinning. The automatic budget
// learns the calls' length (every wait here is >= 700 us, so its average is too, and 1.5x that is
// >= 1.05 ms). How many answers it then finds spinning depends on when this host runs the
// answering thread (a loaded 2-core machine may run it late every time), so that is reported, not
// asserted; the H200 runs measure it (docs/NOTES.md).
TEST(LaneRingWait, TheAutomaticBudgetLearnsTheCallsLength) {
  const auto delay = std::chrono::microseconds(700);
  const Outcome fixed = Calls(200'000, delay, 30, 3, /*once_asleep=*/true);
  EXPECT_EQ(fixed.slept, 27u) << "a 200 us budget must sleep through 700 us answers";
  EXPECT_EQ(fixed.budget_after, 200'000);
  const Outcome automatic = Calls(kSpinAuto, delay, 30, 3);
  EXPECT_GE(automatic.budget_after, 1'050'000);
  EXPECT_LE(automatic.budget_after, 2'000'000);
  EXPECT_EQ(automatic.budget_crowded, 200'000) << "a submission among others must not spin through their queue";
  std::printf("answers found asleep of 27: fixed 200 us %llu, automatic %llu\n",
              static_cast<unsigned long long>(fixed.slept), static_cast<unsigned long long>(automatic.slept));
}

// A zero budget never spins: every answer is found after sleeping, none is lost.
TEST(LaneRingWait, ZeroBudgetSleepsAndStillGetsEveryAnswer) {
  EXPECT_EQ(Calls(0, std::chrono::microseconds(100), 10, 0, /*once_asleep=*/true).slept, 10u);
}

// Before any answer the automatic budget is 200 us; it stays within 50 us .. 2 ms.
TEST(LaneRingWait, TheAutomaticBudgetIsBounded) {
  EXPECT_EQ(Calls(kSpinAuto, std::chrono::microseconds(0), 0, 0).budget_after, 200'000);
  EXPECT_EQ(Calls(kSpinAuto, std::chrono::microseconds(0), 20, 0).budget_after, 50'000);
  EXPECT_EQ(Calls(kSpinAuto, std::chrono::microseconds(3000), 12, 0).budget_after, 2'000'000);
}

// A ring of `depth` slots with tiny areas (no server: the tests answer submissions themselves).
std::unique_ptr<LaneRing> SmallRing(uint32_t depth) {
  LaneRingConfig c;
  c.depth = depth;
  c.inline_bytes = 64;
  LaneError e;
  auto ring = LaneRing::Create(c, &e);
  EXPECT_NE(ring, nullptr) << e.message;
  return ring;
}

// Reserves (host or not), publishes and answers one submission; returns its seq.
uint64_t Answered(LaneRing& ring, bool host) {
  uint64_t seq = 0;
  const LaneError e = ring.Reserve(MonotonicNanos() + 1'000'000'000, &seq, host);
  EXPECT_TRUE(e.ok()) << e.message;
  LaneRequest d{};
  d.hidden.region = d.output.region = kNoRegion;
  ring.Publish(seq, d);
  ring.completion(seq)->done_seq.store(seq + 1, std::memory_order_release);
  return seq;
}

// A stream-ordered call's slot stays held until its holder looks at the answer, which it does on
// its next call: a host caller in between must not wait for that call (it may never come). The
// host Reserve asks the holder for the slot it needs, and only that one.
TEST(LaneRingSlots, AHostReserveTakesItsSlotBackFromTheHolder) {
  auto ring = SmallRing(4);
  ASSERT_NE(ring, nullptr);
  const uint64_t held = Answered(*ring, /*host=*/false);  // slot 0, held past its answer
  std::vector<uint64_t> asked;
  ring->SetSlotHolder([&](uint64_t seq, int64_t) {
    asked.push_back(seq);
    if (seq != held) return false;
    ring->Release(seq);
    return true;
  });
  for (int i = 0; i < 3; ++i) ring->Release(Answered(*ring, /*host=*/true));  // slots 1..3
  EXPECT_TRUE(asked.empty()) << "the holder was asked for a free slot";
  uint64_t seq = 0;
  const LaneError e = ring->Reserve(MonotonicNanos() + 2'000'000'000, &seq);  // slot 0 again
  ASSERT_TRUE(e.ok()) << e.message;
  EXPECT_EQ(seq, 4u);
  EXPECT_EQ(asked, std::vector<uint64_t>{held});
  ring->Cancel(seq);
}

// A holder that keeps its slot (false) makes the host Reserve wait, to its deadline, and then fail
// RESOURCE_EXHAUSTED. A stream-ordered Reserve never asks.
TEST(LaneRingSlots, AHeldSlotThatStaysHeldEndsAtTheDeadline) {
  auto ring = SmallRing(2);
  ASSERT_NE(ring, nullptr);
  Answered(*ring, false);
  Answered(*ring, false);
  int asked = 0;
  ring->SetSlotHolder([&](uint64_t, int64_t) { return ++asked, false; });
  uint64_t seq = 0;
  const int64_t t0 = MonotonicNanos();
  LaneError e = ring->Reserve(t0 + 30'000'000, &seq);
  EXPECT_EQ(e.code, 8) << e.message;  // RESOURCE_EXHAUSTED
  EXPECT_GE(MonotonicNanos() - t0, 30'000'000);
  EXPECT_GE(asked, 1);
  const int asked_by_host = asked;
  e = ring->Reserve(MonotonicNanos() + 5'000'000, &seq, /*host=*/false);
  EXPECT_EQ(e.code, 8);
  EXPECT_EQ(asked, asked_by_host) << "a stream-ordered Reserve asked the holder";
}

// A GPU stream copies a slot's answer out after the host has seen it: a host Reserve must not
// hand that slot out (the server would overwrite the answer) until the stream marks it copied
// (the consumed word); a stream-ordered Reserve takes it at once (its stream waits on the word).
TEST(LaneRingSlots, AHostReserveWaitsForTheAnswerToBeCopiedOut) {
  auto ring = SmallRing(2);
  ASSERT_NE(ring, nullptr);
  uint32_t word = 0;
  const uint64_t first = Answered(*ring, false);  // slot 0
  ring->ExpectConsumed(0, &word, static_cast<uint32_t>(first + 1));
  ring->Release(first);
  ring->Release(Answered(*ring, true));  // slot 1
  std::atomic<bool> marked{false};
  std::thread stream([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    marked.store(true);
    __atomic_store_n(&word, static_cast<uint32_t>(first + 1), __ATOMIC_RELEASE);
  });
  uint64_t seq = 0;
  const LaneError e = ring->Reserve(MonotonicNanos() + 2'000'000'000, &seq);
  EXPECT_TRUE(e.ok()) << e.message;
  EXPECT_TRUE(marked.load()) << "slot 0 was handed out before its answer was copied out";
  stream.join();
  ring->Cancel(seq);
  ring->completion(seq)->done_seq.store(seq + 1, std::memory_order_release);  // the refusal, answered
  // The host call cleared the expectation; a new one, unmet, does not hold back a stream-ordered
  // Reserve (slot 1 next, then slot 0 again).
  ring->Release(Answered(*ring, true));
  ring->ExpectConsumed(0, &word, static_cast<uint32_t>(first + 100));
  const LaneError s = ring->Reserve(MonotonicNanos() + 100'000'000, &seq, /*host=*/false);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(seq % 2, 0u);
}

}  // namespace
}  // namespace drafthead::lane
