#include "server/app/config.h"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/host_port.h"
#include "kernels/cpu/head_gemv.h"
#include "server/group/wire_format.h"

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
ABSL_FLAG(int, local_rank, -1, "This rank's index on its host (its GPU: local rank % visible GPUs unless --devices); default: the rank");
ABSL_FLAG(std::string, bind_host, "", "Address this rank's collectives listen on (default: 127.0.0.1 when the leader is loopback, else this host's name)");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu or cuda");
ABSL_FLAG(std::string, comm, "gloo", "Collectives: gloo or nccl");
ABSL_FLAG(bool, same_host_links, true,
          "--comm=gloo: when every rank shares rank 0's host, move batches and payloads over Unix sockets "
          "(one thread wake-up a message) instead of Gloo's TCP pairs; false keeps TCP");
ABSL_FLAG(std::string, devices, "", "CUDA device per local rank, comma-separated (default: local rank % visible GPUs)");
ABSL_FLAG(int, threads, 0, "CPU backend threads per rank (0: hardware threads / ranks on this host)");
ABSL_FLAG(std::string, isa, "auto", "CPU backend GEMV: auto (the widest this CPU has), avx512bf16, avx2 or scalar");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address of rank 0: HOST:PORT, or unix:PATH (a Unix socket; callers on this host)");
ABSL_FLAG(uint32_t, max_rows, 64, "Most rows in one request and one batch");
ABSL_FLAG(uint32_t, max_top_k, 256, "Largest top_k");
ABSL_FLAG(bool, keep_bf16, false, "Keep the bf16 head too, to serve Head BF16_EXACT");
ABSL_FLAG(bool, cuda_graphs, true,
          "CUDA backend: replay one captured CUDA graph per batch shape instead of launching each "
          "copy and kernel (false: eager launches)");
ABSL_FLAG(bool, take_ahead, true,
          "Alone (tp = 1): while a batch is on the device and a full batch waits, take it and write "
          "its rows into the upload buffer (false: take each batch once the last one is done)");
ABSL_FLAG(bool, launch_ahead, true,
          "Alone (tp = 1) on a GPU, with --take-ahead: also launch the batch taken ahead behind the one "
          "on the device, so the GPU goes on to it while the other is answered (false: launch it once "
          "the other is done)");
ABSL_FLAG(bool, cuda_upload_aside, true,
          "CUDA backend: a batch launched behind another uploads its rows by the copy engine on a "
          "second stream, during the other's GEMV (false: by a kernel on the one stream, after the "
          "other's epilogue)");
ABSL_FLAG(bool, cuda_overlap_steps, false,
          "CUDA backend: a batch launched behind another runs on a second stream with its own logits "
          "and scratch buffers, so that its GEMV may start while the other's epilogue runs (false: "
          "behind it on one stream). Its gemv stage time then counts from its launch");
ABSL_FLAG(bool, cuda_stage_events, true,
          "CUDA backend: time batches' stages (h2d, gemv, epilogue, d2h) with CUDA events, for the "
          "metrics and the responses' timing, one batch in --cuda-stage-events-every (false: none; "
          "only the events the batch loop waits on are recorded)");
ABSL_FLAG(uint32_t, cuda_stage_events_every, 16,
          "CUDA backend: with --cuda-stage-events, time the first batch of every N (1: each one). "
          "A timed batch costs ~5 us more; the others answer Timing.step_untimed with those stages 0, "
          "and the metrics' stage histograms hold the timed ones");
ABSL_FLAG(std::string, unary_api, "callback",
          "gRPC API of the unary ComputeLogits: callback (a callback pool thread runs each call) or "
          "sync (the thread that polled the call runs it: one thread hand-off less, a thread blocked "
          "per call in flight)");
ABSL_FLAG(uint32_t, sync_max_pollers, 256,
          "--unary-api=sync: threads kept polling for calls (1..1024); a thread done with a call "
          "exits when this many already poll");
ABSL_FLAG(uint32_t, max_queue_rows, 4096, "Rows allowed to wait; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(uint32_t, max_caller_queue_rows, drafthead::BatcherOptions{}.max_caller_queue_rows,
          "Rows one caller (a stream, one connection's unary calls) may have waiting; more are refused "
          "with RESOURCE_EXHAUSTED (0: no bound but --max-queue-rows)");
