// The caller's side of a same-host lane (docs/lane.md, common/lane/lane_layout.h): creates the
// lane object and, beside it, an arena (a second POSIX object the caller registers as a region at
// OpenLane) with one hidden-rows area and one output area per slot; submits descriptors and waits
// for their completions, spinning up to a budget and then sleeping on the doorbell futex.
//
// Contract
// - Ownership: the ring owns both objects (created 0600 under unique names, unlinked and unmapped
//   by the destructor). Opening and closing the lane over gRPC is the owner's (the C++ client
//   library, or Python through the C ABI in lane_c_api.h): this class has no gRPC in it.
// - Threads: Submit / Wait / Release are thread-safe; each submission is waited for by one thread.
//   At most `depth` submissions are outstanding; Submit waits (bounded by its deadline) for a slot.
// - Failure: codes are gRPC status numbers with a message: DEADLINE_EXCEEDED when the deadline
//   passes (the slot is abandoned and reclaimed once the server answers it), UNAVAILABLE once the
//   server closed the lane or its process exited (watched through a pidfd), never a hang.
// - No dependency beyond the C++ standard library and Linux, so it builds into the small shared
//   library the Python client loads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/lane/lane_layout.h"

namespace drafthead::lane {

// LaneRingConfig::spin_ns: spin for the ring's recent call time (see Wait) instead of a fixed budget.
inline constexpr int64_t kSpinAuto = -1;

struct LaneRingConfig {
  uint32_t depth = 8;               // slots (rounded up to a power of two)
  uint32_t inline_bytes = 1 << 16;  // inline token answers per slot (rounded up to 64)
  uint64_t hidden_slot_bytes = 0;   // arena: hidden rows per slot (0: no arena)
  uint64_t output_slot_bytes = 0;   // arena: outputs per slot
  int64_t spin_ns = kSpinAuto;      // a waiting caller spins this long (ns) before sleeping, or kSpinAuto
};

struct LaneError {
  int code = 0;  // gRPC status code
  std::string message;
  bool ok() const { return code == 0; }
};

class LaneRing {
 public:
  static std::unique_ptr<LaneRing> Create(const LaneRingConfig& config, LaneError* error);
  ~LaneRing();
  LaneRing(const LaneRing&) = delete;
  LaneRing& operator=(const LaneRing&) = delete;

