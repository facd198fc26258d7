// A lane's stream-ordered calls for a caller on a GPU (lane_cuda.cc says how). Owns the lane
// object's registration with the device, the bookkeeping of stream-ordered submissions whose
// answers the host has not yet seen, and a watchdog thread that answers outstanding requests
// UNAVAILABLE once the server is gone (so no GPU stream waits forever).
// Threads: Call / Submit / Finish / Synchronize are thread-safe (one mutex: a Call that waits on the
// host holds it; between a Submit and its Finish nobody does).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/lane/lane_copy.h"
#include "client/lane/lane_ring.h"

namespace drafthead::lane {

class LaneCuda {
 public:
  LaneCuda() = default;
  ~LaneCuda();  // stops the watchdog, unregisters (call before the ring goes)
  LaneCuda(const LaneCuda&) = delete;
  LaneCuda& operator=(const LaneCuda&) = delete;

  // Registers the ring's object with the current CUDA context. hidden_arena / output_arena: the
  // device addresses of the caller's CUDA arenas (regions 1 and 2 at OpenLane; depth areas of
  // hidden_slot_bytes / output_slot_bytes). FAILED_PRECONDITION without CUDA.
  LaneError Attach(LaneRing* ring, uint64_t hidden_arena, uint64_t output_arena);

  // A piece of the answer copied out of the slot's CUDA output area after it arrives.
  struct CopyOut {
    uint64_t dst;     // device address
    uint64_t offset;  // into the slot's output area
    uint64_t bytes;
  };
  static constexpr uint32_t kMaxCopies = 4;

  // One stream-ordered call on `stream` (a CUstream): first the answers already published are
  // released (an earlier call's failure is returned now, before anything is submitted); with all
  // depth slots held by such calls, waits for the oldest. Then reserves a slot, copies
  // `hidden_bytes` at device address `hidden` into the slot's CUDA hidden area, writes the fence
  // word, publishes `d` (slot-relative slices, LaneRing::PublishInSlot; kFlagHiddenFence set here)
  // and makes the stream wait for the answer, then copies `copies` (n of them, <= kMaxCopies;
  // adjacent ones as one copy; each inside the slot's output area, else INVALID_ARGUMENT before
  // anything is submitted) out of the slot; all on the stream, the host waits for no GPU work.
  // Calls on several streams, and host calls on the same lane, are safe with copies (a slot's next
  // call waits for the previous one's copies: a stream on the GPU, a host call in
  // LaneRing::Reserve, which also takes back a slot this holds); with none, the caller's own
  // reads of the slot must come before the slot's next call in stream order (one stream).
  // wait: also wait on the host for this call (and every earlier one), returning its failure.
  // *seq: the submission (its answer lands in the slot's CUDA output area, ordered on the stream).
  LaneError Call(const LaneRequest& d, uint64_t hidden, uint64_t hidden_bytes, void* stream, bool wait,
                 int64_t deadline_ns, const CopyOut* copies, uint32_t n, uint64_t* seq);
  // The same call in two steps, so that what the caller does between them (allocating the tensors
  // the answer goes into) runs while the server computes: Submit is Call up to the publish (and
  // the stream's rows and fence); Finish makes the stream wait for the answer and copies `copies`
  // out, as Call does. copies_follow: whether Finish will copy pieces out (with host IO, a token
  // answer then comes inline). Every Submit that returns OK must be followed by one Finish of its
  // seq (with no copies when the caller gave up in between), from the same thread and before that
  // thread's next call on this lane: until then the slot stays with the call, and another thread's
  // call that needs it waits for the Finish (up to its deadline). Finish's INVALID_ARGUMENT (a
  // piece outside the answer) still finishes the call: its answer is then nobody's.
  LaneError Submit(const LaneRequest& d, uint64_t hidden, uint64_t hidden_bytes, void* stream, bool copies_follow,
                   int64_t deadline_ns, uint64_t* seq);
  LaneError Finish(uint64_t seq, const CopyOut* copies, uint32_t n, bool wait, int64_t deadline_ns);
  // Waits on the host for every stream-ordered call's answer; the first failure among them.
  LaneError Synchronize(int64_t deadline_ns);
  // Whether seq is a submitted call awaiting its Finish.
  bool Open(uint64_t seq);
  // Before the lane's memory goes (the owner's destroy, after LaneRing::Close and once no call is
  // inside): the answers the caller's streams still wait for are failed here (a server told to
  // close may never write them), then the streams' copies out of the slots are awaited (every
  // finished call marks its consumed word last) up to deadline_ns. False: the device may still
  // touch the lane's memory, which the owner must then keep.
  bool Drain(int64_t deadline_ns);

  // The copy kernel (lane_copy.cu; loaded at Attach where the library has it and the driver takes
  // it): a call's rows and its fence word in one launch, its answer's pieces and the consumed word
  // in another, instead of a libcuda copy and a stream write each (up to kKernelCopyMax bytes, and
  // from the context current at Attach; otherwise the libcuda calls). On once loaded. use > 0:
  // on where loaded, 0: off, < 0: unchanged. Returns whether it is in use; *why: why it is not
  // loaded ("" if it is).
  bool SetCopyKernel(int use, std::string* why);
  static constexpr uint64_t kKernelCopyMax = 256 * 1024;

