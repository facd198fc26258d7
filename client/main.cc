// drafthead-client: info | logits | load (docs/client.md; the SPEC fixes info and logits).
// One file (~570 lines): the flags are declared once for all three commands, which share the
// connection and input handling below.
//
// Exit codes (common/exit_codes.h): 0 done; 1 the server or the run failed (message on stderr); 2 bad
// usage or input.
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/drafthead_client.h"
#include "client/kserve_wire.h"
#include "client/load_regions.h"
#include "client/load_report.h"
#include "client/load_tester.h"
#include "common/command_line.h"
#include "common/exit_codes.h"
#include "common/heap.h"
#include "common/safetensors.h"
#include "kernels/numeric.h"
#include "nlohmann/json.hpp"

// ---- every subcommand ----
ABSL_FLAG(std::string, target, "", "server HOST:PORT, unix:PATH (a Unix socket), or any gRPC target (dns:///NAME)");
ABSL_FLAG(std::string, tls_ca, "", "PEM root CA: use TLS and verify the server with it");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mTLS; with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key (mTLS)");
ABSL_FLAG(std::string, tls_server_name, "", "name the server's certificate must carry (default: the target host)");
ABSL_FLAG(bool, tls, false, "use TLS with the system's roots (implied by --tls-ca / --tls-cert)");
ABSL_FLAG(std::string, timeout, "", "deadline of each call, all attempts (default: info, logits 30s; load 10s per request)");
ABSL_FLAG(bool, balance_replicas, false,
          "round robin over every address the target resolves to (dns:///NAME, ipv4:A:P,B:P), each "
          "health-checked: replicas behind a headless Service (docs/operations.md)");
ABSL_FLAG(int, attempts, 3, "attempts per call on UNAVAILABLE (info, logits), with exponential backoff");
// ---- info ----
ABSL_FLAG(std::string, json, "", "info: --json prints JSON; load: --json=FILE writes the JSON report ('-': stdout)");
ABSL_FLAG(std::string, wait, "0", "info: poll health until SERVING for this long (seconds or 10s/500ms; 0: one check)");
// ---- logits ----
ABSL_FLAG(std::string, hidden, "", "safetensors file of hidden states (BF16 or F32, [..., K])");
ABSL_FLAG(std::string, tensor, "", "tensor name in --hidden");
ABSL_FLAG(std::string, rows, "", "logits: A:B, the rows [A, B) of --tensor (default: all); load: rows per request (default 5)");
ABSL_FLAG(std::string, mode, "full", "full | topk | argmax | sample");
ABSL_FLAG(std::string, dtype, "bf16", "full logits dtype: bf16 | fp32");
ABSL_FLAG(uint32_t, k, 8, "topk: k");
ABSL_FLAG(bool, probs, false, "topk: also return softmax(logits / T) of each id");
ABSL_FLAG(float, temperature, 1.0f, "sample (> 0) and topk probs");
ABSL_FLAG(uint64_t, seed, 0, "sample: seed");
ABSL_FLAG(std::string, head, "fp8", "fp8 | bf16 (the BF16_EXACT head, if the server keeps it)");
ABSL_FLAG(std::string, out, "", "logits: output safetensors file");
// ---- load ----
ABSL_FLAG(int, concurrency, 1, "load, closed loop (-c): requests in flight");
ABSL_FLAG(double, rps, 0, "load: open loop at this many requests/s (latency from the scheduled send time)");
ABSL_FLAG(std::string, arrival, "constant", "load, open loop: constant | poisson");
ABSL_FLAG(uint64_t, arrival_seed, 1, "load: seed of the Poisson arrivals");
ABSL_FLAG(std::string, duration, "", "load (-z): measured time, e.g. 10s (default 10s, or none with -n)");
ABSL_FLAG(int64_t, requests, 0, "load (-n): measured requests to send");
ABSL_FLAG(std::string, warmup, "0", "load: unmeasured time before measuring, e.g. 2s");
ABSL_FLAG(int, connections, 0,
          "load: channels (TCP connections), used round robin; 0: one per caller (closed loop: one per "
          "in-flight request, so that -c N is N callers to the server; open loop: 1)");
