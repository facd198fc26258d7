#include "server/lane/lane_manager.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/lane/doorbell.h"
#include "common/lane/lane_layout.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/request/request.h"
#include "server/lane/lane_descriptor.h"

namespace drafthead {

using lane::LaneCompletion;
using lane::LaneHeader;
using lane::LaneRequest;

namespace {

absl::Status Bad(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The uid owning a process (from /proc), or -1.
int64_t ProcessUid(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Uid:", 0) == 0) return std::strtoll(line.c_str() + 4, nullptr, 10);
  }
  return -1;
}

bool PidfdExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace

// One open lane: its mapping (constant geometry copied and checked at open), its thread, its
// regions. Shared by the manager (until closed) and every request in flight (until answered).
class LaneManager::Lane {
 public:
  uint64_t id = 0;
  uint8_t* base = nullptr;
  size_t bytes = 0;
  LaneHeader* hdr = nullptr;
  lane::LaneGeometry geo;
  uint32_t depth = 0;
  LaneLimits limits;  // ParseDescriptor's bounds: the serving limits and this lane's inline size
  int pidfd = -1;
  int client_pid = 0;
  std::vector<std::string> region_names;
  std::unique_ptr<std::atomic<uint8_t>[]> in_flight;  // per slot: an answer is being prepared
  std::atomic<bool> stop{false};     // the thread should return (Close)
  std::atomic<bool> closing{false};  // queued requests are cancelled
  std::atomic<int> outstanding{0};   // submitted, not yet answered
  std::thread thread;

  ~Lane() {
    if (base != nullptr) munmap(base, bytes);
    if (pidfd >= 0) close(pidfd);
  }

