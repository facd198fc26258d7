// drafthead-server: flags, start-up of one rank (or, with --tp alone, the whole group on this
// host), and the process's lifecycle: serve, drain on SIGTERM, exit non-zero when the group fails.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/backends/compute_backend.h"
#include "server/sched/batcher.h"
#include "server/engine/rank_engine.h"
#include "common/flag_names.h"
#include "server/comm/gloo_collective.h"
#include "server/api/health.h"
#include "server/app/launcher.h"
#include "server/sched/batch_loop.h"
#include "common/log.h"
#include "server/sched/metrics.h"
#include "server/comm/rendezvous.h"
#include "server/api/service.h"
#include "server/weights/shard_weights.h"
#if defined(DRAFTHEAD_HAVE_CUDA)
#include "server/comm/nccl_collective.h"
#endif

ABSL_FLAG(std::string, weights, "", "Checkpoint: a .safetensors file or a directory (sharded: model.safetensors.index.json)");
ABSL_FLAG(std::string, tensor, "lm_head.weight", "The LM head tensor in the checkpoint");
ABSL_FLAG(std::string, twin, "", "A precomputed fp8 twin (drafthead-quantize output) to load instead of quantizing");
ABSL_FLAG(std::optional<uint64_t>, synthetic, std::nullopt, "Seeded synthetic bf16 weights instead of a checkpoint");
ABSL_FLAG(int64_t, hidden_size, 5120, "Hidden size K (synthetic weights; checked against a checkpoint when given explicitly)");
ABSL_FLAG(int64_t, padded_vocab, 129280, "LM head rows (synthetic weights)");
ABSL_FLAG(int64_t, vocab_size, 0, "Crop logits to this many tokens (0: all the checkpoint's rows)");
ABSL_FLAG(int, tp, 0, "Tensor-parallel ranks; alone, starts the whole group on this host");
ABSL_FLAG(int, rank, -1, "This process's rank (with --world and --leader: one rank per container or host)");
ABSL_FLAG(int, world, 0, "Number of ranks in the group (with --rank)");
ABSL_FLAG(std::string, leader, "", "HOST:PORT of rank 0's rendezvous (with --rank)");
ABSL_FLAG(int, local_rank, -1, "This rank's index on its host (GPU choice); default: rank % GPUs");
ABSL_FLAG(std::string, bind_host, "", "Address this rank's collectives listen on (default: 127.0.0.1 when the leader is loopback, else this host's name)");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu or cuda");
ABSL_FLAG(std::string, comm, "gloo", "Collectives: gloo or nccl");
ABSL_FLAG(std::string, devices, "", "CUDA device per local rank, comma-separated (default: the local rank)");
ABSL_FLAG(int, threads, 0, "CPU backend threads per rank (0: hardware threads / ranks on this host)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address of rank 0");
ABSL_FLAG(uint32_t, max_rows, 64, "Most rows in one request and one batch");
ABSL_FLAG(uint32_t, max_top_k, 256, "Largest top_k");
ABSL_FLAG(bool, keep_bf16, false, "Keep the bf16 head too, to serve Head BF16_EXACT");
ABSL_FLAG(uint32_t, max_queue_rows, 4096, "Rows allowed to wait; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(uint32_t, max_queue_delay_us, 0, "How long a batch may wait to fill (0: take what is waiting)");
ABSL_FLAG(uint32_t, max_batch_requests, 0, "Most requests packed into one batch (0: no limit; 1: batching off)");
ABSL_FLAG(absl::Duration, op_timeout, absl::Seconds(5), "Longest one batch's collectives may take before the group is declared failed");
ABSL_FLAG(absl::Duration, join_timeout, absl::Seconds(120), "How long ranks wait for each other to join");
ABSL_FLAG(absl::Duration, load_timeout, absl::Minutes(30), "How long rank 0 waits for every rank's shard");
ABSL_FLAG(absl::Duration, drain_grace, absl::ZeroDuration(), "On SIGTERM: keep answering for this long with health NOT_SERVING before refusing new RPCs");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30), "On SIGTERM: longest wait for in-flight RPCs");
ABSL_FLAG(std::string, metrics_listen, "", "HOST:PORT for Prometheus /metrics (empty: off)");
ABSL_FLAG(std::string, tls_cert, "", "Server certificate (PEM) for TLS");
ABSL_FLAG(std::string, tls_key, "", "Server private key (PEM) for TLS");
ABSL_FLAG(std::string, tls_client_ca, "", "CA (PEM) for client certificates: mutual TLS");
ABSL_FLAG(std::string, restart, "no", "Launcher mode: on-failure reruns the group when it fails");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn or error");