ABSL_FLAG(bool, stream, false, "load: StreamLogits (latency per message) instead of ComputeLogits");
ABSL_FLAG(std::string, protocol, "native", "load: native (drafthead.v1) | kserve (KServe v2 ModelInfer / ModelStreamInfer)");
ABSL_FLAG(std::string, model_name, "drafthead", "load --protocol=kserve: the server's --model-name");
ABSL_FLAG(int, streams, 0, "load --stream: streams in all (default: one per connection)");
ABSL_FLAG(std::string, sweep, "", "load: closed-loop concurrency sweep c1,c2,... (one run each)");
ABSL_FLAG(uint64_t, hidden_seed, 1, "load: seed of the generated hidden states (without --hidden)");
ABSL_FLAG(int, hidden_pool, 16, "load: distinct requests cycled through");
ABSL_FLAG(uint32_t, hidden_size, 0, "load: hidden size when the server cannot tell (default: GetModelInfo)");
ABSL_FLAG(int64_t, max_inflight, 20000, "load, open loop: most requests in flight (a safety valve)");
ABSL_FLAG(std::string, csv, "", "load: one line per request to this file");
ABSL_FLAG(std::string, html, "", "load: self-contained HTML report with plots");
ABSL_FLAG(bool, quiet, false, "load: no text summary on stdout");
ABSL_FLAG(std::string, lane, "off", "load: shm: a same-host lane (shared-memory rings, docs/lane.md; the server needs --lanes) instead of gRPC calls | off");
ABSL_FLAG(std::string, client_api, "callback", "load: callback (gRPC's callback API, every answer handed to a pool thread) | blocking (the client library's blocking call on a thread per in-flight call: what a C++ caller that waits sees; closed loop, unary)");
ABSL_FLAG(int64_t, lane_spin_us, -1,
          "load --lane=shm: a waiting call spins this long before sleeping on the doorbell; -1: the "
          "lane's own budget (docs/lane.md: 1.5x the recent time of calls alone in flight, 50 us .. 2 ms)");
ABSL_FLAG(std::string, shared_memory, "", "load: hidden rows (and full logits) through a registered region: system | cuda (default: on the wire)");
ABSL_FLAG(bool, no_probe, false, "load: skip the single checked request sent before the run");

namespace drafthead::client {
namespace {

int Fail(int code, const absl::Status& s) {
  std::cerr << "drafthead-client: " << s.message() << " [" << absl::StatusCodeToString(s.code()) << "]\n";
  return code;
}
int Usage(const std::string& m) {
  std::cerr << "drafthead-client: " << m << "\n";
  return kExitUsage;
}

// "10s", "500ms", "2m" (absl durations) or a plain number of seconds.
absl::StatusOr<absl::Duration> ParseSeconds(const std::string& s, const char* flag) {
  absl::Duration d;
  if (absl::ParseDuration(s, &d)) return d;
  double secs;
  if (absl::SimpleAtod(s, &secs) && secs >= 0 && std::isfinite(secs)) return absl::Seconds(secs);
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", s, ": not a duration (e.g. 10, 2.5s, 500ms)"));
}

std::string TimeoutFlag(const char* default_value) {
  const std::string t = absl::GetFlag(FLAGS_timeout);
  return t.empty() ? default_value : t;
}

absl::StatusOr<ClientOptions> CommonOptions(absl::Duration default_timeout) {
  ClientOptions o;
  absl::StatusOr<TlsOptions> tls = TlsOptions::FromFiles(absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                                                         absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_server_name));
  if (!tls.ok()) return tls.status();
  o.tls = *tls;
  if (absl::GetFlag(FLAGS_tls)) o.tls.enabled = true;
  o.default_deadline = default_timeout;
  o.retry.max_attempts = std::max(1, absl::GetFlag(FLAGS_attempts));
  o.balance_replicas = absl::GetFlag(FLAGS_balance_replicas);
  if (absl::GetFlag(FLAGS_target).empty()) return absl::InvalidArgumentError("--target=HOST:PORT (or unix:PATH) is required");
  return o;
}

absl::StatusOr<v1::Mode> ParseMode(const std::string& m) {
  if (m == "full") return v1::FULL_LOGITS;
  if (m == "topk") return v1::TOP_K;
  if (m == "argmax") return v1::ARGMAX;
  if (m == "sample") return v1::SAMPLE;
  return absl::InvalidArgumentError(absl::StrCat("--mode=", m, ": want full, topk, argmax or sample"));
}
absl::StatusOr<v1::DType> ParseDType(const std::string& d) {
  if (d == "bf16") return v1::BF16;
  if (d == "fp32") return v1::FP32;
  return absl::InvalidArgumentError(absl::StrCat("--dtype=", d, ": want bf16 or fp32"));
}
absl::StatusOr<v1::Head> ParseHead(const std::string& h) {
  if (h == "fp8") return v1::FP8_TWIN;
  if (h == "bf16") return v1::BF16_EXACT;
  return absl::InvalidArgumentError(absl::StrCat("--head=", h, ": want fp8 or bf16"));
}

absl::StatusOr<RequestOptions> ParseRequestOptions() {
  RequestOptions o;
  absl::StatusOr<v1::DType> d = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!d.ok()) return d.status();
  absl::StatusOr<v1::Head> h = ParseHead(absl::GetFlag(FLAGS_head));
  if (!h.ok()) return h.status();
  o.logits_dtype = *d;
  o.head = *h;
  o.k = absl::GetFlag(FLAGS_k);
  o.probs = absl::GetFlag(FLAGS_probs);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.seed = absl::GetFlag(FLAGS_seed);
  return o;
}