  // What OpenLane needs.
  const std::string& key() const { return key_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t nonce() const { return nonce_; }
  const std::string& arena_key() const { return arena_key_; }  // empty: no arena
  uint64_t arena_bytes() const { return arena_bytes_; }
  uint32_t depth() const { return depth_; }
  uint32_t inline_bytes() const { return inline_bytes_; }
  const LaneRingConfig& config() const { return config_; }

  // Removes both objects' names (once the server has mapped them, after OpenLane): the memory
  // lives on in the two mappings and goes with the last process, so a killed caller leaves no
  // object behind in /dev/shm.
  void Unlink();
  // After OpenLane answered: watch the server process (its death is UNAVAILABLE to waiters).
  LaneError Attach(int server_pid);

  // The arena's areas of a slot (host memory of this process).
  uint8_t* hidden_area(uint32_t slot) const;
  uint8_t* output_area(uint32_t slot) const;
  uint64_t hidden_area_offset(uint32_t slot) const { return slot * config_.hidden_slot_bytes; }
  uint64_t output_area_offset(uint32_t slot) const {
    return uint64_t{depth_} * config_.hidden_slot_bytes + slot * config_.output_slot_bytes;
  }

  // Reserves the next slot (waiting up to deadline_ns, CLOCK_MONOTONIC, for one): *seq is the
  // submission number, slot = *seq % depth. Fill the slot's arena areas, then Publish.
  // host (a call whose answer the host reads: every caller but a stream-ordered one, which passes
  // false and orders both on its GPU stream): the slot is handed out only once a GPU stream has
  // copied the slot's last answer out (ExpectConsumed), and a slot the slot holder still holds is
  // asked back from it (SetSlotHolder) instead of waiting for its next call.
  LaneError Reserve(int64_t deadline_ns, uint64_t* seq, bool host = true);
  // The seq the next Reserve hands out (a host call on another thread may take it first).
  uint64_t NextSeq();
  // A slot's answer that a GPU stream will copy out and then mark, writing `value` into the word
  // at `word` (host memory, written by the device; it lives as long as the ring): a host Reserve
  // does not hand the slot out before that (the server would overwrite the answer). Thread-safe.
  void ExpectConsumed(uint32_t slot, const uint32_t* word, uint32_t value);
  // Waits (to deadline_ns, CLOCK_MONOTONIC) until every slot's answer that a GPU stream is to copy
  // out is marked copied (ExpectConsumed): after that the device no longer reads the ring's slots.
  // False when the deadline passed first.
  bool AwaitCopiedOut(int64_t deadline_ns);
  // The part of the library that holds slots past their answers until it looks at them (the
  // stream-ordered calls, LaneCuda): a host Reserve whose next slot it holds calls
  // reclaim(seq, deadline_ns) without the ring's lock; it releases seq (waiting for its answer up
  // to the deadline) and returns true, or returns false (not its slot, or busy: the ring looks
  // again within 1 ms). nullptr: none. Set while no Reserve runs (attach, destroy).
  void SetSlotHolder(std::function<bool(uint64_t seq, int64_t deadline_ns)> reclaim);
  // Publishes descriptor `d` (d.seq is set here) for a reserved seq and rings the doorbell.
  void Publish(uint64_t seq, const LaneRequest& d);

  // Slot-relative descriptors (what Submit and the C ABI's one-call entries take): a slice's offset
  // counts from the start of the slot's own area in its region, whose areas are laid out per slot
  // like this ring's arena (hidden areas of hidden_slot_bytes, output areas of output_slot_bytes;
  // the caller's CUDA arenas are made so). Region 0 is the arena, whose output areas follow its
  // hidden areas. kNoRegion slices are left alone.
  // INVALID_ARGUMENT (naming the slice) when a slice does not fit in one slot's area. Check before
  // Reserve: a reserved seq must be published (sq_tail moves in order), or Cancel()ed.
  LaneError CheckSlotSlices(const LaneRequest& d) const;
  // Publish with d's slot-relative slices made absolute for seq's slot.
  void PublishInSlot(uint64_t seq, LaneRequest d);
  // One submission of rows given here: d.hidden becomes the slot's arena hidden area holding
  // `hidden_bytes` of `hidden` (host memory, copied); d.output is slot-relative. Check, Reserve
  // (up to deadline_ns), copy, PublishInSlot. *seq: its number (Wait, then Release).
  LaneError Submit(LaneRequest d, const void* hidden, uint64_t hidden_bytes, int64_t deadline_ns, uint64_t* seq);
  // For a reserved seq that cannot be published as meant (a failure between Reserve and Publish):
  // publishes a descriptor the server refuses at once (no hidden slice) and abandons the slot, so the ring
  // goes on (sq_tail moves past seq; the slot is reclaimed once the refusal is written).
  void Cancel(uint64_t seq);
  // Waits for seq's completion. On OK, *out points at it until Release(seq). The caller spins
  // first, then sleeps on the doorbell: for spin_ns, or with kSpinAuto, when seq is the ring's
  // only submission in flight, for 1.5x the recent waits of such lone submissions (an average over
  // ~8; within 50 us .. 2 ms), so that a one-at-a-time caller's answers find it spinning (a
  // wake-up costs tens of us on a VM), else 200 us (a submission among others also queues behind
  // them: spinning through the queue would take the cores the answers need).
  LaneError Wait(uint64_t seq, int64_t deadline_ns, const LaneCompletion** out);
  // The budget a Wait spins for (ns), alone in the ring or not.
  int64_t SpinBudgetNs(bool alone = true) const;
  void Release(uint64_t seq);
  // Wait without blocking: true once seq's answer is there.
  bool Done(uint64_t seq) const;
  // Submission seq's completion slot (slot seq % depth), answered or not: what Wait hands out.
  LaneCompletion* completion(uint64_t seq) const { return CompletionSlot(base_, geo_, depth_, seq); }
  // The lane's header and a slot's words, for a caller whose GPU stream writes the fence and waits
  // on done_seq itself (stream-ordered calls, lane_c_api.h).
  uint8_t* base() const { return base_; }
  uint64_t fence_offset(uint64_t seq) const;     // the request slot's fence word
  uint64_t done_offset(uint64_t seq) const;      // the completion slot's done_seq (low word first)
  // Whether the server is gone (closed the lane, or its process exited), or this side closed the
  // ring (Close): UNAVAILABLE then.
  LaneError CheckServer() const;
  // This side's close (the owner's, before it destroys the ring while other threads may still wait
  // in it): from now on waits and reserves end with UNAVAILABLE: a waiter asleep is woken, one
  // spinning stops at the end of its spin, one about to sleep within a sleep slice (20 ms).
  // Thread-safe; idempotent.
  void Close();
  // Once the server is gone: every submission not yet answered is answered here with `why`
  // (done_seq written), so that a GPU stream waiting on one goes on instead of hanging.
  void FailOutstanding(const LaneError& why);

  // Counters (this ring's waits): completions seen while spinning vs after sleeping.
  uint64_t spin_waits() const { return spin_waits_; }
  uint64_t sleep_waits() const { return sleep_waits_; }

 private:
  LaneRing() = default;
  void Abandon(uint64_t seq);  // the waiter gave up: reclaim the slot once answered
  uint64_t slot_offset(const LaneSlice& s, bool output, uint32_t slot) const;

  LaneRingConfig config_;
  std::string key_, arena_key_;
  uint64_t nonce_ = 0, bytes_ = 0, arena_bytes_ = 0;
  uint32_t depth_ = 0, inline_bytes_ = 0;
  LaneGeometry geo_;
  uint8_t* base_ = nullptr;
  uint8_t* arena_ = nullptr;
  LaneHeader* hdr_ = nullptr;
  int server_pidfd_ = -1;
  bool linked_ = true;
  std::atomic<bool> closed_{false};  // Close()

  std::mutex mu_;  // submission order and slot states
  std::condition_variable slot_freed_;
  uint64_t next_seq_ = 0;
  enum SlotState : uint8_t { kFree, kBusy, kAbandoned };
  std::vector<SlotState> state_;
  std::vector<uint64_t> slot_seq_;
  std::set<uint64_t> filled_;  // published out of order, waiting for an earlier seq
  uint64_t published_ = 0;     // sq_tail's value
  std::atomic<uint64_t> spin_waits_{0}, sleep_waits_{0};
  std::atomic<int64_t> recent_wait_ns_{0};  // kSpinAuto's average (0: none yet)
  std::atomic<uint32_t> busy_{0};  // reserved slots not yet released or abandoned
  struct ConsumedWord {
    const uint32_t* word = nullptr;  // nullptr: nothing to wait for
    uint32_t value = 0;
    // Copied out (or nothing to wait for). Signed: the word counts seq + 1 of the slot's calls
    // and may wrap.
    bool passed() const {
      return word == nullptr || static_cast<int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) >= 0;
    }
  };
  std::vector<ConsumedWord> copied_out_;  // each slot's (ExpectConsumed; guarded by mu_)
  std::function<bool(uint64_t, int64_t)> reclaim_;  // SetSlotHolder's
};

}  // namespace drafthead::lane