namespace drafthead {
namespace {

constexpr const char* kVersion = "0.1.0";

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

int Fail(const std::string& event, const absl::Status& s) {
  Log(LogLevel::kError, event, "error", std::string(s.message()));
  return 1;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), key = absl::GetFlag(FLAGS_tls_key),
                    ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() && key.empty()) {
    if (!ca.empty()) return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    return grpc::InsecureServerCredentials();
  }
  if (cert.empty() || key.empty()) return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  grpc::SslServerCredentialsOptions opts;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto c = ReadFile(cert);
  if (!c.ok()) return c.status();
  auto k = ReadFile(key);
  if (!k.ok()) return k.status();
  pair.cert_chain = *c;
  pair.private_key = *k;
  opts.pem_key_cert_pairs.push_back(pair);
  if (!ca.empty()) {
    auto r = ReadFile(ca);
    if (!r.ok()) return r.status();
    opts.pem_root_certs = *r;
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

// Signals are blocked in every thread and taken by one signal thread (StartSignalThread). Before
// the group serves, SIGTERM/SIGINT end the process at once (a pod deleted while loading must not
// wait for its kill); once serving, rank 0 drains and a worker keeps answering rank 0 until rank 0
// shuts it down or disappears (a drain needs every rank).
std::atomic<int> g_signal{0};
std::atomic<bool> g_serving{false};
std::mutex g_signal_mu;
std::condition_variable g_signal_cv;

void StartSignalThread(int rank) {
  std::thread([rank] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (!g_serving) {
        Log(LogLevel::kWarn, "stopped_during_startup", "signal", sig);
        std::fflush(nullptr);
        _exit(128 + sig);  // local workers follow through PR_SET_PDEATHSIG
      }
      if (rank != 0) {
        Log(LogLevel::kInfo, "signal_deferred_to_rank0", "signal", sig);
        continue;
      }
      {
        std::lock_guard<std::mutex> l(g_signal_mu);
        g_signal = sig;
      }
      g_signal_cv.notify_all();
    }
  }).detach();
}

void WaitForSignals() {
  std::unique_lock<std::mutex> l(g_signal_mu);
  g_signal_cv.wait(l, [] { return g_signal.load() != 0; });
}

void OnTerminate() {
  // Gloo may throw from its own I/O thread when a peer dies; that ends here. Exit non-zero at once
  // so the supervisor restarts the group (clients see the connection drop: UNAVAILABLE).
  std::string what = "unknown";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
  }
  Log(LogLevel::kError, "fatal_collective_failure", "error", what);
  _exit(3);
}

struct RankSetup {
  int rank = 0, world = 1, local_rank = 0, local_ranks = 1;
  std::string leader;
  bool launcher = false;
};

absl::StatusOr<RankSetup> ResolveRank() {
  RankSetup r;
  const int tp = absl::GetFlag(FLAGS_tp), rank = absl::GetFlag(FLAGS_rank),
            world = absl::GetFlag(FLAGS_world);
  if (rank < 0) {
    if (tp <= 0) return absl::InvalidArgumentError("give --tp=N (whole group here) or --rank/--world/--leader");
    if (world != 0 && world != tp) return absl::InvalidArgumentError("--world differs from --tp");
    r.world = tp;
    r.rank = 0;
    r.launcher = true;
    r.local_ranks = tp;
  } else {
    if (world <= 0) return absl::InvalidArgumentError("--rank needs --world");
    if (tp != 0 && tp != world) return absl::InvalidArgumentError("--tp differs from --world");
    if (rank >= world) return absl::InvalidArgumentError(absl::StrCat("--rank=", rank, " is not below --world=", world));
    if (absl::GetFlag(FLAGS_leader).empty()) return absl::InvalidArgumentError("--rank needs --leader=HOST:PORT");
    r.world = world;
    r.rank = rank;
    r.leader = absl::GetFlag(FLAGS_leader);
  }
  if (r.world > 64) return absl::InvalidArgumentError("at most 64 ranks");
  r.local_rank = absl::GetFlag(FLAGS_local_rank) >= 0 ? absl::GetFlag(FLAGS_local_rank) : r.rank;
  return r;
}

