#include "client/lane/lane_ring.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <climits>
#include <cstring>
#include <random>

#include "common/lane/doorbell.h"

namespace drafthead::lane {
namespace {

LaneError Err(int code, std::string message) { return LaneError{code, std::move(message)}; }
constexpr int kDeadlineExceeded = 4, kResourceExhausted = 8, kInternal = 13, kUnavailable = 14;
constexpr int kInvalidArgument = 3;
constexpr int64_t kSleepSliceNs = 20'000'000;  // a sleeping waiter checks the server this often
// kSpinAuto's budget (Wait): before the first answer, and the bounds of 1.5x the recent wait.
constexpr int64_t kAutoSpinFirstNs = 200'000, kAutoSpinMinNs = 50'000, kAutoSpinMaxNs = 2'000'000;

uint64_t RandomU64() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// Creates a fresh 0600 object of `bytes` under a unique name and maps it.
uint8_t* CreateObject(const char* kind, uint64_t nonce, uint64_t bytes, std::string* key, LaneError* err) {
  *key = "/drafthead-" + std::string(kind) + "-" + std::to_string(getpid()) + "-" + std::to_string(nonce);
  const int fd = shm_open(key->c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    *err = Err(kInternal, "shm_open " + *key + ": " + std::strerror(errno));
    return nullptr;
  }
  fchmod(fd, 0600);  // whatever the umask
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    *err = Err(kResourceExhausted, "ftruncate " + *key + " to " + std::to_string(bytes) + " bytes: " +
                                       std::strerror(errno) + " (is /dev/shm large enough?)");
    close(fd);
    shm_unlink(key->c_str());
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *err = Err(kInternal, "mmap " + *key + ": " + std::strerror(errno));
    shm_unlink(key->c_str());
    return nullptr;
  }
  return static_cast<uint8_t*>(p);
}

uint32_t PowerOfTwoAtLeast(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

std::unique_ptr<LaneRing> LaneRing::Create(const LaneRingConfig& config, LaneError* error) {
  *error = {};
  if (config.depth == 0 || config.depth > kMaxDepth) {
    *error = Err(kInvalidArgument, "depth must be in 1.." + std::to_string(kMaxDepth));
    return nullptr;
  }
  if (config.inline_bytes > kMaxInlineBytes) {
    *error = Err(kInvalidArgument, "inline_bytes must be <= " + std::to_string(kMaxInlineBytes));
    return nullptr;
  }
  std::unique_ptr<LaneRing> r(new LaneRing());
  r->config_ = config;
  r->depth_ = PowerOfTwoAtLeast(config.depth);
  r->inline_bytes_ = static_cast<uint32_t>(RoundUp(config.inline_bytes, 64));
  r->geo_ = GeometryFor(r->depth_, r->inline_bytes_);
  r->nonce_ = RandomU64();
  r->bytes_ = r->geo_.total_bytes;
  r->base_ = CreateObject("lane", r->nonce_, r->bytes_, &r->key_, error);
  if (r->base_ == nullptr) return nullptr;
  r->arena_bytes_ = uint64_t{r->depth_} * (config.hidden_slot_bytes + config.output_slot_bytes);
  if (r->arena_bytes_ > 0) {
    r->arena_ = CreateObject("arena", r->nonce_, r->arena_bytes_, &r->arena_key_, error);
    if (r->arena_ == nullptr) return nullptr;
  }
  auto* h = reinterpret_cast<LaneHeader*>(r->base_);  // fresh zero pages
  h->magic = kLaneMagic;
  h->version = kLaneLayoutVersion;
  h->header_bytes = kHeaderBytes;
  h->nonce = r->nonce_;
  h->total_bytes = r->geo_.total_bytes;
  h->depth = r->depth_;
  h->inline_bytes = r->inline_bytes_;
  h->request_bytes = sizeof(LaneRequest);
  h->completion_bytes = static_cast<uint32_t>(r->geo_.completion_bytes);
  h->requests_offset = r->geo_.requests_offset;
  h->completions_offset = r->geo_.completions_offset;
  h->client_pid = getpid();
  r->hdr_ = h;
  r->state_.assign(r->depth_, kFree);
  r->copied_out_.assign(r->depth_, {});
  r->slot_seq_.assign(r->depth_, 0);
  return r;
}

LaneRing::~LaneRing() {
  if (hdr_ != nullptr) {
    // A server thread may be spinning on us: say we are gone (the pidfd tells it too).
    hdr_->client_pid = 0;
  }
  Unlink();
  if (base_ != nullptr) munmap(base_, bytes_);
  if (arena_ != nullptr) munmap(arena_, arena_bytes_);
  if (server_pidfd_ >= 0) close(server_pidfd_);
}

void LaneRing::Unlink() {
  if (!linked_) return;
  linked_ = false;
  if (!key_.empty()) shm_unlink(key_.c_str());
  if (!arena_key_.empty()) shm_unlink(arena_key_.c_str());
}

LaneError LaneRing::Attach(int server_pid) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, server_pid, 0));
  if (fd < 0)
    return Err(kUnavailable, "cannot watch the server process " + std::to_string(server_pid) + ": " +
                                 std::strerror(errno) + " (not in this PID namespace?)");
  server_pidfd_ = fd;
  return {};
}