  // Host IO: a call's rows go into the slot's area of the host arena (registered with the device
  // at Attach) instead of its CUDA hidden area, and a token answer (TOP_K, ARGMAX, SAMPLE) the
  // library copies out comes back inline in the slot's completion instead of the CUDA output area:
  // both crossed by the caller's own GPU work (the copy kernel's stores to and loads from mapped
  // host memory, or libcuda copies), so the server reads and writes only host memory and makes no
  // CUDA call for the call's data (the CUDA arenas cost it a synchronous copy each way). FULL_LOGITS
  // stays in the CUDA output area, and so does an answer larger than the inline bytes or with no
  // copies asked for. On once the host arena registered at Attach. use > 0: on where it did, 0:
  // off, < 0: unchanged. Returns whether it is in use; *why: why it is not available ("" if it is).
  bool SetHostIo(int use, std::string* why);

 private:
  // A call's descriptor as sent and where its answer is read from (decided before it reserves).
  struct Plan {
    LaneRequest r;
    bool host_rows = false;      // its rows in the host arena (host IO), else the CUDA hidden arena
    bool inline_answer = false;  // its answer inline in the completion (host IO), else the output arena
    uint64_t area = 0;           // the bytes of answer its copies may read
  };
  Plan MakePlan(const LaneRequest& d, uint64_t hidden_bytes, bool copies_follow) const;  // needs mu_
  // Checks `copies` against the plan's answer and merges adjacent ones (INVALID_ARGUMENT naming a
  // piece outside it).
  static LaneError MergeCopies(const Plan& p, const CopyOut* copies, uint32_t n, CopyOut* merged, uint32_t* n_merged);
  LaneError SubmitLocked(std::unique_lock<std::mutex>& l, const Plan& p, uint64_t hidden, uint64_t hidden_bytes,
                         void* stream, int64_t deadline_ns, uint64_t* seq);
  LaneError FinishLocked(std::unique_lock<std::mutex>& l, uint64_t seq, const CopyOut* merged, uint32_t n_merged,
                         bool wait, int64_t deadline_ns);
  // Releases the answered calls, oldest first, keeping the first failure in deferred_; blocks for
  // each one up to `through` (UINT64_MAX: none), and for a submitted one's Finish (another
  // thread's; l is released meanwhile). A wait that fails drops its call (abandoned).
  LaneError Settle(std::unique_lock<std::mutex>& l, uint64_t through, int64_t deadline_ns);
  // The ring's slot holder (LaneRing::SetSlotHolder): a host call needs the slot of stream-ordered
  // call `seq`; settles through it unless a stream-ordered call holds mu_ (false).
  bool Reclaim(uint64_t seq, int64_t deadline_ns);
  LaneError TakeDeferred();
  void LoadCopyKernel();
  void RegisterHostArena();  // host IO's registration (SetHostIo); sets host_io_error_ if it fails
  bool CopyKernelUsable(uint64_t bytes) const;
  int LaunchCopy(const LaneCopyArgs& args, void* stream);  // a CUresult
  static constexpr unsigned kCopyThreads = 512;  // the kernel's one CTA

  LaneRing* ring_ = nullptr;
  void* registered_ = nullptr;
  unsigned long long device_base_ = 0;
  uint64_t hidden_arena_ = 0;
  uint64_t output_arena_ = 0;
  // A word a slot in host memory mapped for the device: a call's stream writes (seq + 1) there once
  // its copies out of the slot are done, and the slot's next call, if on another stream, waits for
  // it before its fence (so the server cannot overwrite an answer not yet copied out).
  uint32_t* consumed_ = nullptr;
  bool consumed_registered_ = false;
  unsigned long long consumed_device_ = 0;
  struct SlotCall {          // each slot's last stream-ordered call (guarded by mu_)
    void* stream = nullptr;  // its stream
    uint64_t consumed = 0;   // its seq + 1 if it writes the consumed word; 0: none
    uint64_t open = 0;       // its seq + 1 between Submit and Finish; 0: finished
    Plan plan;               // while open: what Finish needs
  };
  std::vector<SlotCall> slots_;
  std::mutex mu_;
  std::condition_variable finished_;  // an open call's Finish ran
  std::deque<uint64_t> pending_;  // submitted, answer not yet seen by the host (oldest first)
  LaneError deferred_;            // the first failure among them, returned by the next call
  void* context_ = nullptr;   // the CUcontext current at Attach (the module's)
  void* module_ = nullptr;    // CUmodule of the copy kernel; nullptr: not loaded
  void* copy_fn_ = nullptr;   // its CUfunction
  bool use_copy_kernel_ = false;  // on once loaded at Attach; guarded by mu_ after Attach
  // Host IO (SetHostIo): the host arena's hidden areas registered with the device at Attach.
  void* arena_registered_ = nullptr;
  unsigned long long arena_device_ = 0;  // the device address of hidden_area(0); 0: not registered
  bool use_host_io_ = false;             // guarded by mu_ after Attach
  std::string host_io_error_;            // why it is not available
  std::string copy_kernel_error_;  // why it is not loaded
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace drafthead::lane