std::string ModelInfoText(const v1::ModelInfo& m) {
  std::string heads;
  for (int h : m.heads()) absl::StrAppend(&heads, heads.empty() ? "" : ",", v1::Head_Name(static_cast<v1::Head>(h)));
  return absl::StrCat("hidden_size  ", m.hidden_size(), "\nvocab_size   ", m.vocab_size(), "\npadded_vocab ",
                      m.padded_vocab(), "\ntp           ", m.tp(), "\nshard_rows   ", m.shard_rows(), "\nmax_rows     ",
                      m.max_rows(), "\nmax_top_k    ", m.max_top_k(), "\nbackend      ", m.backend(), "\ncomm         ",
                      m.comm(), "\nheads        ", heads, "\nweights      ", m.weights(), "\nversion      ", m.version(),
                      "\nlanes        ", m.lanes(), "\n");
}

nlohmann::ordered_json ModelInfoJson(const v1::ModelInfo& m) {
  nlohmann::ordered_json heads = nlohmann::ordered_json::array();
  for (int h : m.heads()) heads.push_back(v1::Head_Name(static_cast<v1::Head>(h)));
  return {{"hidden_size", m.hidden_size()}, {"vocab_size", m.vocab_size()}, {"padded_vocab", m.padded_vocab()},
          {"tp", m.tp()}, {"shard_rows", m.shard_rows()}, {"max_rows", m.max_rows()}, {"max_top_k", m.max_top_k()},
          {"backend", m.backend()}, {"comm", m.comm()}, {"heads", heads}, {"weights", m.weights()},
          {"version", m.version()}, {"lanes", m.lanes()}, {"host_id", m.host_id()}};
}

// ---- info -------------------------------------------------------------------------------------

int RunInfo() {
  absl::StatusOr<absl::Duration> timeout = ParseSeconds(TimeoutFlag("30s"), "timeout");
  if (!timeout.ok()) return Fail(kExitUsage, timeout.status());
  absl::StatusOr<absl::Duration> wait = ParseSeconds(absl::GetFlag(FLAGS_wait), "wait");
  if (!wait.ok()) return Fail(kExitUsage, wait.status());
  absl::StatusOr<ClientOptions> o = CommonOptions(*timeout);
  if (!o.ok()) return Fail(kExitUsage, o.status());
  absl::StatusOr<std::unique_ptr<DraftHeadClient>> c = DraftHeadClient::Connect(absl::GetFlag(FLAGS_target), *o);
  if (!c.ok()) return Fail(kExitFailed, c.status());
  absl::Status serving = *wait > absl::ZeroDuration() ? (*c)->WaitUntilServing(*wait)
                                                      : (*c)->CheckHealth("", std::min(*timeout, absl::Seconds(5)));
  if (!serving.ok()) return Fail(kExitFailed, serving);
  absl::StatusOr<v1::ModelInfo> info = (*c)->Info();
  if (!info.ok()) return Fail(kExitFailed, info.status());
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::cout << ModelInfoJson(*info).dump(2) << "\n";
  } else {
    std::cout << ModelInfoText(*info);
  }
  return kExitOk;
}

// ---- hidden states from a file ----------------------------------------------------------------

struct HiddenMatrix {
  v1::DType dtype = v1::BF16;
  uint64_t rows = 0, cols = 0;
  std::string bytes;  // rows x cols elements
};

