// LaneRing's waiting (client/lane/lane_ring.h), in one process: a responder thread plays the
// server, answering each published submission after a fixed delay.
#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>

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

}  // namespace
}  // namespace drafthead::lane