ABSL_FLAG(std::string, queue_policy, "fair",
          "How batches are formed across callers: fair (deficit round robin by rows, a caller's backlog "
          "does not delay the others) or fifo (submission order across callers, the queue before fair "
          "queueing; for comparison)");
ABSL_FLAG(uint32_t, max_queue_delay_us, 0, "How long a batch may wait to fill (0: take what is waiting)");
ABSL_FLAG(bool, split_requests, true,
          "A batch that would end short of --max-rows takes the first rows of the next request, "
          "its other rows following in a later batch (the same answers: rows are independent of "
          "their batch mates); not for rows bound for a CUDA region's device memory. Off: whole "
          "requests only");
ABSL_FLAG(uint32_t, max_batch_requests, 0, "Most requests packed into one batch (0: no limit; 1: batching off)");
ABSL_FLAG(absl::Duration, op_timeout, absl::Seconds(5), "Longest one batch's collectives may take before the group is declared failed");
ABSL_FLAG(absl::Duration, join_timeout, absl::Seconds(120), "How long ranks wait for each other to join");
ABSL_FLAG(absl::Duration, load_timeout, absl::Minutes(30), "How long rank 0 waits for every rank's shard");
ABSL_FLAG(absl::Duration, drain_grace, absl::ZeroDuration(), "On SIGTERM: keep answering for this long with health NOT_SERVING before refusing new RPCs");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30), "On SIGTERM: longest wait for in-flight RPCs");
ABSL_FLAG(std::string, model_name, "drafthead", "The model's name in the KServe v2 API (inference.GRPCInferenceService)");
ABSL_FLAG(uint64_t, stream_buffer_bytes, drafthead::StreamBudgetOptions{}.per_stream_bytes, "StreamLogits: answer bytes one stream may have waiting to be written before it is not read further");
ABSL_FLAG(uint64_t, stream_buffer_total_bytes, drafthead::StreamBudgetOptions{}.total_bytes, "StreamLogits: the same for all streams together");
ABSL_FLAG(absl::Duration, stream_stall_timeout, absl::FromChrono(drafthead::StreamBudgetOptions{}.stall_limit), "StreamLogits: a stream whose caller reads nothing for this long is cancelled");
ABSL_FLAG(std::string, metrics_listen, "", "HOST:PORT for Prometheus /metrics (empty: off)");
ABSL_FLAG(std::string, tls_cert, "", "Server certificate (PEM) for TLS");
ABSL_FLAG(std::string, tls_key, "", "Server private key (PEM) for TLS");
ABSL_FLAG(std::string, tls_client_ca, "", "CA (PEM) for client certificates: mutual TLS");
ABSL_FLAG(std::string, restart, "no", "Launcher mode: on-failure reruns the group when it fails");
ABSL_FLAG(uint32_t, lanes, 0, "Same-host lanes (shared-memory rings, docs/lane.md) open at once; 0: off. Needs --shared-memory");
ABSL_FLAG(uint32_t, lane_spin_us, 50, "A lane's server thread polls its ring this long after its last request before sleeping on the doorbell (0..10000)");
ABSL_FLAG(std::string, shared_memory, "", "Shared-memory regions co-located callers may register: system, cuda or system,cuda (empty: off)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn or error");