// The tensor as [rows, K] (leading dimensions flattened), rows [a, b) of it.
absl::StatusOr<HiddenMatrix> LoadHidden(const std::string& path, const std::string& name, const std::string& range) {
  if (path.empty() || name.empty()) return absl::InvalidArgumentError("--hidden=FILE and --tensor=NAME are required");
  absl::StatusOr<std::unique_ptr<st::SafetensorsFile>> f = st::SafetensorsFile::Open(path);
  if (!f.ok()) return f.status();
  absl::StatusOr<const st::TensorInfo*> t = (*f)->Find(name);
  if (!t.ok()) return t.status();
  const st::TensorInfo& x = **t;
  HiddenMatrix m;
  if (x.dtype == st::DType::kBF16) {
    m.dtype = v1::BF16;
  } else if (x.dtype == st::DType::kF32) {
    m.dtype = v1::FP32;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\" is ", st::DTypeName(x.dtype), "; want BF16 or F32"));
  }
  if (x.shape.empty() || x.shape.back() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\" needs shape [..., K] with K > 0"));
  }
  m.cols = x.shape.back();
  const uint64_t all_rows = static_cast<uint64_t>(x.numel) / m.cols;
  uint64_t a = 0, b = all_rows;
  if (!range.empty()) {
    std::vector<std::string> p = absl::StrSplit(range, ':');
    if (p.size() != 2 || (!p[0].empty() && !absl::SimpleAtoi(p[0], &a)) || (!p[1].empty() && !absl::SimpleAtoi(p[1], &b))) {
      return absl::InvalidArgumentError(absl::StrCat("--rows=", range, ": want A:B (either side may be empty)"));
    }
    if (p[1].empty()) b = all_rows;
  }
  if (a >= b || b > all_rows) {
    return absl::InvalidArgumentError(absl::StrCat("--rows=", range, ": empty or past the tensor's ", all_rows, " rows"));
  }
  const size_t esize = m.dtype == v1::FP32 ? 4 : 2;
  m.rows = b - a;
  absl::StatusOr<std::pair<const uint8_t*, uint64_t>> data = (*f)->Bytes(name);
  if (!data.ok()) return data.status();
  m.bytes.assign(reinterpret_cast<const char*>(data->first) + a * m.cols * esize, m.rows * m.cols * esize);
  return m;
}

// ---- logits -----------------------------------------------------------------------------------

int RunLogits() {
  absl::StatusOr<absl::Duration> timeout = ParseSeconds(TimeoutFlag("30s"), "timeout");
  if (!timeout.ok()) return Fail(kExitUsage, timeout.status());
  absl::StatusOr<ClientOptions> o = CommonOptions(*timeout);
  if (!o.ok()) return Fail(kExitUsage, o.status());
  absl::StatusOr<v1::Mode> mode = ParseMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return Fail(kExitUsage, mode.status());
  absl::StatusOr<RequestOptions> ro = ParseRequestOptions();
  if (!ro.ok()) return Fail(kExitUsage, ro.status());
  if (absl::GetFlag(FLAGS_out).empty()) return Usage("--out=FILE.safetensors is required");
  absl::StatusOr<HiddenMatrix> h = LoadHidden(absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_tensor), absl::GetFlag(FLAGS_rows));
  if (!h.ok()) return Fail(kExitUsage, h.status());
  absl::StatusOr<std::unique_ptr<DraftHeadClient>> c = DraftHeadClient::Connect(absl::GetFlag(FLAGS_target), *o);
  if (!c.ok()) return Fail(kExitFailed, c.status());
  absl::StatusOr<v1::ModelInfo> info = (*c)->Info();
  if (!info.ok()) return Fail(kExitFailed, info.status());
  if (h->cols != info->hidden_size()) {
    return Usage(absl::StrCat("--tensor has ", h->cols, " columns but the server's hidden size is ", info->hidden_size()));
  }
  // More rows than one call takes go in several calls, answered in order.
  const uint64_t chunk = std::max<uint32_t>(1, info->max_rows());
  const size_t esize = h->dtype == v1::FP32 ? 4 : 2;
  std::string logits;
  std::vector<int32_t> ids;
  std::vector<float> values, probs;
  uint32_t vocab = 0, k = 0;
  for (uint64_t r0 = 0; r0 < h->rows; r0 += chunk) {
    const uint32_t n = static_cast<uint32_t>(std::min(chunk, h->rows - r0));
    HiddenRows rows{n, h->dtype, std::string_view(h->bytes).substr(r0 * h->cols * esize, n * h->cols * esize)};
    RequestOptions opt = *ro;
    opt.request_id = r0;
    if (*mode == v1::FULL_LOGITS) {
      absl::StatusOr<LogitsResult> r = (*c)->Logits(rows, opt);
      if (!r.ok()) return Fail(kExitFailed, r.status());
      vocab = r->vocab_size;
      logits += r->data;
    } else {
      absl::StatusOr<TokensResult> r = *mode == v1::TOP_K  ? (*c)->TopK(rows, opt)
                                       : *mode == v1::ARGMAX ? (*c)->Argmax(rows, opt)
                                                             : (*c)->Sample(rows, opt);
      if (!r.ok()) return Fail(kExitFailed, r.status());
      k = r->k;
      ids.insert(ids.end(), r->token_ids.begin(), r->token_ids.end());
      values.insert(values.end(), r->values.begin(), r->values.end());
      probs.insert(probs.end(), r->probs.begin(), r->probs.end());
    }
  }
  std::vector<st::TensorData> out;  // borrows logits / ids / values / probs
  const int64_t R = static_cast<int64_t>(h->rows);
  if (*mode == v1::FULL_LOGITS) {
    out.push_back({{"logits", ro->logits_dtype == v1::FP32 ? st::DType::kF32 : st::DType::kBF16, {R, vocab}}, logits.data(), logits.size()});
  } else {
    out.push_back({{"token_ids", st::DType::kI32, {R, k}}, ids.data(), ids.size() * 4});
    out.push_back({{"values", st::DType::kF32, {R, k}}, values.data(), values.size() * 4});
    if (*mode == v1::TOP_K && ro->probs) out.push_back({{"probs", st::DType::kF32, {R, k}}, probs.data(), probs.size() * 4});
  }
  std::map<std::string, std::string> meta = {{"mode", absl::GetFlag(FLAGS_mode)},
                                             {"head", absl::GetFlag(FLAGS_head)},
                                             {"server_version", info->version()},
                                             {"vocab_size", absl::StrCat(info->vocab_size())}};
  if (absl::Status s = st::WriteSafetensors(absl::GetFlag(FLAGS_out), out, meta); !s.ok()) return Fail(kExitFailed, s);
  return kExitOk;
}