std::string BindHost(const std::string& leader_host) {
  std::string b = absl::GetFlag(FLAGS_bind_host);
  if (!b.empty()) return b;
  if (leader_host == "127.0.0.1" || leader_host == "localhost" || leader_host == "::1") return leader_host;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

int RunRank(const std::vector<std::string>& args) {
  auto setup_or = ResolveRank();
  if (!setup_or.ok()) return Fail("bad_flags", setup_or.status());
  RankSetup setup = *setup_or;
  SetLogRank(setup.rank);
  std::set_terminate(OnTerminate);
  StartSignalThread(setup.rank);

  const std::string backend_name = absl::GetFlag(FLAGS_backend), comm_name = absl::GetFlag(FLAGS_comm);
  if (backend_name != "cpu" && backend_name != "cuda")
    return Fail("bad_flags", absl::InvalidArgumentError("--backend must be cpu or cuda"));
  if (comm_name != "gloo" && comm_name != "nccl")
    return Fail("bad_flags", absl::InvalidArgumentError("--comm must be gloo or nccl"));
  if (comm_name == "nccl" && backend_name != "cuda")
    return Fail("bad_flags", absl::InvalidArgumentError("--comm=nccl needs --backend=cuda"));
  const uint32_t max_rows = absl::GetFlag(FLAGS_max_rows);
  if (max_rows == 0 || max_rows > static_cast<uint32_t>(kMaxRowsLimit))
    return Fail("bad_flags", absl::InvalidArgumentError(absl::StrCat("--max-rows must be in 1..", kMaxRowsLimit)));
  const uint32_t max_top_k = absl::GetFlag(FLAGS_max_top_k);
  if (max_top_k == 0 || max_top_k > static_cast<uint32_t>(kMaxTopKLimit))
    return Fail("bad_flags", absl::InvalidArgumentError(absl::StrCat("--max-top-k must be in 1..", kMaxTopKLimit)));

  // Weights' shape first: every rank needs it, and a bad checkpoint should fail before any wait.
  WeightsConfig wcfg;
  wcfg.weights = absl::GetFlag(FLAGS_weights);
  wcfg.tensor = absl::GetFlag(FLAGS_tensor);
  wcfg.twin = absl::GetFlag(FLAGS_twin);
  wcfg.synthetic_seed = absl::GetFlag(FLAGS_synthetic);
  if (wcfg.synthetic_seed) {
    wcfg.hidden_size = absl::GetFlag(FLAGS_hidden_size);
    wcfg.padded_vocab = absl::GetFlag(FLAGS_padded_vocab);
  } else if (wcfg.weights.empty()) {
    return Fail("bad_flags", absl::InvalidArgumentError("give --weights=FILE|DIR or --synthetic=SEED"));
  }
  auto shape = ProbeHeadShape(wcfg);
  if (!shape.ok()) return Fail("bad_weights", shape.status());
  int64_t vocab = absl::GetFlag(FLAGS_vocab_size);
  if (vocab == 0) vocab = shape->rows;
  if (vocab < 0 || vocab > shape->rows)
    return Fail("bad_flags", absl::InvalidArgumentError(absl::StrCat(
                                 "--vocab-size=", vocab, " must be in 1..", shape->rows, " (the head's rows)")));
  const ShardGeometry geo = ShardGeometry::Make(setup.world, setup.rank, shape->hidden, shape->rows, vocab);

  EngineOptions eopts;
  eopts.op_timeout = Ms(absl::GetFlag(FLAGS_op_timeout));
  eopts.load_timeout = Ms(absl::GetFlag(FLAGS_load_timeout));
  eopts.max_rows = static_cast<int>(max_rows);
  const auto join_timeout = Ms(absl::GetFlag(FLAGS_join_timeout));

  // Rendezvous: rank 0 serves it; in launcher mode on a free loopback port.
  std::unique_ptr<KvServer> kv_server;
  std::vector<pid_t> children;
  if (setup.rank == 0) {
    std::string host = "127.0.0.1";
    int port = 0;
    if (!setup.launcher || !absl::GetFlag(FLAGS_leader).empty()) {
      const std::string l = absl::GetFlag(FLAGS_leader);
      if (absl::Status s = SplitHostPort(l, &host, &port); !s.ok()) return Fail("bad_flags", s);
    }
    auto srv = KvServer::Start(host, port);
    if (!srv.ok()) return Fail("rendezvous_failed", srv.status());
    kv_server = std::move(*srv);
    setup.leader = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", kv_server->port());
    if (setup.launcher && setup.world > 1) {
      auto pids = SpawnWorkerRanks(args, setup.world, setup.leader);
      if (!pids.ok()) return Fail("spawn_failed", pids.status());
      children = *pids;
    }
  }
  std::string leader_host;
  int leader_port;
  (void)SplitHostPort(setup.leader, &leader_host, &leader_port);

  // Rank 0's front: the gRPC server comes up at once, NOT_SERVING until every rank has its shard.
  const bool keep_bf16 = absl::GetFlag(FLAGS_keep_bf16);
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<MetricsServer> metrics_server;
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<DraftHeadService> service;
  std::unique_ptr<grpc::Server> server;
  HealthService health;  // NOT_SERVING until every rank holds its shard
  std::atomic<bool> group_failed{false};
  std::unique_ptr<ChildWatcher> watcher;
  if (setup.rank == 0) {
    metrics = std::make_unique<Metrics>(setup.world);
    if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
      auto ms = MetricsServer::Start(absl::GetFlag(FLAGS_metrics_listen), metrics.get());
      if (!ms.ok()) return Fail("metrics_failed", ms.status());
      metrics_server = std::move(*ms);
      Log(LogLevel::kInfo, "metrics_listening", "port", metrics_server->port());
    }
    BatcherOptions bopts;
    bopts.max_rows = max_rows;
    bopts.max_queue_rows = std::max(absl::GetFlag(FLAGS_max_queue_rows), max_rows);
    bopts.max_queue_delay = std::chrono::microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
    bopts.max_requests = absl::GetFlag(FLAGS_max_batch_requests);
    batcher = std::make_unique<Batcher>(bopts);
    ServingLimits limits;
    limits.hidden = geo.hidden;
    limits.vocab_size = vocab;
    limits.max_rows = max_rows;
    limits.max_top_k = max_top_k;
    limits.has_bf16 = keep_bf16;
    v1::ModelInfo info;
    info.set_hidden_size(static_cast<uint32_t>(geo.hidden));
    info.set_vocab_size(static_cast<uint32_t>(vocab));
    info.set_padded_vocab(static_cast<uint32_t>(geo.padded_vocab));
    info.set_tp(static_cast<uint32_t>(setup.world));
    info.set_shard_rows(static_cast<uint32_t>(geo.shard_rows));
    info.set_max_rows(max_rows);
    info.set_max_top_k(static_cast<uint32_t>(std::min<int64_t>(max_top_k, vocab)));
    info.set_backend(backend_name);
    info.set_comm(comm_name);
    info.add_heads(v1::FP8_TWIN);
    if (keep_bf16) info.add_heads(v1::BF16_EXACT);
    info.set_weights(shape->source + (wcfg.twin.empty() ? "" : " + twin " + wcfg.twin));
    info.set_version(kVersion);
    service = std::make_unique<DraftHeadService>(*batcher, limits, info, metrics.get());

    auto creds = ServerCredentials();
    if (!creds.ok()) return Fail("bad_flags", creds.status());
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    int bound_port = 0;
    builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *creds, &bound_port);
    const int64_t max_msg = static_cast<int64_t>(max_rows) *
                                std::max<int64_t>(vocab * 4, geo.hidden * 4) + (1 << 20);
    builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_msg, INT32_MAX)));
    builder.SetMaxSendMessageSize(static_cast<int>(std::min<int64_t>(max_msg, INT32_MAX)));
    // No SO_REUSEPORT: a second server on the same port must fail, not silently share it.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.RegisterService(service.get());
    builder.RegisterService(&health);
    server = builder.BuildAndStart();
    if (!server || bound_port == 0)
      return Fail("listen_failed", absl::UnavailableError(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen))));
    health.SetServing(false);
    Log(LogLevel::kInfo, "grpc_listening", "address", absl::GetFlag(FLAGS_listen), "port", bound_port,
        "tls", absl::GetFlag(FLAGS_tls_cert).empty() ? "off" : (absl::GetFlag(FLAGS_tls_client_ca).empty() ? "on" : "mutual"));
    if (!children.empty()) {
      watcher = std::make_unique<ChildWatcher>(children, [&](int rank, const std::string& how, bool clean) {
        if (clean) return;
        Log(LogLevel::kError, "rank_exited", "failed_rank", rank, "how", how);
        if (metrics) metrics->SetRankHealth(rank, false);
        if (!group_failed.exchange(true)) {
          health.SetServing(false);
          batcher->Close(absl::UnavailableError(absl::StrCat("rank ", rank, " ", how)));
          kill(getpid(), SIGTERM);  // wake the main thread's wait
        }
      });
    }
  }

  // This rank's GPU: --devices[local_rank], or -1 (the backend then uses the local rank).
  int device = -1;
  {
    std::vector<int> devs;
    for (auto p : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipEmpty())) {
      int d;
      if (!absl::SimpleAtoi(p, &d) || d < 0)
        return Fail("bad_flags", absl::InvalidArgumentError(absl::StrCat("--devices: '", p, "' is not a device index")));
      devs.push_back(d);
    }
    if (setup.local_rank < static_cast<int>(devs.size())) device = devs[setup.local_rank];
  }

  // Join the group.
  auto kv = KvClient::Connect(setup.leader, join_timeout);
  if (!kv.ok()) return Fail("join_failed", kv.status());
  std::unique_ptr<Collective> comm;
  const auto t_join = std::chrono::steady_clock::now();
  if (comm_name == "gloo") {
    auto c = MakeGlooCollective(setup.rank, setup.world, BindHost(leader_host), **kv, join_timeout);
    if (!c.ok()) return Fail("join_failed", c.status());
    comm = std::move(*c);
  } else {
#if defined(DRAFTHEAD_HAVE_CUDA)
    auto c = MakeNcclCollective(setup.rank, setup.world, device, **kv, join_timeout);
    if (!c.ok()) return Fail("join_failed", c.status());
    comm = std::move(*c);
#else
    return Fail("bad_flags", absl::UnimplementedError("--comm=nccl: this build has no CUDA/NCCL"));
#endif
  }
  Log(LogLevel::kInfo, "joined_group", "world", setup.world, "comm", comm_name, "ms",
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_join).count());

  // Backend and this rank's shard.
  BackendOptions bopts;
  bopts.keep_bf16 = keep_bf16;
  bopts.threads = absl::GetFlag(FLAGS_threads);
  if (bopts.threads <= 0) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    bopts.threads = std::max(1, hw / setup.local_ranks);
  }
  bopts.device = device;
  std::unique_ptr<ComputeBackend> backend;
  if (backend_name == "cpu") {
    backend = MakeCpuBackend(bopts);
  } else {
    auto b = MakeCudaBackend(bopts, setup.local_rank);
    if (!b.ok()) return Fail("backend_failed", b.status());
    backend = std::move(*b);
  }
  RankEngine engine(std::move(comm), std::move(backend), geo, eopts);

  RankReadyReport mine;
  mine.rank = setup.rank;
  std::snprintf(mine.backend, sizeof(mine.backend), "%s", backend_name.c_str());
  {
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    auto progress = [&](uint64_t done, uint64_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::seconds(1)) return;
      last = now;
      Log(LogLevel::kInfo, "loading", "bytes", done, "of", total, "ms",
          std::chrono::duration_cast<std::chrono::milliseconds>(now - t0).count());
    };
    const bool need_bf16 = keep_bf16 || wcfg.twin.empty();
    wcfg.threads = bopts.threads;  // ranks on one host share its cores while loading too
    absl::Status st;
    auto w = LoadShardWeights(wcfg, geo, need_bf16, progress);
    if (!w.ok()) {
      st = w.status();
    } else {
      auto rep = engine.backend().Load(std::move(*w));
      if (!rep.ok()) {
        st = rep.status();
      } else {
        mine.weight_bytes = rep->device_bytes;
        mine.twin_seconds = rep->twin_seconds;
      }
    }
    mine.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mine.ok = st.ok() ? 1 : 0;
    if (!st.ok()) std::snprintf(mine.message, sizeof(mine.message), "%s", std::string(st.message()).c_str());
    if (st.ok()) {
      Log(LogLevel::kInfo, "shard_ready", "first_row", geo.row_begin(), "shard_rows", geo.shard_rows,
          "weight_bytes", mine.weight_bytes, "load_s", mine.load_seconds, "twin_s", mine.twin_seconds);
    } else {
      Log(LogLevel::kError, "shard_failed", "first_row", geo.row_begin(), "error", mine.message);
    }
  }
  auto reports = engine.ExchangeReady(mine);
  if (!reports.ok()) return Fail("group_start_failed", reports.status());
  if (!mine.ok) return 1;

  if (setup.rank != 0) {
    g_serving = true;
    absl::Status s = engine.RunWorker();
    if (!s.ok()) return Fail("worker_stopped", s);
    Log(LogLevel::kInfo, "worker_shutdown");
    return 0;
  }

  // Rank 0: summary, then serve.
  uint64_t total_bytes = 0;
  double slowest = 0;
  for (const auto& r : *reports) {
    if (!r.ok) {
      Log(LogLevel::kError, "start_failed", "failed_rank", r.rank, "error", std::string(r.message));
      server->Shutdown(std::chrono::system_clock::now());
      if (watcher) watcher->SignalAll(SIGTERM);
      return 1;
    }
    total_bytes += r.weight_bytes;
    slowest = std::max(slowest, r.load_seconds);
    metrics->SetWeightBytes(r.rank, r.weight_bytes);
    metrics->SetRankHealth(r.rank, true);
  }
  if (group_failed) return 1;
  Log(LogLevel::kInfo, "serving", "tp", setup.world, "backend", backend_name, "comm", comm_name,
      "hidden", geo.hidden, "vocab", vocab, "padded_vocab", geo.padded_vocab, "shard_rows", geo.shard_rows,
      "weight_bytes", total_bytes, "slowest_rank_load_s", slowest, "heads", keep_bf16 ? "fp8,bf16" : "fp8",
      "listen", absl::GetFlag(FLAGS_listen), "weights", shape->source);

  std::atomic<bool> leader_failed{false};
  BatchLoop batch_loop(engine, *batcher, metrics.get(), [&](const absl::Status& s) {
    leader_failed = true;
    health.SetServing(false);
    metrics->SetServing(false);
    kill(getpid(), SIGTERM);
  });
  absl::Status leader_status;
  std::atomic<bool> leader_done{false};
  std::thread leader_thread([&] {
    leader_status = batch_loop.Run();
    leader_done = true;
  });
  g_serving = true;
  service->SetReady(true);
  health.SetServing(true);
  metrics->SetServing(true);

  WaitForSignals();
  const bool failed = leader_failed || group_failed;
  health.SetServing(false);
  metrics->SetServing(false);
  if (failed) {
    // The group is broken: nothing more can be computed. Fail what is queued and what is in the
    // batch now running (UNAVAILABLE), give those answers a moment to leave, stop the workers (a
    // hung one ignores SIGTERM) and exit at once: a graceful gRPC shutdown would only turn calls
    // still arriving into CANCELLED, and the leader thread may sit in a collective's timeout.
    Log(LogLevel::kError, "group_failed_exiting");
    batcher->Close(absl::UnavailableError("the rank group failed"));
    batch_loop.FailInFlight(absl::UnavailableError("the rank group failed during this batch"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (watcher) watcher->SignalAll(SIGKILL);
    std::fflush(nullptr);
    _exit(2);
  }
  Log(LogLevel::kInfo, "draining", "signal", g_signal.load());
  const absl::Duration grace = absl::GetFlag(FLAGS_drain_grace);
  if (grace > absl::ZeroDuration()) absl::SleepFor(grace);
  server->Shutdown(std::chrono::system_clock::now() + Ms(absl::GetFlag(FLAGS_drain_timeout)));
  batch_loop.Stop();
  leader_thread.join();
  if (watcher) {
    if (!watcher->WaitAll(static_cast<int>(eopts.op_timeout.count()) + 2000)) {
      watcher->SignalAll(SIGKILL);
      return 2;
    }
  }
  if (!leader_status.ok() || group_failed) return 2;
  Log(LogLevel::kInfo, "stopped");
  return 0;
}

}  // namespace
}  // namespace drafthead

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("drafthead-server: tensor-parallel LM-head logits over gRPC");
  std::vector<std::string> args(argv, argv + argc);
  std::vector<std::string> storage;
  std::vector<char*> normalized = drafthead::DashesToUnderscores(argc, argv, storage);
  absl::ParseCommandLine(static_cast<int>(normalized.size()), normalized.data());
  drafthead::SetLogLevel(absl::GetFlag(FLAGS_log_level) == "debug"  ? drafthead::LogLevel::kDebug
                         : absl::GetFlag(FLAGS_log_level) == "warn"  ? drafthead::LogLevel::kWarn
                         : absl::GetFlag(FLAGS_log_level) == "error" ? drafthead::LogLevel::kError
                                                                     : drafthead::LogLevel::kInfo);
  // Block the signals before any thread starts so they reach only WaitForSignals.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (absl::GetFlag(FLAGS_rank) < 0 && absl::GetFlag(FLAGS_restart) == "on-failure")
    return drafthead::SuperviseGroup(args);
  if (absl::GetFlag(FLAGS_restart) != "no" && absl::GetFlag(FLAGS_restart) != "on-failure") {
    std::fprintf(stderr, "--restart must be no or on-failure\n");
    return 1;
  }
  return drafthead::RunRank(args);
}