uint8_t* LaneRing::hidden_area(uint32_t slot) const { return arena_ + hidden_area_offset(slot); }
uint8_t* LaneRing::output_area(uint32_t slot) const { return arena_ + output_area_offset(slot); }

LaneError LaneRing::CheckServer() const {
  if (closed_.load(std::memory_order_acquire)) return Err(kUnavailable, "the lane is closed (on this side)");
  if (hdr_->server_state.load(std::memory_order_acquire) == kServerClosed)
    return Err(kUnavailable, "the server closed the lane");
  if (server_pidfd_ >= 0) {
    pollfd p{server_pidfd_, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) return Err(kUnavailable, "the server process exited");
  }
  return {};
}

LaneError LaneRing::Reserve(int64_t deadline_ns, uint64_t* seq, bool host) {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    const uint64_t n = next_seq_;
    const uint32_t slot = static_cast<uint32_t>(n % depth_);
    if (state_[slot] == kAbandoned && Done(slot_seq_[slot])) state_[slot] = kFree;
    ConsumedWord& cw = copied_out_[slot];
    const bool copied_out = !host || cw.passed();
    if (state_[slot] == kFree && copied_out) {
      state_[slot] = kBusy;
      busy_.fetch_add(1, std::memory_order_relaxed);
      slot_seq_[slot] = n;
      if (host) cw = {};
      ++next_seq_;
      *seq = n;
      return {};
    }
    LaneError s = CheckServer();
    if (!s.ok()) return s;
    const int64_t left = deadline_ns - MonotonicNanos();
    if (left <= 0)
      return Err(kResourceExhausted, "all " + std::to_string(depth_) +
                                         " lane slots still hold answers not yet read (deadline passed)");
    if (state_[slot] == kBusy && host && reclaim_) {
      // Held by a stream-ordered call whose answer its holder has not looked at yet: ask for it
      // back now (its next call, which would, may never come).
      const auto reclaim = reclaim_;
      const uint64_t held = slot_seq_[slot];
      l.unlock();
      const bool released = reclaim(held, deadline_ns);
      l.lock();
      if (released) continue;
    }
    // An abandoned slot frees itself, and a GPU stream marks an answer copied out, without a
    // notify: look again at least every slice (a short one for the copy-out, microseconds away).
    const int64_t slice = state_[slot] == kFree ? 20'000 : 1'000'000;
    slot_freed_.wait_for(l, std::chrono::nanoseconds(std::min<int64_t>(left, slice)));
  }
}

void LaneRing::Close() {
  closed_.store(true, std::memory_order_seq_cst);
  // Waiters sleep on cq_count (Wait) or on slot_freed_ (Reserve); both look at CheckServer when
  // they wake.
  if (hdr_->client_sleeping.load(std::memory_order_seq_cst) != 0) FutexWake(&hdr_->cq_count, INT32_MAX);
  std::lock_guard<std::mutex> l(mu_);
  slot_freed_.notify_all();
}

uint64_t LaneRing::NextSeq() {
  std::lock_guard<std::mutex> l(mu_);
  return next_seq_;
}