// ---- load -------------------------------------------------------------------------------------

// Deterministic N(0, 1) hidden values (Box-Muller on the splitmix counter stream) as bf16.
std::string GeneratedHidden(uint64_t seed, uint64_t index, uint32_t rows, uint32_t k) {
  std::string out(size_t{rows} * k * 2, '\0');
  const uint64_t base = Mix64(seed ^ Mix64(index + 1));
  for (size_t i = 0; i < size_t{rows} * k; ++i) {
    const uint64_t z = Mix64(base + i);
    const double u1 = (static_cast<double>(z >> 40) + 0.5) * 0x1.0p-24;
    const double u2 = static_cast<double>(z & 0xffffff) * 0x1.0p-24;
    const float g = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    const uint16_t b = FloatToBf16(g);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

bool WriteText(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text;
    return static_cast<bool>(std::cout);
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  return static_cast<bool>(f);
}

std::string NowRfc3339() { return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()); }

int RunLoadCommand() {
  absl::StatusOr<absl::Duration> timeout =
      ParseSeconds(TimeoutFlag("10s"), "timeout");
  if (!timeout.ok()) return Fail(kExitUsage, timeout.status());
  absl::StatusOr<ClientOptions> co = CommonOptions(*timeout);
  if (!co.ok()) return Fail(kExitUsage, co.status());
  absl::StatusOr<v1::Mode> mode = ParseMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return Fail(kExitUsage, mode.status());
  absl::StatusOr<RequestOptions> ro = ParseRequestOptions();
  if (!ro.ok()) return Fail(kExitUsage, ro.status());
  absl::StatusOr<absl::Duration> warmup = ParseSeconds(absl::GetFlag(FLAGS_warmup), "warmup");
  if (!warmup.ok()) return Fail(kExitUsage, warmup.status());

  LoadOptions lo;
  lo.target = absl::GetFlag(FLAGS_target);
  lo.client = *co;
  lo.connections = absl::GetFlag(FLAGS_connections);
  lo.stream = absl::GetFlag(FLAGS_stream);
  const std::string protocol = absl::GetFlag(FLAGS_protocol);
  if (protocol == "kserve") {
    lo.protocol = Protocol::kKServe;
  } else if (protocol != "native") {
    return Usage(absl::StrCat("--protocol=", protocol, ": want native or kserve"));
  }
  const std::string lane = absl::GetFlag(FLAGS_lane);
  if (lane != "shm" && lane != "off") return Usage(absl::StrCat("--lane=", lane, ": want shm or off"));
  lo.lane = lane == "shm";
  const int64_t lane_spin_us = absl::GetFlag(FLAGS_lane_spin_us);
  lo.lane_spin_ns = lane_spin_us < 0 ? -1 : lane_spin_us * 1000;
  lo.client.lane = LaneMode::kOff;  // the gRPC runs stay gRPC; --lane=shm asks for the lane itself
  const std::string client_api = absl::GetFlag(FLAGS_client_api);
  if (client_api != "callback" && client_api != "blocking")
    return Usage(absl::StrCat("--client-api=", client_api, ": want callback or blocking"));
  lo.blocking = client_api == "blocking";
  lo.streams = absl::GetFlag(FLAGS_streams);
  lo.concurrency = absl::GetFlag(FLAGS_concurrency);
  lo.rps = absl::GetFlag(FLAGS_rps);
  lo.arrival_seed = absl::GetFlag(FLAGS_arrival_seed);
  const std::string arrival = absl::GetFlag(FLAGS_arrival);
  if (arrival == "constant") {
    lo.arrival = Arrival::kConstant;
  } else if (arrival == "poisson") {
    lo.arrival = Arrival::kPoisson;
  } else {
    return Usage(absl::StrCat("--arrival=", arrival, ": want constant or poisson"));
  }
  lo.requests = absl::GetFlag(FLAGS_requests);
  if (!absl::GetFlag(FLAGS_duration).empty()) {
    absl::StatusOr<absl::Duration> d = ParseSeconds(absl::GetFlag(FLAGS_duration), "duration");
    if (!d.ok()) return Fail(kExitUsage, d.status());
    lo.duration = *d;
  } else {
    lo.duration = lo.requests > 0 ? absl::InfiniteDuration() : absl::Seconds(10);
  }
  lo.warmup = *warmup;
  lo.timeout = *timeout;
  lo.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  lo.record_requests = !absl::GetFlag(FLAGS_csv).empty();

  std::vector<int> sweep;
  if (!absl::GetFlag(FLAGS_sweep).empty()) {
    if (lo.rps > 0) return Usage("--sweep is a closed-loop concurrency sweep; drop --rps");
    for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_sweep), ',', absl::SkipEmpty())) {
      int c;
      if (!absl::SimpleAtoi(p, &c) || c < 1) return Usage(absl::StrCat("--sweep: bad concurrency \"", p, "\""));
      sweep.push_back(c);
    }
  }

  // Request shape, checked against the server's ModelInfo when it answers.
  absl::StatusOr<std::unique_ptr<DraftHeadClient>> client = DraftHeadClient::Connect(lo.target, *co);
  if (!client.ok()) return Fail(kExitFailed, client.status());
  absl::StatusOr<v1::ModelInfo> info = (*client)->Info(absl::Seconds(10));
  uint32_t K = absl::GetFlag(FLAGS_hidden_size);
  if (info.ok()) {
    if (K == 0) K = info->hidden_size();
  } else if (K == 0) {
    return Fail(kExitFailed, absl::Status(info.status().code(), absl::StrCat("GetModelInfo (give --hidden-size to go on without it): ",
                                                                             info.status().message())));
  }
  std::vector<std::string> pool;
  uint32_t rows = 5;
  if (!absl::GetFlag(FLAGS_rows).empty() && (!absl::SimpleAtoi(absl::GetFlag(FLAGS_rows), &rows) || rows < 1)) {
    return Usage(absl::StrCat("--rows=", absl::GetFlag(FLAGS_rows), ": load wants a row count per request"));
  }
  const int pool_size = std::max(1, absl::GetFlag(FLAGS_hidden_pool));
  std::string hidden_source;
  if (!absl::GetFlag(FLAGS_hidden).empty()) {
    absl::StatusOr<HiddenMatrix> h = LoadHidden(absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_tensor), "");
    if (!h.ok()) return Fail(kExitUsage, h.status());
    if (h->cols != K) return Usage(absl::StrCat("--tensor has ", h->cols, " columns, the server's hidden size is ", K));
    const size_t esize = h->dtype == v1::FP32 ? 4 : 2;
    const size_t row_bytes = h->cols * esize;
    for (int i = 0; i < pool_size; ++i) {
      std::string bytes;
      for (uint32_t r = 0; r < rows; ++r) {
        const uint64_t src = (uint64_t{static_cast<uint64_t>(i)} * rows + r) % h->rows;  // windows, wrapping
        bytes.append(h->bytes, src * row_bytes, row_bytes);
      }
      RequestOptions opt = *ro;
      opt.request_id = static_cast<uint64_t>(i);
      pool.push_back(BuildRequest(*mode, HiddenRows{rows, h->dtype, bytes}, opt).SerializeAsString());
    }
    hidden_source = absl::StrCat(absl::GetFlag(FLAGS_hidden), ":", absl::GetFlag(FLAGS_tensor));
  } else {
    for (int i = 0; i < pool_size; ++i) {
      const std::string bytes = GeneratedHidden(absl::GetFlag(FLAGS_hidden_seed), static_cast<uint64_t>(i), rows, K);
      RequestOptions opt = *ro;
      opt.request_id = static_cast<uint64_t>(i);
      pool.push_back(BuildRequest(*mode, HiddenRows{rows, v1::BF16, bytes}, opt).SerializeAsString());
    }
    hidden_source = absl::StrCat("generated, seed ", absl::GetFlag(FLAGS_hidden_seed));
  }
  // --shared-memory: the same requests, their bytes moved into a region registered for the run.
  std::unique_ptr<LoadRegions> regions;
  const std::string shared_memory = absl::GetFlag(FLAGS_shared_memory);
  if (!shared_memory.empty()) {
    if (!info.ok()) return Fail(kExitFailed, absl::Status(info.status().code(), "--shared-memory needs GetModelInfo"));
    absl::StatusOr<std::unique_ptr<LoadRegions>> moved = MoveToRegions(**client, shared_memory, info->vocab_size(), &pool);
    if (!moved.ok()) return Fail(kExitFailed, moved.status());
    regions = *std::move(moved);
  }
  // KServe: the same requests restated (the probe below checks the native one first).
  std::vector<std::string> kserve_pool;
  if (lo.protocol == Protocol::kKServe) {
    for (const std::string& bytes : pool) {
      v1::LogitsRequest native;
      native.ParseFromString(bytes);
      kserve_pool.push_back(KServeRequestBytes(native, absl::GetFlag(FLAGS_model_name)));
    }
  }
  // One checked request first: a request the server refuses would otherwise be a run of errors.
  if (!absl::GetFlag(FLAGS_no_probe)) {
    v1::LogitsRequest probe;
    probe.ParseFromString(pool[0]);
    absl::StatusOr<v1::LogitsResponse> r = (*client)->Compute(probe, *timeout);
    if (!r.ok()) return Fail(kExitFailed, absl::Status(r.status().code(), absl::StrCat("probe request: ", r.status().message())));
    if (!kserve_pool.empty()) {
      absl::Status s = ProbeKServe((*client)->channel(0), kserve_pool[0], *timeout);
      if (!s.ok()) return Fail(kExitFailed, absl::Status(s.code(), absl::StrCat("KServe probe request: ", s.message())));
    }
  }
  if (!kserve_pool.empty()) pool = std::move(kserve_pool);

  LoadReport report;
  report.started_at = NowRfc3339();
  if (info.ok()) report.server = *info;
  report.sweep = !sweep.empty();
  report.config = {{"target", lo.target},
                   {"tls", lo.client.tls.enabled},
                   {"balance_replicas", lo.client.balance_replicas},
                   {"loop", lo.rps > 0 ? "open" : "closed"},
                   {"concurrency", lo.concurrency},
                   {"rps", lo.rps},
                   {"arrival", arrival},
                   {"duration_s", lo.duration == absl::InfiniteDuration() ? nlohmann::ordered_json(nullptr)
                                                                          : nlohmann::ordered_json(absl::ToDoubleSeconds(lo.duration))},
                   {"requests", lo.requests},
                   {"warmup_s", absl::ToDoubleSeconds(lo.warmup)},
                   {"timeout_s", absl::ToDoubleSeconds(lo.timeout)},
                   {"connections", lo.connections},
                   {"protocol", protocol},
                   {"lane", lane},
                   {"client_api", client_api},
                   {"stream", lo.stream},
                   {"streams", lo.stream ? lo.streams : 0},  // 0: one per connection
                   {"rows", rows},
                   {"hidden_size", K},
                   {"mode", absl::GetFlag(FLAGS_mode)},
                   {"k", ro->k},
                   {"probs", ro->probs},
                   {"dtype", absl::GetFlag(FLAGS_dtype)},
                   {"temperature", ro->temperature},
                   {"seed", ro->seed},
                   {"head", absl::GetFlag(FLAGS_head)},
                   {"hidden", hidden_source},
                   {"hidden_pool", pool_size},
                   {"shared_memory", shared_memory.empty() ? "off" : shared_memory},
                   {"sweep", absl::GetFlag(FLAGS_sweep)}};

  const bool tty = isatty(STDERR_FILENO);
  if (sweep.empty()) sweep.push_back(lo.concurrency);
  for (int c : sweep) {
    lo.concurrency = c;
    if (tty) {
      // Live progress on a terminal only; logs and pipes stay clean.
      lo.progress = [c, &lo](const LoadProgress& p) {
        static double last_t = 0;
        static uint64_t last_n = 0;
        const double rate = p.elapsed_s > last_t ? (p.completed - last_n) / (p.elapsed_s - last_t) : 0;
        last_t = p.elapsed_s;
        last_n = p.completed;
        std::fprintf(stderr, "\r\033[K[%6.1fs]%s %s %llu done, %llu errors, %lld in flight, %.0f req/s", p.elapsed_s,
                     p.warming_up ? " warmup" : "",
                     lo.rps > 0 ? absl::StrCat("rps ", lo.rps).c_str() : absl::StrCat("c=", c).c_str(),
                     static_cast<unsigned long long>(p.completed), static_cast<unsigned long long>(p.errors),
                     static_cast<long long>(p.inflight), rate);
        std::fflush(stderr);
      };
    }
    absl::StatusOr<LoadResult> r = RunLoad(lo, pool, rows);
    if (tty) std::fprintf(stderr, "\r\033[K");
    if (!r.ok()) return Fail(kExitFailed, r.status());
    report.runs.push_back(*std::move(r));
  }

  if (!absl::GetFlag(FLAGS_quiet)) std::cout << FormatText(report);
  bool io_ok = true;
  if (!absl::GetFlag(FLAGS_json).empty()) io_ok &= WriteText(absl::GetFlag(FLAGS_json), ToJson(report).dump(1) + "\n");
  if (!absl::GetFlag(FLAGS_csv).empty()) io_ok &= WriteText(absl::GetFlag(FLAGS_csv), ToCsv(report));
  if (!absl::GetFlag(FLAGS_html).empty()) io_ok &= WriteText(absl::GetFlag(FLAGS_html), ToHtml(report));
  if (!io_ok) return Fail(kExitFailed, absl::DataLossError("writing a report file failed"));
  uint64_t ok = 0;
  for (const auto& r : report.runs) ok += r.ok;
  if (ok == 0) return Fail(kExitFailed, absl::UnavailableError("no request was answered OK"));
  return kExitOk;
}