  LaneCompletion* Completion(uint64_t n) { return lane::CompletionSlot(base, geo, depth, n); }
};

LaneManager::LaneManager(LaneOptions options, regions::RegionRegistry* regions, LaneSubmitFn submit)
    : options_(options), regions_(regions), submit_(std::move(submit)) {}

LaneManager::~LaneManager() {
  CloseAll();
  absl::MutexLock l(&mu_);
  Reap();
}

namespace {

// Maps and checks the caller's lane object. The checks are what keeps another user off a lane:
// the object must be this uid's and 0600 (POSIX shared memory enforces the mode on open).
absl::Status MapLaneObject(const v1::OpenLaneRequest& req, LaneManager::Lane* lane) {
  const std::string& key = req.shm_key();
  if (key.size() < 2 || key[0] != '/' || key.find('/', 1) != std::string::npos || key.size() > 255)
    return Bad("shm_key", absl::StrCat("\"", key, "\" is not a POSIX shared-memory name (\"/name\")"));
  if (req.layout_version() != lane::kLaneLayoutVersion)
    return Bad("layout_version", absl::StrCat(req.layout_version(), " is not served (this server: ",
                                              lane::kLaneLayoutVersion, ")"));
  if (req.byte_size() < lane::kHeaderBytes || req.byte_size() > (uint64_t{1} << 34))
    return Bad("byte_size", absl::StrCat(req.byte_size(), " is outside ", lane::kHeaderBytes, "..16 GiB"));
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0)
    return Bad("shm_key", absl::StrCat("cannot open ", key, ": ", std::strerror(errno),
                                       " (is the caller on this host, in this IPC namespace?)"));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Bad("shm_key", absl::StrCat(key, " is not a shared-memory object"));
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    close(fd);
    return Bad("shm_key", absl::StrCat(key, " must be owned by the server's uid ", geteuid(),
                                       " with mode 0600 (it is uid ", st.st_uid, ", mode 0",
                                       absl::Dec(st.st_mode & 0777), ")"));
  }
  if (static_cast<uint64_t>(st.st_size) != req.byte_size()) {
    close(fd);
    return Bad("byte_size", absl::StrCat(req.byte_size(), " is not the object's size ", st.st_size));
  }
  void* p = mmap(nullptr, req.byte_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap of ", key, ": ", std::strerror(errno)));
  lane->base = static_cast<uint8_t*>(p);
  lane->bytes = req.byte_size();
  lane->hdr = reinterpret_cast<LaneHeader*>(p);

  // The constant part, read once.
  LaneHeader h;
  std::memcpy(static_cast<void*>(&h), p, 128);
  DH_RETURN_IF_ERROR(CheckLaneHeader(h, req.byte_size(), req.nonce(), req.pid()));
  const lane::LaneGeometry g = lane::GeometryFor(h.depth, h.inline_bytes);
  lane->geo = g;
  lane->depth = h.depth;
  lane->limits.inline_bytes = h.inline_bytes;
  return absl::OkStatus();
}

absl::Status WatchCaller(int pid, LaneManager::Lane* lane) {
  if (pid <= 0) return Bad("pid", absl::StrCat(pid, " is not a process id"));
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0)
    return Bad("pid", absl::StrCat("process ", pid, " cannot be watched: ", std::strerror(errno),
                                   " (lanes need the caller in the server's PID namespace)"));
  lane->pidfd = fd;
  if (ProcessUid(pid) != static_cast<int64_t>(geteuid()))
    return Bad("pid", absl::StrCat("process ", pid, " does not run as the server's uid ", geteuid()));
  lane->client_pid = pid;
  return absl::OkStatus();
}

// Writes submission n's answer into its completion slot and rings the caller's doorbell.
void Publish(LaneManager::Lane& lane, uint64_t n, LaneCompletion* c, uint64_t* doorbells, bool submitted) {
  if (submitted) lane.outstanding.fetch_sub(1, std::memory_order_acq_rel);
  c->done_seq.store(n + 1, std::memory_order_release);
  lane.in_flight[n % lane.depth].store(0, std::memory_order_release);
  lane.hdr->cq_count.fetch_add(1, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (lane.hdr->client_sleeping.load(std::memory_order_relaxed) != 0) {
    lane::FutexWake(&lane.hdr->cq_count, INT_MAX);
    ++*doorbells;
  }
}

void FillStatus(LaneCompletion* c, const absl::Status& s) {
  c->code = static_cast<int32_t>(s.code());
  const size_t len = std::min<size_t>(s.message().size(), lane::kMessageBytes);
  std::memcpy(c->message, s.message().data(), len);
  c->message_len = static_cast<uint32_t>(len);
}

}  // namespace

absl::StatusOr<v1::OpenLaneResponse> LaneManager::Open(const v1::OpenLaneRequest& req) {
  if (!enabled())
    return absl::FailedPreconditionError("same-host lanes are off: start the server with --lanes=N");
  if (regions_ == nullptr || !regions_->any_enabled()) return regions::SharedMemoryOff();
  {
    absl::MutexLock l(&mu_);
    Reap();
    if (lanes_.size() >= options_.max_lanes)
      return absl::ResourceExhaustedError(absl::StrCat("all ", options_.max_lanes,
                                                       " lanes are open (--lanes)"));
  }
  auto lane = std::make_shared<Lane>();
  DH_RETURN_IF_ERROR(MapLaneObject(req, lane.get()));
  lane->limits.max_rows = options_.max_rows;
  lane->limits.max_top_k = options_.max_top_k;
  DH_RETURN_IF_ERROR(WatchCaller(req.pid(), lane.get()));
  for (int i = 0; i < req.regions_size(); ++i) {
    absl::Status s;
    auto spec = RegionSpecFromProto(req.regions(i));
    s = spec.ok() ? regions_->Register(*spec) : spec.status();
    if (!s.ok()) {
      for (const std::string& name : lane->region_names) regions_->Unregister(name).IgnoreError();
      return absl::Status(s.code(), absl::StrCat("regions[", i, "]: ", s.message()));
    }
    lane->region_names.push_back(req.regions(i).name());
  }
  lane->in_flight = std::make_unique<std::atomic<uint8_t>[]>(lane->depth);
  for (uint32_t i = 0; i < lane->depth; ++i) lane->in_flight[i].store(0);
  {
    absl::MutexLock l(&mu_);
    if (lanes_.size() >= options_.max_lanes) {
      for (const std::string& name : lane->region_names) regions_->Unregister(name).IgnoreError();
      return absl::ResourceExhaustedError(absl::StrCat("all ", options_.max_lanes,
                                                       " lanes are open (--lanes)"));
    }
    lane->id = next_id_++;
    lanes_[lane->id] = lane;
  }
  lane->hdr->sq_head.store(0, std::memory_order_relaxed);
  lane->hdr->server_state.store(lane::kServerServing, std::memory_order_release);
  counters_->opened.fetch_add(1, std::memory_order_relaxed);

  // The lane's thread: take descriptors in order, submit each; spin after work, then sleep.
  Lane* raw = lane.get();
  std::weak_ptr<Lane> weak = lane;
  lane->thread = std::thread([this, raw, weak] {
    Lane& ln = *raw;
    LaneHeader* h = ln.hdr;
    auto counters = counters_;
    uint64_t n = 0;
    const int64_t spin_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.spin).count();
    const int64_t tick_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(kLaneTick).count();
    int64_t last_work = lane::MonotonicNanos(), last_check = last_work;
    bool slept = false;
    while (!ln.stop.load(std::memory_order_acquire)) {
      const uint32_t tail = h->sq_tail.load(std::memory_order_acquire);
      const int64_t now = lane::MonotonicNanos();
      if (now - last_check > tick_ns) {
        last_check = now;
        if (PidfdExited(ln.pidfd)) break;
      }
      if (tail != static_cast<uint32_t>(n)) {
        if (tail - static_cast<uint32_t>(n) > ln.depth) {
          // More published than slots exist: not a caller following the layout. Close its lane
          // rather than take descriptors without end.
          Log(LogLevel::kWarn, "lane_protocol_error", "lane", ln.id, "sq_tail", tail, "taken", n);
          counters->bad.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        if (ln.in_flight[n % ln.depth].load(std::memory_order_acquire) != 0) {
          // The caller reused a slot still being answered: it waits its own turn (no busy loop).
          usleep(20);
          continue;
        }
        if (slept) counters->wakeups.fetch_add(1, std::memory_order_relaxed);
        else counters->spin_hits.fetch_add(1, std::memory_order_relaxed);
        slept = false;
        LaneRequest d;
        std::memcpy(&d, lane::RequestSlot(ln.base, ln.geo, ln.depth, n), sizeof d);  // read once
        const bool last = h->sq_tail.load(std::memory_order_acquire) == static_cast<uint32_t>(n + 1);
        ln.in_flight[n % ln.depth].store(1, std::memory_order_relaxed);
        h->sq_head.store(static_cast<uint32_t>(n + 1), std::memory_order_relaxed);
        absl::Status fence = absl::OkStatus();
        if (d.flags & lane::kFlagHiddenFence) fence = AwaitFence(ln, n, d);
        Handle(weak.lock(), n, d, last, fence);
        ++n;
        last_work = lane::MonotonicNanos();
        continue;
      }
      if (now - last_work < spin_ns) {
        lane::CpuRelax();
        continue;
      }
      h->server_sleeping.store(1, std::memory_order_seq_cst);
      if (h->sq_tail.load(std::memory_order_seq_cst) == static_cast<uint32_t>(n) &&
          !ln.stop.load(std::memory_order_acquire)) {
        lane::FutexWait(&h->sq_tail, static_cast<uint32_t>(n), tick_ns);
        slept = true;
      }
      h->server_sleeping.store(0, std::memory_order_relaxed);
    }
    if (!ln.stop.load(std::memory_order_acquire)) {  // the caller exited, or broke the protocol
      if (PidfdExited(ln.pidfd)) {
        counters->caller_exits.fetch_add(1, std::memory_order_relaxed);
        Log(LogLevel::kInfo, "lane_caller_exited", "lane", ln.id, "pid", ln.client_pid);
      }
      OnLaneExit(ln.id);
    }
  });
  Log(LogLevel::kInfo, "lane_opened", "lane", lane->id, "pid", req.pid(), "depth", lane->depth,
      "regions", req.regions_size());
  v1::OpenLaneResponse resp;
  resp.set_lane_id(lane->id);
  resp.set_server_pid(getpid());
  resp.set_spin_us(static_cast<uint32_t>(options_.spin.count()));
  return resp;
}

// kFlagHiddenFence: the caller's GPU stream writes the slot's fence word once the rows are in
// place; poll it (spinning briefly, then in 20 us naps) up to the request's timeout.
absl::Status LaneManager::AwaitFence(Lane& lane, uint64_t n, const LaneRequest& d) {
  const LaneRequest* slot = lane::RequestSlot(lane.base, lane.geo, lane.depth, n);
  const uint32_t want = static_cast<uint32_t>(n + 1);
  const uint64_t limit_us = d.timeout_us > 0 ? d.timeout_us : lane::kFenceWaitLimitUs;
  const int64_t t0 = lane::MonotonicNanos();
  for (uint32_t polls = 0; lane::LoadFence(slot) != want; ++polls) {
    const int64_t waited = lane::MonotonicNanos() - t0;
    if (lane.stop.load(std::memory_order_relaxed)) return absl::CancelledError("the lane closed");
    if (waited > static_cast<int64_t>(limit_us) * 1000)
      return absl::DeadlineExceededError(absl::StrCat("hidden: the caller's stream did not reach the slot's fence within ",
                                                      limit_us, " us (kFlagHiddenFence)"));
    if (waited < 50'000) lane::CpuRelax();
    else usleep(20);
  }
  return absl::OkStatus();
}

void LaneManager::Handle(std::shared_ptr<Lane> lane, uint64_t n, const LaneRequest& d, bool last,
                         const absl::Status& fence) {
  counters_->requests.fetch_add(1, std::memory_order_relaxed);
  LaneCompletion* c = lane->Completion(n);
  c->request_id = d.request_id;
  c->rows = 0;
  c->k = 0;
  c->flags = 0;
  c->message_len = 0;
  std::memset(c->timing, 0, sizeof c->timing);
  auto refuse = [&](const absl::Status& s) {
    counters_->bad.fetch_add(1, std::memory_order_relaxed);
    FillStatus(c, s);
    uint64_t rang = 0;
    Publish(*lane, n, c, &rang, /*submitted=*/false);
    counters_->doorbells.fetch_add(rang, std::memory_order_relaxed);
  };
  if (!fence.ok()) return refuse(fence);
  auto parsed = ParseDescriptor(d, lane->region_names, lane->limits);
  if (!parsed.ok()) return refuse(parsed.status());
  // A token answer's output slice is checked now, so a bad one is refused before any compute.
  if (!parsed->tokens_region.empty()) {
    auto ref = regions_->Find(parsed->tokens_region, "output");
    if (!ref.ok()) return refuse(ref.status());
    if (parsed->token_bytes > 0) {
      auto access = ref->Access(parsed->tokens_offset, parsed->token_bytes, "output");
      if (!access.ok()) return refuse(access.status());
    }
  }
  CallControl call;
  if (parsed->timeout_us > 0) call.deadline = Clock::now() + std::chrono::microseconds(parsed->timeout_us);
  Lane* raw = lane.get();
  call.cancelled = [raw] { return raw->closing.load(std::memory_order_relaxed); };
  // Run it on this thread (when the engine is idle) only if nothing else of this lane waits or is
  // being answered: a caller with many requests in flight wants them batched, not taken one by
  // one while its ring fills behind a lane thread busy computing.
  call.may_run_inline = last && lane->outstanding.load(std::memory_order_acquire) == 0;
  call.caller = CallerKey{"lane", lane->id};  // one caller of the batcher's fair queueing
  lane->outstanding.fetch_add(1, std::memory_order_acq_rel);
  const std::string tokens_region = parsed->tokens_region;
  const uint64_t tokens_offset = parsed->tokens_offset;
  const bool ids64 = parsed->ids64;
  auto counters = counters_;
  regions::RegionRegistry* registry = regions_;
  submit_(parsed->req, std::move(call),
          [lane = std::move(lane), n, c, tokens_region, tokens_offset, ids64, counters, registry](
              const absl::Status& s, v1::LogitsResponse* r) {
            absl::Status st = s;
            if (st.ok() && r != nullptr) {
              c->rows = r->rows();
              c->vocab_size = r->vocab_size();
              c->logits_dtype = static_cast<uint32_t>(r->logits_dtype());
              const v1::Timing& t = r->timing();
              const uint32_t timing[12] = {t.queue_us(), t.compute_us(), t.batch_rows(), t.validate_us(),
                                           t.broadcast_us(), t.h2d_us(), t.gemv_us(), t.epilogue_us(),
                                           t.gather_us(), t.d2h_us(), t.combine_us(), t.server_us()};
              std::memcpy(c->timing, timing, sizeof timing);
              if (t.step_untimed()) c->flags |= lane::kDoneStepUntimed;
              const size_t entries = static_cast<size_t>(r->token_ids_size());
              if (entries > 0) {
                c->k = r->rows() > 0 ? static_cast<uint32_t>(entries / r->rows()) : 0;
                const bool probs = r->probs_size() > 0;
                const size_t bytes = lane::TokenAnswerBytes(entries, 1, probs, ids64);
                const size_t id_bytes = ids64 ? 8 : 4;
                // ids, values, probs back to back (the layout's token answer).
                auto write = [&](uint8_t* dst) {
                  if (ids64) {
                    for (size_t i = 0; i < entries; ++i) {
                      const int64_t id = r->token_ids(static_cast<int>(i));
                      std::memcpy(dst + i * 8, &id, 8);
                    }
                  } else {
                    std::memcpy(dst, r->token_ids().data(), entries * 4);
                  }
                  std::memcpy(dst + entries * id_bytes, r->values().data(), entries * 4);
                  if (probs) std::memcpy(dst + entries * (id_bytes + 4), r->probs().data(), entries * 4);
                };
                if (tokens_region.empty()) {
                  write(reinterpret_cast<uint8_t*>(c) + lane::kCompletionHeaderBytes);
                } else {
                  std::string staged(bytes, '\0');
                  write(reinterpret_cast<uint8_t*>(staged.data()));
                  auto ref = registry->Find(tokens_region, "output");
                  absl::StatusOr<regions::RegionAccess> access =
                      ref.ok() ? ref->Access(tokens_offset, bytes, "output") : ref.status();
                  st = access.ok() ? access->Write(0, staged.data(), bytes) : access.status();
                  c->flags |= lane::kDoneInOutput;
                }
                if (probs) c->flags |= lane::kDoneProbs;
                if (ids64) c->flags |= lane::kDoneIds64;
              }
            } else if (st.ok()) {
              st = absl::InternalError("no answer");
            }
            if (st.ok()) {
              c->code = 0;
              c->message_len = 0;
            } else {
              FillStatus(c, st);
            }
            uint64_t rang = 0;
            Publish(*lane, n, c, &rang, /*submitted=*/true);
            counters->doorbells.fetch_add(rang, std::memory_order_relaxed);
          });
}

namespace {

// Stops a lane's thread and lets go of what it holds in the registry; the mapping goes with the
// last request in flight.
void Shut(LaneManager::Lane& lane, regions::RegionRegistry* regions, bool join) {
  lane.stop.store(true, std::memory_order_release);
  lane.closing.store(true, std::memory_order_release);
  lane::FutexWake(&lane.hdr->sq_tail, 1);
  if (join && lane.thread.joinable()) lane.thread.join();
  for (const std::string& name : lane.region_names) regions->Unregister(name).IgnoreError();
  lane.hdr->server_state.store(lane::kServerClosed, std::memory_order_release);
  lane.hdr->cq_count.fetch_add(1, std::memory_order_release);
  lane::FutexWake(&lane.hdr->cq_count, INT_MAX);
}

}  // namespace

absl::Status LaneManager::Close(uint64_t lane_id) {
  std::shared_ptr<Lane> lane;
  {
    absl::MutexLock l(&mu_);
    Reap();
    auto it = lanes_.find(lane_id);
    if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("lane_id: no open lane ", lane_id));
    lane = it->second;
    lanes_.erase(it);
  }
  Shut(*lane, regions_, /*join=*/true);
  Log(LogLevel::kInfo, "lane_closed", "lane", lane_id);
  return absl::OkStatus();
}

void LaneManager::CloseAll() {
  std::map<uint64_t, std::shared_ptr<Lane>> lanes;
  {
    absl::MutexLock l(&mu_);
    lanes.swap(lanes_);
  }
  for (auto& [id, lane] : lanes) Shut(*lane, regions_, /*join=*/true);
}

// On the lane's own thread, which returns right after: it cannot join itself, so the manager
// joins it later (Reap, at the next Open / Close or at destruction).
void LaneManager::OnLaneExit(uint64_t id) {
  std::shared_ptr<Lane> lane;
  {
    absl::MutexLock l(&mu_);
    auto it = lanes_.find(id);
    if (it == lanes_.end()) return;  // Close got there first (and joins)
    lane = it->second;
    lanes_.erase(it);
    exited_.push_back(lane);
  }
  Shut(*lane, regions_, /*join=*/false);
}

void LaneManager::Reap() {
  for (auto& lane : exited_)
    if (lane->thread.joinable()) lane->thread.join();
  exited_.clear();
}

LaneStats LaneManager::stats() const {
  LaneStats s;
  {
    absl::MutexLock l(&mu_);
    s.open = lanes_.size();
  }
  const Counters& c = *counters_;
  s.opened = c.opened.load();
  s.closed_by_caller_exit = c.caller_exits.load();
  s.requests = c.requests.load();
  s.bad_descriptors = c.bad.load();
  s.spin_hits = c.spin_hits.load();
  s.wakeups = c.wakeups.load();
  s.doorbells = c.doorbells.load();
  return s;
}

void LaneManager::RenderMetrics(std::string* out) const {
  const LaneStats s = stats();
  absl::StrAppend(out,
                  "# HELP drafthead_lanes_open Same-host lanes open now.\n# TYPE drafthead_lanes_open gauge\n",
                  "drafthead_lanes_open ", s.open, "\n",
                  "# HELP drafthead_lanes_opened_total Lanes opened.\n# TYPE drafthead_lanes_opened_total counter\n",
                  "drafthead_lanes_opened_total ", s.opened, "\n",
                  "# HELP drafthead_lane_caller_exits_total Lanes closed because their caller exited.\n"
                  "# TYPE drafthead_lane_caller_exits_total counter\n",
                  "drafthead_lane_caller_exits_total ", s.closed_by_caller_exit, "\n",
                  "# HELP drafthead_lane_requests_total Requests taken from lanes (bad ones included).\n"
                  "# TYPE drafthead_lane_requests_total counter\n",
                  "drafthead_lane_requests_total ", s.requests, "\n",
                  "# HELP drafthead_lane_bad_descriptors_total Lane requests refused before submission.\n"
                  "# TYPE drafthead_lane_bad_descriptors_total counter\n",
                  "drafthead_lane_bad_descriptors_total ", s.bad_descriptors, "\n",
                  "# HELP drafthead_lane_pickups_total How a lane's thread found each request.\n"
                  "# TYPE drafthead_lane_pickups_total counter\n",
                  "drafthead_lane_pickups_total{how=\"spin\"} ", s.spin_hits, "\n",
                  "drafthead_lane_pickups_total{how=\"doorbell\"} ", s.wakeups, "\n",
                  "# HELP drafthead_lane_doorbells_total Answers that woke a sleeping caller.\n"
                  "# TYPE drafthead_lane_doorbells_total counter\n",
                  "drafthead_lane_doorbells_total ", s.doorbells, "\n");
}

}  // namespace drafthead