bool LaneRing::AwaitCopiedOut(int64_t deadline_ns) {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (std::all_of(copied_out_.begin(), copied_out_.end(), [](const ConsumedWord& cw) { return cw.passed(); }))
      return true;
    const int64_t left = deadline_ns - MonotonicNanos();
    if (left <= 0) return false;
    // The device writes the words without a notify: look again every 20 us.
    slot_freed_.wait_for(l, std::chrono::nanoseconds(std::min<int64_t>(left, 20'000)));
  }
}

void LaneRing::ExpectConsumed(uint32_t slot, const uint32_t* word, uint32_t value) {
  std::lock_guard<std::mutex> l(mu_);
  copied_out_[slot % depth_] = {word, value};
}

void LaneRing::SetSlotHolder(std::function<bool(uint64_t, int64_t)> reclaim) {
  std::lock_guard<std::mutex> l(mu_);
  reclaim_ = std::move(reclaim);
}

void LaneRing::Publish(uint64_t seq, const LaneRequest& d) {
  LaneRequest* dst = RequestSlot(base_, geo_, depth_, seq);
  // Everything but the fence word: a GPU stream may already have written it (stream-ordered calls
  // fence before they publish), and a stale value there is harmless (it names an older seq).
  std::memcpy(dst, &d, offsetof(LaneRequest, fence));
  std::memcpy(dst->reserved, d.reserved, sizeof d.reserved);
  dst->seq = seq;
  std::lock_guard<std::mutex> l(mu_);
  // Descriptors become visible in submission order: sq_tail moves past every filled slot.
  filled_.insert(seq);
  while (!filled_.empty() && *filled_.begin() == published_) {
    filled_.erase(filled_.begin());
    ++published_;
  }
  hdr_->sq_tail.store(static_cast<uint32_t>(published_), std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (hdr_->server_sleeping.load(std::memory_order_relaxed) != 0) FutexWake(&hdr_->sq_tail, 1);
}

LaneError LaneRing::CheckSlotSlices(const LaneRequest& d) const {
  auto fits = [](const LaneSlice& s, uint64_t area) {
    return s.region == kNoRegion || (s.offset <= area && s.byte_size <= area - s.offset);
  };
  if (!fits(d.hidden, config_.hidden_slot_bytes))
    return Err(kInvalidArgument, "hidden: " + std::to_string(d.hidden.offset + d.hidden.byte_size) +
                                     " bytes exceed the lane's " + std::to_string(config_.hidden_slot_bytes) +
                                     " a slot (rows beyond max_rows?)");
  if (!fits(d.output, config_.output_slot_bytes))
    return Err(kInvalidArgument, "output: " + std::to_string(d.output.offset + d.output.byte_size) +
                                     " bytes exceed the lane's " + std::to_string(config_.output_slot_bytes) +
                                     " a slot");
  return {};
}

uint64_t LaneRing::slot_offset(const LaneSlice& s, bool output, uint32_t slot) const {
  if (!output) return uint64_t{slot} * config_.hidden_slot_bytes;
  return s.region == 0 ? output_area_offset(slot) : uint64_t{slot} * config_.output_slot_bytes;
}

void LaneRing::PublishInSlot(uint64_t seq, LaneRequest d) {
  const uint32_t slot = static_cast<uint32_t>(seq % depth_);
  if (d.hidden.region != kNoRegion) d.hidden.offset += slot_offset(d.hidden, false, slot);
  if (d.output.region != kNoRegion) d.output.offset += slot_offset(d.output, true, slot);
  Publish(seq, d);
}

LaneError LaneRing::Submit(LaneRequest d, const void* hidden, uint64_t hidden_bytes, int64_t deadline_ns,
                           uint64_t* seq) {
  d.hidden = LaneSlice{0, 0, 0, hidden_bytes};  // the rows, in the slot's arena hidden area
  if (LaneError e = CheckSlotSlices(d); !e.ok()) return e;
  if (LaneError e = Reserve(deadline_ns, seq); !e.ok()) return e;
  if (hidden_bytes > 0) std::memcpy(hidden_area(static_cast<uint32_t>(*seq % depth_)), hidden, hidden_bytes);
  PublishInSlot(*seq, d);
  return {};
}

void LaneRing::Cancel(uint64_t seq) {
  LaneRequest d{};
  d.hidden.region = d.output.region = kNoRegion;  // no rows: refused INVALID_ARGUMENT (`hidden`), nothing read
  Publish(seq, d);
  Abandon(seq);
}

bool LaneRing::Done(uint64_t seq) const {
  return completion(seq)->done_seq.load(std::memory_order_acquire) == seq + 1;
}

int64_t LaneRing::SpinBudgetNs(bool alone) const {
  if (config_.spin_ns != kSpinAuto) return std::max<int64_t>(config_.spin_ns, 0);
  const int64_t recent = recent_wait_ns_.load(std::memory_order_relaxed);
  if (recent == 0 || !alone) return kAutoSpinFirstNs;
  return std::clamp(recent + recent / 2, kAutoSpinMinNs, kAutoSpinMaxNs);
}

LaneError LaneRing::Wait(uint64_t seq, int64_t deadline_ns, const LaneCompletion** out) {
  const LaneCompletion* c = completion(seq);
  auto done = [&] { return c->done_seq.load(std::memory_order_acquire) == seq + 1; };
  const int64_t start = MonotonicNanos();
  // A submission alone in its ring waits for the server's answer time; with others it also queues
  // behind them, and spinning through that would take the cores the answers need.
  const bool alone = busy_.load(std::memory_order_relaxed) <= 1;
  const int64_t budget = SpinBudgetNs(alone);
  bool spinning = budget > 0;
  const int64_t spin_until = start + budget;
  auto answered = [&](std::atomic<uint64_t>& how) {
    how.fetch_add(1, std::memory_order_relaxed);
    // The average kSpinAuto spins for: the length of waits alone, a sleeper's wake-up included.
    if (alone) {
      const int64_t took = MonotonicNanos() - start;
      const int64_t recent = recent_wait_ns_.load(std::memory_order_relaxed);
      recent_wait_ns_.store(recent == 0 ? took : recent + (took - recent) / 8, std::memory_order_relaxed);
    }
    *out = c;
    return LaneError{};
  };
  uint32_t polls = 0;
  while (!done()) {
    const int64_t now = (++polls & 63) == 0 || !spinning ? MonotonicNanos() : 0;
    if (now == 0) {
      CpuRelax();
      continue;
    }
    if (now < spin_until) continue;
    spinning = false;
    LaneError s = CheckServer();
    if (!s.ok()) {
      Abandon(seq);
      return s;
    }
    if (now >= deadline_ns) {
      Abandon(seq);
      return Err(kDeadlineExceeded, "no answer from the lane before the deadline");
    }
    const uint32_t seen = hdr_->cq_count.load(std::memory_order_acquire);
    hdr_->client_sleeping.fetch_add(1, std::memory_order_seq_cst);
    if (!done()) FutexWait(&hdr_->cq_count, seen, std::min(deadline_ns - now, kSleepSliceNs));
    hdr_->client_sleeping.fetch_sub(1, std::memory_order_relaxed);
    if (done()) return answered(sleep_waits_);
  }
  return answered(spin_waits_);
}

uint64_t LaneRing::fence_offset(uint64_t seq) const {
  return geo_.requests_offset + (seq % depth_) * sizeof(LaneRequest) + offsetof(LaneRequest, fence);
}

uint64_t LaneRing::done_offset(uint64_t seq) const {
  return geo_.completions_offset + (seq % depth_) * geo_.completion_bytes + offsetof(LaneCompletion, done_seq);
}

void LaneRing::FailOutstanding(const LaneError& why) {
  std::lock_guard<std::mutex> l(mu_);
  for (uint32_t slot = 0; slot < depth_; ++slot) {
    if (state_[slot] == kFree) continue;
    const uint64_t seq = slot_seq_[slot];
    LaneCompletion* c = completion(seq);
    if (c->done_seq.load(std::memory_order_acquire) == seq + 1) continue;
    c->code = why.code;
    const size_t n = std::min<size_t>(why.message.size(), kMessageBytes);
    std::memcpy(c->message, why.message.data(), n);
    c->message_len = static_cast<uint32_t>(n);
    c->rows = 0;
    c->done_seq.store(seq + 1, std::memory_order_release);
  }
}

void LaneRing::Abandon(uint64_t seq) {
  std::lock_guard<std::mutex> l(mu_);
  const uint32_t slot = static_cast<uint32_t>(seq % depth_);
  if (state_[slot] == kBusy && slot_seq_[slot] == seq) {
    state_[slot] = kAbandoned;
    busy_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void LaneRing::Release(uint64_t seq) {
  {
    std::lock_guard<std::mutex> l(mu_);
    const uint32_t slot = static_cast<uint32_t>(seq % depth_);
    if (slot_seq_[slot] == seq) {
      if (state_[slot] == kBusy) busy_.fetch_sub(1, std::memory_order_relaxed);
      state_[slot] = kFree;
    }
  }
  slot_freed_.notify_one();
}

}  // namespace drafthead::lane
