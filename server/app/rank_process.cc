#include "server/app/rank_process.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/exit_codes.h"
#include "common/host_port.h"
#include "common/log.h"
#include "server/app/front.h"
#include "server/app/launcher.h"
#include "server/app/shutdown.h"
#include "server/comm/gloo_collective.h"
#include "server/comm/rendezvous.h"
#include "server/engine/rank_engine.h"
#include "server/sched/batch_loop.h"
#if defined(DRAFTHEAD_HAVE_CUDA)
#include "server/comm/nccl_collective.h"
#endif

namespace drafthead {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Every rank needs the head's shape, and a bad checkpoint should fail before any wait.
absl::StatusOr<ModelLayout> ProbeModel(const ServerConfig& c) {
  ModelLayout m;
  auto shape = ProbeHeadShape(c.weights);
  if (!shape.ok()) return StepFailed("bad_weights", shape.status());
  m.shape = *shape;
  m.vocab = c.vocab_size == 0 ? m.shape.rows : c.vocab_size;
  if (m.vocab > m.shape.rows)
    return StepFailed("bad_flags", absl::InvalidArgumentError(absl::StrCat(
                                       "--vocab-size=", m.vocab, " must be in 1..", m.shape.rows, " (the head's rows)")));
  m.geo = ShardGeometry::Make(c.world, c.rank, m.shape.hidden, m.shape.rows, m.vocab);
  return m;
}

struct Rendezvous {
  std::unique_ptr<KvServer> store;
  std::string address;          // HOST:PORT the ranks join at
  std::vector<pid_t> children;  // launcher mode: ranks 1..N-1
};

// Rank 0 serves the rendezvous: at --leader, or in launcher mode on a free loopback port.
absl::StatusOr<Rendezvous> StartRendezvous(const ServerConfig& c, const std::vector<std::string>& argv) {
  std::string host = "127.0.0.1";
  int port = 0;
  if (!c.leader.empty()) {
    if (absl::Status s = SplitHostPort(c.leader, &host, &port); !s.ok()) return StepFailed("bad_flags", s);
  }
  Rendezvous r;
  auto store = KvServer::Start(host, port);
  if (!store.ok()) return StepFailed("rendezvous_failed", store.status());
  r.store = std::move(*store);
  r.address = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", r.store->port());
  if (c.launcher && c.world > 1) {
    auto pids = SpawnWorkerRanks(argv, c.world, r.address);
    if (!pids.ok()) return StepFailed("spawn_failed", pids.status());
    r.children = *pids;
  }
  return r;
}

// Launcher mode: a child rank that exits before rank 0 has shut the group down fails the group at
// once, without waiting for a collective's timeout.
std::unique_ptr<ChildWatcher> WatchChildRanks(const std::vector<pid_t>& children, Front& front,
                                              ShutdownSignal& shutdown) {
  return std::make_unique<ChildWatcher>(children, [&front, &shutdown](int rank, const std::string& how, bool clean) {
    if (clean) return;
    Log(LogLevel::kError, "rank_exited", "failed_rank", rank, "how", how);
    const absl::Status failure = absl::UnavailableError(absl::StrCat("rank ", rank, " ", how));
    front.metrics->SetRankHealth(rank, false);
    front.health.SetServing(false);
    front.batcher->Close(failure);
    shutdown.Notify(ShutdownReason::Failure(failure));
  });
}

std::string BindHost(const ServerConfig& c, const std::string& leader_host) {
  if (!c.bind_host.empty()) return c.bind_host;
  if (leader_host == "127.0.0.1" || leader_host == "localhost" || leader_host == "::1") return leader_host;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// This rank's one GPU, decided here once (ChooseDevice) and given to the backend, NCCL and the CUDA
// region registry alike. Only when this rank uses CUDA: a CPU rank never initializes it. Runs in
// the rank's own process (launcher children are exec'ed), before the front opens regions.
absl::Status ResolveDevice(ServerConfig& c) {
  if (c.backend != "cuda" && !c.shared_memory.cuda) return absl::OkStatus();
  auto visible = CudaDeviceCount();
  if (!visible.ok()) return StepFailed("backend_failed", visible.status());
  auto device = ChooseDevice(c.requested_device, c.local_rank, *visible);
  if (!device.ok()) return StepFailed("backend_failed", device.status());
  c.backend_options.device = *device;
  c.shared_memory.cuda_device = *device;
  Log(LogLevel::kInfo, "device", "device", *device, "local_rank", c.local_rank, "visible", *visible, "from",
      c.requested_device >= 0 ? "--devices" : "local_rank % visible");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Collective>> JoinGroup(const ServerConfig& c, const std::string& leader) {
  std::string leader_host;
  int leader_port;
  (void)SplitHostPort(leader, &leader_host, &leader_port);  // checked with --leader, or made by rank 0
  auto kv = KvClient::Connect(leader, c.join_timeout);
  if (!kv.ok()) return StepFailed("join_failed", kv.status());
  const auto t0 = Clock::now();
  absl::StatusOr<std::unique_ptr<Collective>> comm;
  if (c.comm == "gloo") {
    comm = MakeGlooCollective(c.rank, c.world, BindHost(c, leader_host), **kv, c.join_timeout, c.same_host_links);
  } else {
#if defined(DRAFTHEAD_HAVE_CUDA)
    comm = MakeNcclCollective(c.rank, c.world, c.backend_options.device, **kv, c.join_timeout);
#else
    comm = absl::UnimplementedError("--comm=nccl: this build has no CUDA/NCCL");  // refused by the config
#endif
  }
  if (!comm.ok()) return StepFailed("join_failed", comm.status());
  Log(LogLevel::kInfo, "joined_group", "world", c.world, "comm", c.comm, "transport", (*comm)->transport(), "ms",
      MsSince(t0));
  return comm;
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(const ServerConfig& c) {
  if (c.backend == "cpu") return MakeCpuBackend(c.backend_options);
  auto b = MakeCudaBackend(c.backend_options, c.local_rank);
  if (!b.ok()) return StepFailed("backend_failed", b.status());
  return b;
}

// Loads this rank's shard into the backend. A failure is not returned but reported (ok = 0, with
// its message): every rank must still take part in ExchangeReady so that rank 0 can name it.
RankReadyReport LoadShard(const ServerConfig& c, const ShardGeometry& geo, ComputeBackend& backend) {
  RankReadyReport mine;
  mine.rank = c.rank;
  std::snprintf(mine.backend, sizeof(mine.backend), "%s", c.backend.c_str());
  const auto t0 = Clock::now();
  auto last = t0;
  auto progress = [&](uint64_t done, uint64_t total) {
    const auto now = Clock::now();
    if (done < total && now - last < std::chrono::seconds(1)) return;
    last = now;
    Log(LogLevel::kInfo, "loading", "bytes", done, "of", total, "ms", MsSince(t0));
  };
  const bool need_bf16 = c.backend_options.keep_bf16 || c.weights.twin.empty();
  absl::Status st;
  auto w = LoadShardWeights(c.weights, geo, need_bf16, progress);
  if (!w.ok()) {
    st = w.status();
  } else if (auto rep = backend.Load(std::move(*w)); !rep.ok()) {
    st = rep.status();
  } else {
    mine.weight_bytes = rep->device_bytes;
    mine.twin_seconds = rep->twin_seconds;
  }
  mine.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  mine.ok = st.ok() ? 1 : 0;
  if (st.ok()) {
    Log(LogLevel::kInfo, "shard_ready", "first_row", geo.row_begin(), "shard_rows", geo.shard_rows,
        "weight_bytes", mine.weight_bytes, "load_s", mine.load_seconds, "twin_s", mine.twin_seconds);
  } else {
    std::snprintf(mine.message, sizeof(mine.message), "%s", std::string(st.message()).c_str());
    Log(LogLevel::kError, "shard_failed", "first_row", geo.row_begin(), "error", mine.message);
  }
  return mine;
}

int RunAsWorker(RankEngine& engine, ShutdownSignal& shutdown) {
  shutdown.MarkServing();  // from now on a signal is deferred to rank 0
  absl::Status s = engine.RunWorker();
  if (!s.ok()) {
    (void)StepFailed("worker_stopped", s);
    return kExitFailed;
  }
  Log(LogLevel::kInfo, "worker_shutdown");
  return kExitOk;
}

// The group failed: nothing more can be computed. Fails what is queued and what is in the batch now
// running (UNAVAILABLE), gives those answers a moment to leave, stops the workers (a hung one
// ignores SIGTERM) and exits at once: a graceful gRPC shutdown would only turn calls still arriving
// into CANCELLED, and the batch loop's thread may sit in a collective's timeout.
[[noreturn]] void ExitGroupFailed(const absl::Status& why, Front& front, BatchLoop& loop, ChildWatcher* watcher) {
  Log(LogLevel::kError, "group_failed_exiting", "error", std::string(why.message()));
  front.batcher->Close(absl::UnavailableError("the rank group failed"));
  loop.FailInFlight(absl::UnavailableError("the rank group failed during this batch"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (watcher) watcher->SignalAll(SIGKILL);
  std::fflush(nullptr);
  _exit(kExitGroupFailed);
}

int ServeAsRank0(const ServerConfig& c, const ModelLayout& m, RankEngine& engine,
                 const std::vector<RankReadyReport>& reports, Front& front, ChildWatcher* watcher,
                 ShutdownSignal& shutdown) {
  uint64_t total_bytes = 0;
  double slowest = 0;
  for (const auto& r : reports) {
    if (!r.ok) {
      Log(LogLevel::kError, "start_failed", "failed_rank", r.rank, "error", std::string(r.message));
      front.server->Shutdown(std::chrono::system_clock::now());
      if (watcher) watcher->SignalAll(SIGTERM);
      return kExitFailed;
    }
    total_bytes += r.weight_bytes;
    slowest = std::max(slowest, r.load_seconds);
    front.metrics->SetWeightBytes(r.rank, r.weight_bytes);
    front.metrics->SetRankHealth(r.rank, true);
  }
  Log(LogLevel::kInfo, "serving", "tp", c.world, "backend", c.backend, "comm", c.comm,
      "hidden", m.geo.hidden, "vocab", m.vocab, "padded_vocab", m.geo.padded_vocab, "shard_rows", m.geo.shard_rows,
      "weight_bytes", total_bytes, "slowest_rank_load_s", slowest,
      "heads", c.backend_options.keep_bf16 ? "fp8,bf16" : "fp8", "listen", c.listen, "weights", m.shape.source);

  BatchLoop loop(engine, *front.batcher, front.metrics.get(), [&](const absl::Status& s) {
    front.health.SetServing(false);
    front.metrics->SetServing(false);
    shutdown.Notify(ShutdownReason::Failure(s));
  }, c.take_ahead, c.launch_ahead && engine.backend().has_device_memory());
  absl::Status loop_status;
  shutdown.MarkServing();  // from now on a signal drains and a failure exits 2
  std::thread loop_thread([&] { loop_status = loop.Run(); });
  front.SetServing(true);

  shutdown.Wait();
  const ShutdownReason why = shutdown.reason();
  front.health.SetServing(false);
  front.metrics->SetServing(false);
  if (why.failed()) ExitGroupFailed(why.failure, front, loop, watcher);

  // SIGTERM: NOT_SERVING at once; answer for --drain-grace (balancers watching health move away
  // without failures); then refuse new RPCs, finish those in flight, empty the queue and shut the
  // workers down.
  Log(LogLevel::kInfo, "draining", "signal", why.signal);
  if (c.drain_grace > absl::ZeroDuration()) absl::SleepFor(c.drain_grace);
  front.health.EndWatches();  // endless streams: the shutdown below would wait out its deadline
  front.server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(c.drain_timeout));
  loop.Stop();
  loop_thread.join();
  if (watcher && !watcher->WaitAll(static_cast<int>(c.engine.op_timeout.count()) + 2000)) {
    watcher->SignalAll(SIGKILL);
    return kExitGroupFailed;
  }
  if (!loop_status.ok() || shutdown.reason().failed()) return kExitGroupFailed;
  Log(LogLevel::kInfo, "stopped");
  return kExitOk;
}

}  // namespace

int RunRank(const ServerConfig& config, const std::vector<std::string>& argv) {
  ServerConfig c = config;  // the device is filled in below, once
  SetLogRank(c.rank);
  ExitOnTerminate();
  ShutdownSignal shutdown(c.rank == 0 ? ShutdownSignal::Role::kRank0 : ShutdownSignal::Role::kWorker);
  SignalThread signal_thread(shutdown);

  auto model = ProbeModel(c);
  if (!model.ok()) return kExitFailed;
  if (!ResolveDevice(c).ok()) return kExitFailed;

  // Rank 0's rendezvous and front come up first: the others join it, and clients get answers
  // (NOT_SERVING) while the group loads.
  Rendezvous rendezvous;
  std::unique_ptr<Front> front;
  std::unique_ptr<ChildWatcher> watcher;
  if (c.rank == 0) {
    auto r = StartRendezvous(c, argv);
    if (!r.ok()) return kExitFailed;
    rendezvous = std::move(*r);
    auto f = StartFront(c, *model);
    if (!f.ok()) return kExitFailed;
    front = std::move(*f);
    if (!rendezvous.children.empty()) watcher = WatchChildRanks(rendezvous.children, *front, shutdown);
  }

  auto comm = JoinGroup(c, c.rank == 0 ? rendezvous.address : c.leader);
  if (!comm.ok()) return kExitFailed;
  auto backend = MakeBackend(c);
  if (!backend.ok()) return kExitFailed;
  RankEngine engine(std::move(*comm), std::move(*backend), model->geo, c.engine);
  const RankReadyReport mine = LoadShard(c, model->geo, engine.backend());
  auto reports = engine.ExchangeReady(mine);
  if (!reports.ok()) {
    (void)StepFailed("group_start_failed", reports.status());
    return kExitFailed;
  }
  if (!mine.ok) return kExitFailed;

  if (c.rank != 0) return RunAsWorker(engine, shutdown);
  return ServeAsRank0(c, *model, engine, *reports, *front, watcher.get(), shutdown);
}

}  // namespace drafthead