namespace drafthead {
namespace {

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// --tp alone (launcher: the whole group on this host) or --rank/--world/--leader (one rank).
absl::Status ResolveGroup(ServerConfig& c) {
  const int tp = absl::GetFlag(FLAGS_tp), rank = absl::GetFlag(FLAGS_rank),
            world = absl::GetFlag(FLAGS_world);
  c.leader = absl::GetFlag(FLAGS_leader);
  if (rank < 0) {
    if (tp <= 0) return Bad("give --tp=N (whole group here) or --rank/--world/--leader");
    if (world != 0 && world != tp) return Bad("--world differs from --tp");
    c.world = tp;
    c.rank = 0;
    c.launcher = true;
    c.local_ranks = tp;
  } else {
    if (world <= 0) return Bad("--rank needs --world");
    if (tp != 0 && tp != world) return Bad("--tp differs from --world");
    if (rank >= world) return Bad(absl::StrCat("--rank=", rank, " is not below --world=", world));
    if (c.leader.empty()) return Bad("--rank needs --leader=HOST:PORT");
    c.world = world;
    c.rank = rank;
  }
  if (c.world > 64) return Bad("at most 64 ranks");
  if (!c.leader.empty()) {
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(c.leader, &host, &port); !s.ok())
      return Bad(absl::StrCat("--leader: ", s.message()));
  }
  c.local_rank = absl::GetFlag(FLAGS_local_rank) >= 0 ? absl::GetFlag(FLAGS_local_rank) : c.rank;
  c.bind_host = absl::GetFlag(FLAGS_bind_host);
  const std::string restart = absl::GetFlag(FLAGS_restart);
  if (restart != "no" && restart != "on-failure") return Bad("--restart must be no or on-failure");
  c.restart = restart == "on-failure" ? RestartPolicy::kOnFailure : RestartPolicy::kNo;
  return absl::OkStatus();
}

absl::Status ResolveCompute(ServerConfig& c) {
  c.backend = absl::GetFlag(FLAGS_backend);
  c.comm = absl::GetFlag(FLAGS_comm);
  c.same_host_links = absl::GetFlag(FLAGS_same_host_links);
  if (c.backend != "cpu" && c.backend != "cuda") return Bad("--backend must be cpu or cuda");
  if (c.comm != "gloo" && c.comm != "nccl") return Bad("--comm must be gloo or nccl");
  if (c.comm == "nccl" && c.backend != "cuda") return Bad("--comm=nccl needs --backend=cuda");
#if !defined(DRAFTHEAD_HAVE_CUDA)
  if (c.comm == "nccl") return absl::UnimplementedError("--comm=nccl: this build has no CUDA/NCCL");
#endif

  // This rank's requested GPU: --devices[local_rank], or -1. ChooseDevice decides at start-up,
  // where the visible count is known.
  std::vector<int> devices;
  for (auto p : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipEmpty())) {
    int d;
    if (!absl::SimpleAtoi(p, &d) || d < 0) return Bad(absl::StrCat("--devices: '", p, "' is not a device index"));
    devices.push_back(d);
  }
  c.requested_device = c.local_rank < static_cast<int>(devices.size()) ? devices[c.local_rank] : -1;
  c.backend_options.keep_bf16 = absl::GetFlag(FLAGS_keep_bf16);
  c.backend_options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  c.backend_options.cuda_upload_aside = absl::GetFlag(FLAGS_cuda_upload_aside);
  c.backend_options.cuda_stage_events = absl::GetFlag(FLAGS_cuda_stage_events);
  c.backend_options.cuda_stage_events_every = absl::GetFlag(FLAGS_cuda_stage_events_every);
  c.backend_options.cuda_overlap_steps = absl::GetFlag(FLAGS_cuda_overlap_steps);
  c.take_ahead = absl::GetFlag(FLAGS_take_ahead);
  c.launch_ahead = absl::GetFlag(FLAGS_launch_ahead);
  c.backend_options.threads = absl::GetFlag(FLAGS_threads);
  if (c.backend_options.threads < 0) return Bad("--threads must be >= 0 (0: hardware threads / ranks on this host)");
  const std::string isa = absl::GetFlag(FLAGS_isa);
  if (!cpu::ParseGemvIsa(isa, &c.backend_options.cpu_isa))
    return Bad(absl::StrCat("--isa must be auto, avx512bf16, avx2 or scalar, not '", isa, "'"));
  if (!cpu::GemvIsaAvailable(c.backend_options.cpu_isa))
    return Bad(absl::StrCat("--isa=", isa, ": this CPU lacks the instructions"));
  if (c.backend_options.threads == 0) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    c.backend_options.threads = std::max(1, hw / c.local_ranks);
  }

  WeightsConfig& w = c.weights;
  w.weights = absl::GetFlag(FLAGS_weights);
  w.tensor = absl::GetFlag(FLAGS_tensor);
  w.twin = absl::GetFlag(FLAGS_twin);
  w.synthetic_seed = absl::GetFlag(FLAGS_synthetic);
  w.threads = c.backend_options.threads;  // ranks on one host share its cores while loading too
  if (w.synthetic_seed) {
    w.hidden_size = absl::GetFlag(FLAGS_hidden_size);
    w.padded_vocab = absl::GetFlag(FLAGS_padded_vocab);
  } else if (w.weights.empty()) {
    return Bad("give --weights=FILE|DIR or --synthetic=SEED");
  }
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  if (c.vocab_size < 0) return Bad(absl::StrCat("--vocab-size=", c.vocab_size, " must be >= 0 (0: all the head's rows)"));
  return absl::OkStatus();
}

