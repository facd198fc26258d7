#include "client/lane/lane_c_api.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "client/lane/lane_cuda.h"
#include "client/lane/lane_ring.h"
#include "common/lane/doorbell.h"

using drafthead::lane::LaneError;
using drafthead::lane::LaneRing;

struct dh_lane {
  std::unique_ptr<LaneRing> ring;
  std::unique_ptr<drafthead::lane::LaneCuda> cuda;  // goes first (it unregisters the ring's memory)

  ~dh_lane() { cuda.reset(); }
};

namespace {

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
  return new dh_lane{std::move(ring), nullptr};
}

DH_EXPORT void dh_lane_destroy(dh_lane* lane) { delete lane; }
DH_EXPORT const char* dh_lane_key(const dh_lane* l) { return l->ring->key().c_str(); }
DH_EXPORT uint64_t dh_lane_bytes(const dh_lane* l) { return l->ring->bytes(); }
DH_EXPORT uint64_t dh_lane_nonce(const dh_lane* l) { return l->ring->nonce(); }
DH_EXPORT const char* dh_lane_arena_key(const dh_lane* l) { return l->ring->arena_key().c_str(); }
DH_EXPORT uint64_t dh_lane_arena_bytes(const dh_lane* l) { return l->ring->arena_bytes(); }
DH_EXPORT uint32_t dh_lane_depth(const dh_lane* l) { return l->ring->depth(); }
DH_EXPORT uint32_t dh_lane_inline_bytes(const dh_lane* l) { return l->ring->inline_bytes(); }
DH_EXPORT void dh_lane_unlink(dh_lane* l) { l->ring->Unlink(); }
DH_EXPORT int dh_lane_attach(dh_lane* l, int server_pid, char* msg, size_t msg_len) {
  return Report(l->ring->Attach(server_pid), msg, msg_len);
}
DH_EXPORT void* dh_lane_hidden_area(const dh_lane* l, uint32_t slot) { return l->ring->hidden_area(slot); }
DH_EXPORT uint64_t dh_lane_hidden_offset(const dh_lane* l, uint32_t slot) { return l->ring->hidden_area_offset(slot); }
DH_EXPORT void* dh_lane_output_area(const dh_lane* l, uint32_t slot) { return l->ring->output_area(slot); }
DH_EXPORT uint64_t dh_lane_output_offset(const dh_lane* l, uint32_t slot) { return l->ring->output_area_offset(slot); }

DH_EXPORT int dh_lane_reserve(dh_lane* l, int64_t timeout_ns, uint64_t* seq, char* msg, size_t msg_len) {
  return Report(l->ring->Reserve(Deadline(timeout_ns), seq), msg, msg_len);
}

DH_EXPORT void dh_lane_publish(dh_lane* l, uint64_t seq, const void* request) {
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  l->ring->Publish(seq, d);
}

DH_EXPORT int dh_lane_wait(dh_lane* l, uint64_t seq, int64_t timeout_ns, const void** completion, char* msg,
                           size_t msg_len) {
  const drafthead::lane::LaneCompletion* c = nullptr;
  const int code = Report(l->ring->Wait(seq, Deadline(timeout_ns), &c), msg, msg_len);
  *completion = c;
  return code;
}

DH_EXPORT void dh_lane_release(dh_lane* l, uint64_t seq) { l->ring->Release(seq); }

DH_EXPORT int dh_lane_done(const dh_lane* l, uint64_t seq) { return l->ring->Done(seq) ? 1 : 0; }
DH_EXPORT const void* dh_lane_completion(const dh_lane* l, uint64_t seq) {
  return l->ring->completion(seq);
}

DH_EXPORT int64_t dh_lane_call(dh_lane* l, const void* request, const void* hidden, uint64_t hidden_bytes,
                               int64_t timeout_ns, char* msg, size_t msg_len) {
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  const int64_t deadline = Deadline(timeout_ns);
  uint64_t seq = 0;
  if (LaneError e = l->ring->Submit(d, hidden, hidden_bytes, deadline, &seq); !e.ok()) return -Report(e, msg, msg_len);
  const drafthead::lane::LaneCompletion* c = nullptr;
  // A failed wait abandons the slot (reclaimed once answered): nothing for the caller to release.
  if (LaneError e = l->ring->Wait(seq, deadline, &c); !e.ok()) return -Report(e, msg, msg_len);
  return static_cast<int64_t>(seq);
}

DH_EXPORT int dh_lane_cuda_attach(dh_lane* l, uint64_t hidden_arena, uint64_t output_arena, char* msg,
                                  size_t msg_len) {
  if (l->cuda != nullptr) return 0;
  auto cuda = std::make_unique<drafthead::lane::LaneCuda>();
  const int code = Report(cuda->Attach(l->ring.get(), hidden_arena, output_arena), msg, msg_len);
  if (code == 0) l->cuda = std::move(cuda);
  return code;
}

DH_EXPORT int64_t dh_lane_call_stream(dh_lane* l, const void* request, uint64_t hidden, uint64_t hidden_bytes,
                                      void* stream, int wait, int64_t timeout_ns, const uint64_t* copies,
                                      uint32_t n_copies, char* msg, size_t msg_len) {
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
  if (l->cuda == nullptr) return -Report(LaneError{9, "dh_lane_cuda_attach first"}, msg, msg_len);
  drafthead::lane::LaneRequest d;
  std::memcpy(&d, request, sizeof d);
  uint64_t seq = 0;
  if (LaneError e = l->cuda->Submit(d, hidden, hidden_bytes, stream, copies_follow != 0, Deadline(timeout_ns), &seq);
      !e.ok())
    return -Report(e, msg, msg_len);
  return static_cast<int64_t>(seq);
}

DH_EXPORT int dh_lane_finish_stream(dh_lane* l, uint64_t seq, const uint64_t* copies, uint32_t n_copies, int wait,
                                    int64_t timeout_ns, char* msg, size_t msg_len) {
  if (l->cuda == nullptr) return Report(LaneError{9, "dh_lane_cuda_attach first"}, msg, msg_len);
  const CopyOuts out(copies, n_copies);  // an excess piece: Finish names it and still finishes
  return Report(l->cuda->Finish(seq, out.piece, out.n, wait != 0, Deadline(timeout_ns)), msg, msg_len);
}

namespace {

// A stream-ordered calls' switch (LaneCuda::SetCopyKernel, SetHostIo): 1 while on; msg: why it is
// not available ("" when it is).
int CudaSwitch(dh_lane* l, int use, char* msg, size_t msg_len,
               bool (drafthead::lane::LaneCuda::*set)(int, std::string*)) {
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
  if (l->cuda == nullptr) return 0;  // no stream-ordered call was ever made
  return Report(l->cuda->Synchronize(Deadline(timeout_ns)), msg, msg_len);
}
