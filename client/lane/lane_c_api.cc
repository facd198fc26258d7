#include "client/lane/lane_c_api.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "client/lane/lane_cuda.h"
#include "client/lane/lane_ring.h"
#include "common/lane/doorbell.h"

using drafthead::lane::LaneError;
using drafthead::lane::LaneRing;

// A handle's lifetime. dh_lane_destroy may run while other threads are inside an entry or hold
// an answer (a seq between a call and its release or finish), so the ring and the CUDA side go
// with the last of them, and the handle's own few bytes are never freed: an entry that races the
// destroy finds it closed (UNAVAILABLE, or an empty value) instead of freed memory.
struct dh_lane {
  std::unique_ptr<LaneRing> ring;
  std::unique_ptr<drafthead::lane::LaneCuda> cuda;  // freed first (it unregisters the ring's memory)
  // kClosed | kFreed | the count: 1 for the owner until dh_lane_destroy, 1 for each thread inside
  // an entry, 1 for each answer held.
  std::atomic<uint64_t> state{1};
};

namespace {

constexpr uint64_t kClosed = uint64_t{1} << 62, kFreed = uint64_t{1} << 63, kCount = kClosed - 1;

// The last one out: the device's last reads of the lane's memory are awaited, then both go. Where
// the device may still read it (a stream stuck behind other work for 2 s), both are kept instead.
void Free(dh_lane* l) {
  if (l->cuda != nullptr && !l->cuda->Drain(drafthead::lane::MonotonicNanos() + 2'000'000'000)) {
    (void)l->cuda.release();
    (void)l->ring.release();
    return;
  }
  l->cuda.reset();
  l->ring.reset();
}

void Drop(dh_lane* l) {
  uint64_t now = l->state.fetch_sub(1, std::memory_order_acq_rel) - 1;
  // Freed only by the one whose drop made the count 0 and who marks it so before anyone enters.
  if ((now & kCount) == 0 && (now & kFreed) == 0 &&
      l->state.compare_exchange_strong(now, now | kFreed, std::memory_order_acq_rel))
    Free(l);
}

// One thread inside an entry (or holding an answer past it, Keep). ok(): the lane may be used,
// for `work` (a new call) only while open; else the entry returns its closed-lane value.
class Use {
 public:
  Use(const dh_lane* l, bool work) : l_(const_cast<dh_lane*>(l)) {
    const uint64_t was = l_->state.fetch_add(1, std::memory_order_acq_rel);
    if ((was & kFreed) != 0) {
      l_ = nullptr;  // gone: the count means nothing any more
      return;
    }
    ok_ = !work || (was & kClosed) == 0;
  }
  ~Use() {
    if (l_ != nullptr) Drop(l_);
  }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  bool ok() const { return ok_; }
  // The count stays with an answer the caller now holds (Drop at its release or finish).
  void Keep() { l_ = nullptr; }

 private:
  dh_lane* l_;
  bool ok_ = false;
};

const LaneError kClosedLane{14, "the lane is closed (dh_lane_destroy)"};

int Report(const LaneError& e, char* msg, size_t msg_len) {
  if (msg != nullptr && msg_len > 0) {
    const size_t n = std::min(msg_len - 1, e.message.size());
    std::memcpy(msg, e.message.data(), n);
    msg[n] = '\0';
  }
  return e.code;
}

int64_t Deadline(int64_t timeout_ns) {
  return timeout_ns < 0 ? INT64_MAX : drafthead::lane::MonotonicNanos() + timeout_ns;
}

using drafthead::lane::LaneCuda;
// The C ABI's copy triples (destination, offset, bytes) as CopyOuts: at most kMaxCopies + 1 of
// them (one more than a call takes, so that LaneCuda names the excess); none without an array.
struct CopyOuts {
  LaneCuda::CopyOut piece[LaneCuda::kMaxCopies + 1];
  uint32_t n = 0;
  CopyOuts(const uint64_t* copies, uint32_t n_copies) {
    n = copies == nullptr ? 0 : std::min<uint32_t>(n_copies, LaneCuda::kMaxCopies + 1);
    for (uint32_t i = 0; i < n; ++i) piece[i] = {copies[3 * i], copies[3 * i + 1], copies[3 * i + 2]};
  }
};

}  // namespace

#define DH_EXPORT extern "C" __attribute__((visibility("default")))

DH_EXPORT uint32_t dh_lane_abi_version(void) { return DH_LANE_ABI_VERSION; }
DH_EXPORT uint32_t dh_lane_layout_version(void) { return drafthead::lane::kLaneLayoutVersion; }

DH_EXPORT dh_lane* dh_lane_create(uint32_t depth, uint32_t inline_bytes, uint64_t hidden_slot_bytes,
                                  uint64_t output_slot_bytes, int64_t spin_ns, int* code, char* msg,
                                  size_t msg_len) {
  drafthead::lane::LaneRingConfig c;
  c.depth = depth;
  c.inline_bytes = inline_bytes;
  c.hidden_slot_bytes = hidden_slot_bytes;
  c.output_slot_bytes = output_slot_bytes;
  c.spin_ns = spin_ns;
  LaneError e;
  std::unique_ptr<LaneRing> ring = LaneRing::Create(c, &e);
  *code = Report(e, msg, msg_len);
  if (ring == nullptr) return nullptr;
  auto* l = new dh_lane;
  l->ring = std::move(ring);
  return l;
}

DH_EXPORT void dh_lane_destroy(dh_lane* l) {
  if (l == nullptr) return;
  const uint64_t was = l->state.fetch_or(kClosed, std::memory_order_acq_rel);
  if ((was & (kClosed | kFreed)) != 0) return;  // a second destroy
  {
    // The handle stays allocated on purpose; listed here, a leak checker sees it held.
    static std::mutex mu;
    static auto* closed = new std::vector<dh_lane*>;
    std::lock_guard<std::mutex> g(mu);
    closed->push_back(l);
  }
  l->ring->Close();  // the owner's count keeps it: waiters in other threads end with UNAVAILABLE
  Drop(l);
}

// Accessors: what the lane was made with, while it is there (empty values once it is gone).
#define DH_LANE_GET(value, gone) \
  Use use(l, false);             \
  return use.ok() ? (value) : (gone)
DH_EXPORT const char* dh_lane_key(const dh_lane* l) { DH_LANE_GET(l->ring->key().c_str(), ""); }
DH_EXPORT uint64_t dh_lane_bytes(const dh_lane* l) { DH_LANE_GET(l->ring->bytes(), 0); }
DH_EXPORT uint64_t dh_lane_nonce(const dh_lane* l) { DH_LANE_GET(l->ring->nonce(), 0); }
DH_EXPORT const char* dh_lane_arena_key(const dh_lane* l) { DH_LANE_GET(l->ring->arena_key().c_str(), ""); }
DH_EXPORT uint64_t dh_lane_arena_bytes(const dh_lane* l) { DH_LANE_GET(l->ring->arena_bytes(), 0); }
DH_EXPORT uint32_t dh_lane_depth(const dh_lane* l) { DH_LANE_GET(l->ring->depth(), 0); }
DH_EXPORT uint32_t dh_lane_inline_bytes(const dh_lane* l) { DH_LANE_GET(l->ring->inline_bytes(), 0); }
DH_EXPORT void* dh_lane_hidden_area(const dh_lane* l, uint32_t slot) {
  DH_LANE_GET(l->ring->hidden_area(slot), nullptr);
}
DH_EXPORT uint64_t dh_lane_hidden_offset(const dh_lane* l, uint32_t slot) {
  DH_LANE_GET(l->ring->hidden_area_offset(slot), 0);
}
DH_EXPORT void* dh_lane_output_area(const dh_lane* l, uint32_t slot) {
  DH_LANE_GET(l->ring->output_area(slot), nullptr);
}
DH_EXPORT uint64_t dh_lane_output_offset(const dh_lane* l, uint32_t slot) {
  DH_LANE_GET(l->ring->output_area_offset(slot), 0);
}
DH_EXPORT int dh_lane_done(const dh_lane* l, uint64_t seq) { DH_LANE_GET(l->ring->Done(seq) ? 1 : 0, 1); }
DH_EXPORT const void* dh_lane_completion(const dh_lane* l, uint64_t seq) {
  DH_LANE_GET(l->ring->completion(seq), nullptr);
}
#undef DH_LANE_GET

DH_EXPORT void dh_lane_unlink(dh_lane* l) {
  Use use(l, false);
  if (use.ok()) l->ring->Unlink();
}

DH_EXPORT int dh_lane_attach(dh_lane* l, int server_pid, char* msg, size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return Report(kClosedLane, msg, msg_len);
  return Report(l->ring->Attach(server_pid), msg, msg_len);
}

DH_EXPORT int dh_lane_reserve(dh_lane* l, int64_t timeout_ns, uint64_t* seq, char* msg, size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return Report(kClosedLane, msg, msg_len);
  const int code = Report(l->ring->Reserve(Deadline(timeout_ns), seq), msg, msg_len);
  if (code == 0) use.Keep();  // until the seq's release (or a failed wait)
  return code;
}

DH_EXPORT void dh_lane_publish(dh_lane* l, uint64_t seq, const void* request) {
  Use use(l, false);  // the reserve's count keeps the ring
  if (!use.ok()) return;
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  l->ring->Publish(seq, d);
}

DH_EXPORT int dh_lane_wait(dh_lane* l, uint64_t seq, int64_t timeout_ns, const void** completion, char* msg,
                           size_t msg_len) {
  Use use(l, false);
  *completion = nullptr;
  if (!use.ok()) return Report(kClosedLane, msg, msg_len);
  const drafthead::lane::LaneCompletion* c = nullptr;
  const int code = Report(l->ring->Wait(seq, Deadline(timeout_ns), &c), msg, msg_len);
  *completion = c;
  if (code != 0) Drop(l);  // the slot was abandoned: nothing left to release
  return code;
}

DH_EXPORT void dh_lane_release(dh_lane* l, uint64_t seq) {
  Use use(l, false);
  if (!use.ok()) return;
  l->ring->Release(seq);
  Drop(l);  // the answer's count
}

DH_EXPORT int64_t dh_lane_call(dh_lane* l, const void* request, const void* hidden, uint64_t hidden_bytes,
                               int64_t timeout_ns, char* msg, size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return -Report(kClosedLane, msg, msg_len);
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  const int64_t deadline = Deadline(timeout_ns);
  uint64_t seq = 0;
  if (LaneError e = l->ring->Submit(d, hidden, hidden_bytes, deadline, &seq); !e.ok()) return -Report(e, msg, msg_len);
  const drafthead::lane::LaneCompletion* c = nullptr;
  // A failed wait abandons the slot (reclaimed once answered): nothing for the caller to release.
  if (LaneError e = l->ring->Wait(seq, deadline, &c); !e.ok()) return -Report(e, msg, msg_len);
  use.Keep();  // until dh_lane_release(seq): the answer is read in the lane's memory
  return static_cast<int64_t>(seq);
}

DH_EXPORT int dh_lane_cuda_attach(dh_lane* l, uint64_t hidden_arena, uint64_t output_arena, char* msg,
                                  size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return Report(kClosedLane, msg, msg_len);
  if (l->cuda != nullptr) return 0;
  auto cuda = std::make_unique<drafthead::lane::LaneCuda>();
  const int code = Report(cuda->Attach(l->ring.get(), hidden_arena, output_arena), msg, msg_len);
  if (code == 0) l->cuda = std::move(cuda);
  return code;
}

DH_EXPORT int64_t dh_lane_call_stream(dh_lane* l, const void* request, uint64_t hidden, uint64_t hidden_bytes,
                                      void* stream, int wait, int64_t timeout_ns, const uint64_t* copies,
                                      uint32_t n_copies, char* msg, size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return -Report(kClosedLane, msg, msg_len);
  if (n_copies > LaneCuda::kMaxCopies || (n_copies > 0 && copies == nullptr))
    return -Report(LaneError{3, "copies: at most " + std::to_string(LaneCuda::kMaxCopies) + " triples"}, msg, msg_len);
  if (l->cuda == nullptr) return -Report(LaneError{9, "dh_lane_cuda_attach first"}, msg, msg_len);
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  const CopyOuts out(copies, n_copies);
  uint64_t seq = 0;
  if (LaneError e = l->cuda->Call(d, hidden, hidden_bytes, stream, wait != 0, Deadline(timeout_ns), out.piece, out.n,
                                  &seq);
      !e.ok())
    return -Report(e, msg, msg_len);
  return static_cast<int64_t>(seq);
}

DH_EXPORT int64_t dh_lane_submit_stream(dh_lane* l, const void* request, uint64_t hidden, uint64_t hidden_bytes,
                                        void* stream, int copies_follow, int64_t timeout_ns, char* msg,
                                        size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return -Report(kClosedLane, msg, msg_len);
  if (l->cuda == nullptr) return -Report(LaneError{9, "dh_lane_cuda_attach first"}, msg, msg_len);
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  uint64_t seq = 0;
  if (LaneError e = l->cuda->Submit(d, hidden, hidden_bytes, stream, copies_follow != 0, Deadline(timeout_ns), &seq);
      !e.ok())
    return -Report(e, msg, msg_len);
  use.Keep();  // until its finish: the call holds its slot
  return static_cast<int64_t>(seq);
}

DH_EXPORT int dh_lane_finish_stream(dh_lane* l, uint64_t seq, const uint64_t* copies, uint32_t n_copies, int wait,
                                    int64_t timeout_ns, char* msg, size_t msg_len) {
  Use use(l, false);  // after a destroy too: the submit's count goes with its finish
  if (!use.ok()) return Report(kClosedLane, msg, msg_len);
  if (l->cuda == nullptr) return Report(LaneError{9, "dh_lane_cuda_attach first"}, msg, msg_len);
  if (!l->cuda->Open(seq))
    return Report(LaneError{3, "seq " + std::to_string(seq) + " is not a submitted stream-ordered call awaiting its finish"},
                  msg, msg_len);
  const CopyOuts out(copies, n_copies);  // an excess piece: Finish names it and still finishes
  const int code = Report(l->cuda->Finish(seq, out.piece, out.n, wait != 0, Deadline(timeout_ns)), msg, msg_len);
  Drop(l);  // the submit's count
  return code;
}

namespace {

// A stream-ordered calls' switch (LaneCuda::SetCopyKernel, SetHostIo): 1 while on; msg: why it is
// not available ("" when it is).
int CudaSwitch(dh_lane* l, int use, char* msg, size_t msg_len,
               bool (drafthead::lane::LaneCuda::*set)(int, std::string*)) {
  Use in(l, true);
  if (!in.ok()) {
    Report(kClosedLane, msg, msg_len);
    return 0;
  }
  if (l->cuda == nullptr) {
    Report(LaneError{9, "dh_lane_cuda_attach first"}, msg, msg_len);
    return 0;
  }
  std::string why;
  const bool on = (l->cuda.get()->*set)(use, &why);
  Report(LaneError{0, why}, msg, msg_len);
  return on ? 1 : 0;
}

}  // namespace

DH_EXPORT int dh_lane_cuda_copy_kernel(dh_lane* l, int use, char* msg, size_t msg_len) {
  return CudaSwitch(l, use, msg, msg_len, &drafthead::lane::LaneCuda::SetCopyKernel);
}

DH_EXPORT int dh_lane_cuda_host_io(dh_lane* l, int use, char* msg, size_t msg_len) {
  return CudaSwitch(l, use, msg, msg_len, &drafthead::lane::LaneCuda::SetHostIo);
}

DH_EXPORT int dh_lane_stream_synchronize(dh_lane* l, int64_t timeout_ns, char* msg, size_t msg_len) {
  Use use(l, true);
  if (!use.ok()) return Report(kClosedLane, msg, msg_len);
  if (l->cuda == nullptr) return 0;  // no stream-ordered call was ever made
  return Report(l->cuda->Synchronize(Deadline(timeout_ns)), msg, msg_len);
}