absl::Status ResolveLimits(ServerConfig& c) {
  const uint32_t max_rows = absl::GetFlag(FLAGS_max_rows);
  if (max_rows == 0 || max_rows > static_cast<uint32_t>(kMaxRowsLimit))
    return Bad(absl::StrCat("--max-rows must be in 1..", kMaxRowsLimit));
  c.max_top_k = absl::GetFlag(FLAGS_max_top_k);
  if (c.max_top_k == 0 || c.max_top_k > static_cast<uint32_t>(kMaxTopKLimit))
    return Bad(absl::StrCat("--max-top-k must be in 1..", kMaxTopKLimit));
  c.batcher.max_rows = max_rows;
  c.batcher.max_queue_rows = std::max(absl::GetFlag(FLAGS_max_queue_rows), max_rows);
  // A caller may always queue one request of the most rows.
  const uint32_t caller_rows = absl::GetFlag(FLAGS_max_caller_queue_rows);
  c.batcher.max_caller_queue_rows = caller_rows == 0 ? 0 : std::max(caller_rows, max_rows);
  if (const std::string api = absl::GetFlag(FLAGS_unary_api); !ParseUnaryApi(api, &c.unary_api))
    return Bad(absl::StrCat("--unary-api must be callback or sync, not '", api, "'"));
  c.sync_max_pollers = absl::GetFlag(FLAGS_sync_max_pollers);
  if (c.sync_max_pollers < 1 || c.sync_max_pollers > 1024) return Bad("--sync-max-pollers must be in 1..1024");
  if (c.backend_options.cuda_stage_events_every < 1)
    return Bad("--cuda-stage-events-every must be >= 1 (--cuda-stage-events=false times none)");
  const std::string policy = absl::GetFlag(FLAGS_queue_policy);
  if (!ParseQueuePolicy(policy, &c.batcher.policy))
    return Bad(absl::StrCat("--queue-policy must be fair or fifo, not '", policy, "'"));
  c.batcher.max_queue_delay = std::chrono::microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
  c.batcher.max_requests = absl::GetFlag(FLAGS_max_batch_requests);
  c.batcher.split_requests = absl::GetFlag(FLAGS_split_requests);

  struct Positive { const char* flag; absl::Duration value; };
  for (const Positive& d : {Positive{"--op-timeout", absl::GetFlag(FLAGS_op_timeout)},
                            Positive{"--join-timeout", absl::GetFlag(FLAGS_join_timeout)},
                            Positive{"--load-timeout", absl::GetFlag(FLAGS_load_timeout)}}) {
    if (d.value <= absl::ZeroDuration()) return Bad(absl::StrCat(d.flag, " must be > 0"));
  }
  c.engine.op_timeout = Ms(absl::GetFlag(FLAGS_op_timeout));
  c.engine.load_timeout = Ms(absl::GetFlag(FLAGS_load_timeout));
  c.engine.max_rows = static_cast<int>(max_rows);
  c.backend_options.max_rows = static_cast<int>(max_rows);
  c.join_timeout = Ms(absl::GetFlag(FLAGS_join_timeout));
  c.drain_grace = absl::GetFlag(FLAGS_drain_grace);
  c.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (c.drain_grace < absl::ZeroDuration()) return Bad("--drain-grace must be >= 0");
  if (c.drain_timeout < absl::ZeroDuration()) return Bad("--drain-timeout must be >= 0");
  c.stream_budget.per_stream_bytes = absl::GetFlag(FLAGS_stream_buffer_bytes);
  c.stream_budget.total_bytes = absl::GetFlag(FLAGS_stream_buffer_total_bytes);
  if (c.stream_budget.per_stream_bytes == 0) return Bad("--stream-buffer-bytes must be > 0");
  if (c.stream_budget.total_bytes < c.stream_budget.per_stream_bytes)
    return Bad("--stream-buffer-total-bytes must be >= --stream-buffer-bytes");
  if (absl::GetFlag(FLAGS_stream_stall_timeout) <= absl::ZeroDuration())
    return Bad("--stream-stall-timeout must be > 0");
  c.stream_budget.stall_limit = Ms(absl::GetFlag(FLAGS_stream_stall_timeout));
  return absl::OkStatus();
}