// Short load flags (-c 8, -c8, -c=8) and a bare --json (info) into absl's spelling.
std::vector<char*> RewriteArgs(int argc, char** argv, std::vector<std::string>& storage) {
  static const std::pair<const char*, const char*> kShort[] = {{"-c", "concurrency"}, {"-z", "duration"}, {"-n", "requests"}};
  std::vector<char*> out{argv[0]};
  storage.reserve(argc * 2);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool done = false;
    for (const auto& [s, name] : kShort) {
      if (a.rfind(s, 0) != 0) continue;
      if (a.size() > 2 && a[2] != '=' && !std::isdigit(static_cast<unsigned char>(a[2]))) continue;
      std::string value = a.substr(2);
      if (!value.empty() && value[0] == '=') value = value.substr(1);
      if (value.empty() && i + 1 < argc) value = argv[++i];
      storage.push_back(absl::StrCat("--", name, "=", value));
      out.push_back(storage.back().data());
      done = true;
      break;
    }
    if (done) continue;
    if (a == "--json") {
      storage.push_back("--json=-");
      out.push_back(storage.back().data());
      continue;
    }
    out.push_back(argv[i]);
  }
  return out;
}

}  // namespace
}  // namespace drafthead::client

int main(int argc, char** argv) {
  using namespace drafthead::client;
  drafthead::KeepRequestBuffersInHeap();  // as the server does: its figures, not its page faults
  drafthead::SetProgramInfo(
      "drafthead-client",
      "drafthead-client info|logits|load --target=HOST:PORT|unix:PATH [flags]\n"
      "  info    --target [--json] [--wait=SECONDS]\n"
      "  logits  --target --hidden=F.safetensors --tensor=NAME [--rows=A:B] --mode=full|topk|argmax|sample\n"
      "          [--dtype=bf16|fp32] [--k=K] [--probs] [--temperature=T] [--seed=S] [--head=fp8|bf16] --out=F.safetensors\n"
      "  load    --target [-c N | --rps R [--arrival=constant|poisson]] [-z 10s | -n N] [--warmup=2s]\n"
      "          [--connections=N] [--stream] [--protocol=kserve] [--lane=shm] [--client-api=blocking] [--rows=5] [--mode=...] [--sweep=1,2,4] [--json=F] [--csv=F] [--html=F]\n"
      "  TLS: --tls-ca --tls-cert --tls-key --tls-server-name");
  std::vector<std::string> storage;
  std::vector<char*> normalized = drafthead::NormalizeFlagNames(argc, argv, storage);
  std::vector<std::string> storage2;
  std::vector<char*> args = RewriteArgs(argc, normalized.data(), storage2);
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() < 2) {
    std::cerr << "drafthead-client: give a subcommand: info, logits or load (--help for flags)\n";
    return drafthead::kExitUsage;
  }
  if (positional.size() > 2) {
    std::cerr << "drafthead-client: unexpected argument \"" << positional[2] << "\"\n";
    return drafthead::kExitUsage;
  }
  const std::string cmd = positional[1];
  if (cmd == "info") return RunInfo();
  if (cmd == "logits") return RunLogits();
  if (cmd == "load") return RunLoadCommand();
  std::cerr << "drafthead-client: unknown subcommand \"" << cmd << "\" (info, logits, load)\n";
  return drafthead::kExitUsage;
}