absl::Status ResolveFront(ServerConfig& c) {
  c.listen = absl::GetFlag(FLAGS_listen);
  if (absl::Status s = CheckListenAddress(c.listen); !s.ok()) return Bad(absl::StrCat("--listen: ", s.message()));
  c.model_name = absl::GetFlag(FLAGS_model_name);
  if (c.model_name.empty()) return Bad("--model-name must not be empty");
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_client_ca)};
  if (c.tls.cert.empty() && c.tls.key.empty()) {
    if (!c.tls.client_ca.empty()) return Bad("--tls-client-ca needs --tls-cert and --tls-key");
  } else if (c.tls.cert.empty() || c.tls.key.empty()) {
    return Bad("TLS needs both --tls-cert and --tls-key");
  }
  auto kinds = regions::ParseSharedMemoryKinds(absl::GetFlag(FLAGS_shared_memory));
  if (!kinds.ok()) return kinds.status();
  c.shared_memory = *kinds;
  c.lanes = absl::GetFlag(FLAGS_lanes);
  if (c.lanes > 256) return Bad("--lanes must be in 0..256");
  if (c.lanes > 0 && !c.shared_memory.system && !c.shared_memory.cuda)
    return Bad("--lanes needs --shared-memory=system (and/or cuda): a lane's rows and answers live in the caller's regions");
  const uint32_t spin = absl::GetFlag(FLAGS_lane_spin_us);
  if (spin > 10000) return Bad("--lane-spin-us must be in 0..10000");
  c.lane_spin = std::chrono::microseconds(spin);
#if !defined(DRAFTHEAD_HAVE_CUDA)
  if (c.shared_memory.cuda)
    return absl::UnimplementedError("--shared-memory=cuda: this build has no CUDA");
#endif
  const std::string level = absl::GetFlag(FLAGS_log_level);
  if (level == "debug") c.log_level = LogLevel::kDebug;
  else if (level == "info") c.log_level = LogLevel::kInfo;
  else if (level == "warn") c.log_level = LogLevel::kWarn;
  else if (level == "error") c.log_level = LogLevel::kError;
  else return Bad("--log-level must be debug, info, warn or error");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerConfig> ServerConfigFromFlags() {
  ServerConfig c;
  for (auto step : {ResolveGroup, ResolveCompute, ResolveLimits, ResolveFront}) {
    if (absl::Status s = step(c); !s.ok()) return s;
  }
  return c;
}

absl::StatusOr<int> ChooseDevice(int requested, int local_rank, int visible) {
  if (visible < 1) return absl::FailedPreconditionError("no CUDA device visible");
  if (requested >= visible)
    return absl::FailedPreconditionError(absl::StrCat("--devices names device ", requested, " for local rank ",
                                                      local_rank, " but ", visible, " are visible"));
  return requested >= 0 ? requested : local_rank % visible;
}

std::optional<std::string> UnixSocketPath(const std::string& address) {
  absl::string_view path = address;
  if (!absl::ConsumePrefix(&path, "unix:")) return std::nullopt;
  // gRPC's unix:///abs/path spelling is the same socket as unix:/abs/path.
  if (absl::StartsWith(path, "//")) path.remove_prefix(2);
  return std::string(path);
}

absl::Status CheckListenAddress(const std::string& address) {
  if (std::optional<std::string> path = UnixSocketPath(address)) {
    if (path->empty()) return absl::InvalidArgumentError("unix: needs a socket path (unix:PATH)");
    // sockaddr_un's sun_path holds 108 bytes with the terminating NUL; gRPC's own refusal of a
    // longer path is only "cannot listen".
    if (path->size() > 107)
      return absl::InvalidArgumentError(absl::StrCat("the socket path is ", path->size(), " bytes; at most 107"));
    return absl::OkStatus();
  }
  std::string host;
  int port = 0;
  return SplitHostPort(address, &host, &port);
}

}  // namespace drafthead
