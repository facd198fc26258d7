// drafthead-fake-server: a stand-in for drafthead-server that answers at once, for the client's
// own tests and for measuring how many requests/s the load tester can drive.
//
// It validates requests with the real server's code (server/request/request.h: INVALID_ARGUMENT naming
// the field) and computes a toy head that is cheap and easy to check from a test:
//   y[m, n] = x[m, n mod K] * (1 + (n div K) / 4)        (x the bf16 hidden value, in fp32)
// with the real server's reductions (ties to the smaller id; exact softmax over the vocabulary;
// SAMPLE by Gumbel-max with kernels/numeric.h's counter-based noise).
//
// --api=sync serves ComputeLogits and GetModelInfo on gRPC's synchronous API instead of the callback
// API (the thread that polls the connection runs the handler: no hand-off to a callback pool
// thread), to measure that alternative as the gRPC floor (bench/gpu/serving.sh); StreamLogits is
// then UNIMPLEMENTED and --delay-us is refused.
//
// --delay-us=D makes it a slow server: each request then takes D microseconds of one of --workers
// workers, and waits in a FIFO queue before that (reported as queue_us), so an open-loop client
// sending faster than workers/D per second must see latency grow.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "drafthead/v1/drafthead.grpc.pb.h"
#include "common/command_line.h"
#include "common/exit_codes.h"
#include "common/heap.h"
#include "kernels/numeric.h"
#include "server/request/request.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT to listen on (port 0: pick a free one)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");
ABSL_FLAG(uint32_t, hidden_size, 64, "hidden size K");
ABSL_FLAG(uint32_t, vocab_size, 1000, "vocabulary size");
ABSL_FLAG(uint32_t, max_rows, 64, "largest rows per request");
ABSL_FLAG(uint32_t, max_top_k, 256, "largest top_k");
ABSL_FLAG(std::string, api, "callback", "gRPC server API: callback, or sync (unary calls and model info only)");
ABSL_FLAG(int64_t, delay_us, 0, "service time per request (0: answer inline, at once)");
ABSL_FLAG(int, workers, 1, "workers serving delayed requests (with --delay-us)");
ABSL_FLAG(int64_t, fail_first, 0, "answer the first N ComputeLogits calls with UNAVAILABLE");
ABSL_FLAG(int64_t, health_delay_ms, 0, "report NOT_SERVING for this long after start");
ABSL_FLAG(std::string, tls_cert, "", "server certificate (PEM): serve TLS");
ABSL_FLAG(std::string, tls_key, "", "server private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "", "require client certificates signed by this CA (mTLS)");
ABSL_FLAG(int64_t, exit_after_s, 3600, "exit after this many seconds (a test's safety net)");

namespace drafthead::fake {
namespace {

using v1::LogitsRequest;
using v1::LogitsResponse;

struct Config {
  uint32_t hidden, vocab, max_rows, max_top_k;
};

uint32_t NowUsSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
}

// Validates `req` with the server's own PrepareRequest (server/request/request.h) and fills `resp`;
// a non-OK status names the offending field.
grpc::Status Compute(const Config& c, const LogitsRequest& req, LogitsResponse* resp) {
  ServingLimits limits;
  limits.hidden = c.hidden;
  limits.vocab_size = c.vocab;
  limits.max_rows = c.max_rows;
  limits.max_top_k = c.max_top_k;
  limits.has_bf16 = true;  // the toy serves both heads (GetModelInfo lists them)
  absl::StatusOr<PreparedRequest> p = PrepareRequest(req, limits);
  if (!p.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(p.status().message()));
  const RowTask& task = p->task;
  const uint32_t rows = p->rows;
  std::vector<float> x(p->x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = Bf16ToFloat(p->x[i]);  // the head takes bf16 x
  const uint32_t V = c.vocab, K = c.hidden;
  auto logit = [&](uint32_t m, uint32_t n) { return x[size_t{m} * K + n % K] * (1.0f + static_cast<float>(n / K) * 0.25f); };
  resp->set_request_id(req.request_id());
  resp->set_rows(rows);
  resp->set_vocab_size(V);
  switch (task.mode) {
    case RowMode::kFullLogits: {
      const bool fp32 = task.dtype == OutDType::kFp32;
      resp->set_logits_dtype(req.logits_dtype());
      std::string* out = resp->mutable_logits();
      out->resize(size_t{rows} * V * (fp32 ? 4 : 2));
      char* o = out->data();
      for (uint32_t m = 0; m < rows; ++m) {
        for (uint32_t n = 0; n < V; ++n) {
          const float y = logit(m, n);
          if (fp32) {
            std::memcpy(o, &y, 4);
            o += 4;
          } else {
            const uint16_t b = FloatToBf16(y);
            std::memcpy(o, &b, 2);
            o += 2;
          }
        }
      }
      break;
    }
    case RowMode::kTopK:
    case RowMode::kArgmax: {
      const uint32_t k = task.k;
      const float t = task.temperature;
      const bool probs = task.want_probs != 0;
      std::vector<uint32_t> ids(V);
      for (uint32_t m = 0; m < rows; ++m) {
        std::iota(ids.begin(), ids.end(), 0u);
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](uint32_t a, uint32_t b) {
          const float la = logit(m, a), lb = logit(m, b);
          return la > lb || (la == lb && a < b);
        });
        double mx = -INFINITY, sum = 0.0;
        if (probs) {
          for (uint32_t n = 0; n < V; ++n) mx = std::max(mx, static_cast<double>(logit(m, n) / t));
          for (uint32_t n = 0; n < V; ++n) sum += std::exp(static_cast<double>(logit(m, n) / t) - mx);
        }
        for (uint32_t i = 0; i < k; ++i) {
          resp->add_token_ids(static_cast<int32_t>(ids[i]));
          resp->add_values(logit(m, ids[i]));
          if (probs) resp->add_probs(static_cast<float>(std::exp(static_cast<double>(logit(m, ids[i]) / t) - mx) / sum));
        }
      }
      break;
    }
    case RowMode::kSample: {
      for (uint32_t m = 0; m < rows; ++m) {
        uint32_t best = 0;
        float best_key = -INFINITY;
        for (uint32_t n = 0; n < V; ++n) {
          const float key = SampleKey(logit(m, n), task.temperature, task.seed, m, n);
          if (key > best_key) {
            best_key = key;
            best = n;
          }
        }
        resp->add_token_ids(static_cast<int32_t>(best));
        resp->add_values(logit(m, best));
      }
      break;
    }
  }
  resp->mutable_timing()->set_batch_rows(rows);
  return grpc::Status::OK;
}

// FIFO of delayed work served by --workers threads, each job taking --delay-us.
class SlowQueue {
 public:
  SlowQueue(int workers, int64_t delay_us) : delay_us_(delay_us) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~SlowQueue() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  // `job` gets its time in the queue (us); it runs after the service delay.
  void Push(std::function<void(uint32_t queue_us, uint32_t compute_us)> job) {
    absl::MutexLock l(&mu_);
    jobs_.push_back({std::chrono::steady_clock::now(), std::move(job)});
  }

 private:
  struct Job {
    std::chrono::steady_clock::time_point enq;
    std::function<void(uint32_t, uint32_t)> fn;
  };
  void Loop() {
    for (;;) {
      Job j;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](SlowQueue* q) { return q->stop_ || !q->jobs_.empty(); }, this));
        if (stop_) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
      }
      const uint32_t queue_us = NowUsSince(j.enq);
      const auto t0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(delay_us_));
      j.fn(queue_us, NowUsSince(t0));
    }
  }
  const int64_t delay_us_;
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

void FillInfo(const Config& c, v1::ModelInfo* info) {
  info->set_hidden_size(c.hidden);
  info->set_vocab_size(c.vocab);
  info->set_padded_vocab(c.vocab);
  info->set_tp(1);
  info->set_shard_rows(c.vocab);
  info->set_max_rows(c.max_rows);
  info->set_max_top_k(c.max_top_k);
  info->set_backend("fake");
  info->set_comm("none");
  info->add_heads(v1::FP8_TWIN);
  info->add_heads(v1::BF16_EXACT);
  info->set_weights("toy: y[m,n] = x[m, n mod K] * (1 + (n div K) / 4)");
  info->set_version("drafthead-fake-server 1");
}

// --api=sync: the handlers run on the thread gRPC's synchronous server polled the call with.
class SyncService final : public v1::DraftHead::Service {
 public:
  SyncService(Config c, int64_t fail_first) : c_(c), fail_left_(fail_first) {}
  grpc::Status ComputeLogits(grpc::ServerContext*, const LogitsRequest* req, LogitsResponse* resp) override {
    if (fail_left_.load(std::memory_order_relaxed) > 0 && fail_left_.fetch_sub(1) > 0)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake server: --fail-first");
    const auto t0 = std::chrono::steady_clock::now();
    grpc::Status s = Compute(c_, *req, resp);
    if (s.ok()) resp->mutable_timing()->set_compute_us(NowUsSince(t0));
    return s;
  }
  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::ModelInfoRequest*, v1::ModelInfo* info) override {
    FillInfo(c_, info);
    return grpc::Status::OK;
  }

 private:
  Config c_;
  std::atomic<int64_t> fail_left_;
};

class Service final : public v1::DraftHead::CallbackService {
 public:
  Service(Config c, SlowQueue* slow, int64_t fail_first) : c_(c), slow_(slow), fail_left_(fail_first) {}

  grpc::ServerUnaryReactor* ComputeLogits(grpc::CallbackServerContext* ctx, const LogitsRequest* req,
                                          LogitsResponse* resp) override {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    if (fail_left_.load(std::memory_order_relaxed) > 0 && fail_left_.fetch_sub(1) > 0) {
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake server: --fail-first"));
      return r;
    }
    const auto t0 = std::chrono::steady_clock::now();
    grpc::Status s = Compute(c_, *req, resp);
    if (!s.ok() || !slow_) {
      resp->mutable_timing()->set_compute_us(NowUsSince(t0));
      r->Finish(s);
      return r;
    }
    slow_->Push([r, resp](uint32_t queue_us, uint32_t compute_us) {
      resp->mutable_timing()->set_queue_us(queue_us);
      resp->mutable_timing()->set_compute_us(compute_us);
      r->Finish(grpc::Status::OK);
    });
    return r;
  }

  grpc::ServerBidiReactor<LogitsRequest, LogitsResponse>* StreamLogits(grpc::CallbackServerContext*) override {
    return new Stream(this);
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const v1::ModelInfoRequest*,
                                         v1::ModelInfo* info) override {
    FillInfo(c_, info);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  // Answers in request order: each request gets a slot when read; slots are written from the
  // front as they complete (with --delay-us and several workers they may complete out of order).
  class Stream : public grpc::ServerBidiReactor<LogitsRequest, LogitsResponse> {
   public:
    explicit Stream(Service* s) : svc_(s) { StartRead(&req_); }

    void OnReadDone(bool ok) override {
      if (!ok) {
        absl::MutexLock l(&mu_);
        reads_done_ = true;
        MaybeWriteLocked();
        return;
      }
      auto slot = std::make_shared<Slot>();
      {
        absl::MutexLock l(&mu_);
        slots_.push_back(slot);
      }
      const auto t0 = std::chrono::steady_clock::now();
      grpc::Status s = Compute(svc_->c_, req_, &slot->resp);
      if (!s.ok()) {
        slot->resp.Clear();
        slot->resp.set_request_id(req_.request_id());
        slot->resp.mutable_error()->set_code(static_cast<int>(s.error_code()));
        slot->resp.mutable_error()->set_message(s.error_message());
      }
      if (s.ok() && svc_->slow_) {
        svc_->slow_->Push([this, slot](uint32_t queue_us, uint32_t compute_us) {
          slot->resp.mutable_timing()->set_queue_us(queue_us);
          slot->resp.mutable_timing()->set_compute_us(compute_us);
          absl::MutexLock l(&mu_);
          slot->ready = true;
          MaybeWriteLocked();
        });
      } else {
        slot->resp.mutable_timing()->set_compute_us(NowUsSince(t0));
        absl::MutexLock l(&mu_);
        slot->ready = true;
        MaybeWriteLocked();
      }
      StartRead(&req_);
    }

    void OnWriteDone(bool ok) override {
      absl::MutexLock l(&mu_);
      writing_ = false;
      slots_.pop_front();
      if (!ok) {
        broken_ = true;
        if (!finished_) {
          finished_ = true;
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
        }
        return;
      }
      MaybeWriteLocked();
    }

    void OnDone() override {
      // Jobs still in the slow queue hold `this`: wait for them (the queue always drains).
      for (;;) {
        {
          absl::MutexLock l(&mu_);
          bool pending = false;
          for (const auto& s : slots_) pending |= !s->ready;
          if (!pending) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      delete this;
    }

   private:
    struct Slot {
      LogitsResponse resp;
      bool ready = false;
    };
    void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (writing_ || broken_ || finished_) return;
      if (!slots_.empty() && slots_.front()->ready) {
        writing_ = true;
        StartWrite(&slots_.front()->resp);
        return;
      }
      if (slots_.empty() && reads_done_) {
        finished_ = true;
        Finish(grpc::Status::OK);
      }
    }
    Service* svc_;
    LogitsRequest req_;
    absl::Mutex mu_;
    std::deque<std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
    bool broken_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  Config c_;
  SlowQueue* slow_;
  std::atomic<int64_t> fail_left_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "fake-server: cannot read " << path << "\n";
    std::exit(kExitUsage);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Main() {
  Config c{absl::GetFlag(FLAGS_hidden_size), absl::GetFlag(FLAGS_vocab_size), absl::GetFlag(FLAGS_max_rows),
           absl::GetFlag(FLAGS_max_top_k)};
  if (c.hidden == 0 || c.vocab == 0 || c.max_rows == 0) {
    std::cerr << "fake-server: --hidden-size, --vocab-size and --max-rows must be > 0\n";
    return kExitUsage;
  }
  const std::string api = absl::GetFlag(FLAGS_api);
  if (api != "callback" && api != "sync") {
    std::cerr << "fake-server: --api must be callback or sync, not " << api << "\n";
    return kExitUsage;
  }
  if (api == "sync" && absl::GetFlag(FLAGS_delay_us) > 0) {
    std::cerr << "fake-server: --delay-us needs --api=callback\n";
    return kExitUsage;
  }
  std::unique_ptr<SlowQueue> slow;
  if (absl::GetFlag(FLAGS_delay_us) > 0) {
    slow = std::make_unique<SlowQueue>(std::max(1, absl::GetFlag(FLAGS_workers)), absl::GetFlag(FLAGS_delay_us));
  }
  Service service(c, slow.get(), absl::GetFlag(FLAGS_fail_first));
  SyncService sync_service(c, absl::GetFlag(FLAGS_fail_first));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    grpc::SslServerCredentialsOptions o(absl::GetFlag(FLAGS_tls_client_ca).empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    o.pem_key_cert_pairs.push_back({ReadAll(absl::GetFlag(FLAGS_tls_key)), ReadAll(absl::GetFlag(FLAGS_tls_cert))});
    if (!absl::GetFlag(FLAGS_tls_client_ca).empty()) o.pem_root_certs = ReadAll(absl::GetFlag(FLAGS_tls_client_ca));
    creds = grpc::SslServerCredentials(o);
  }
  int port = 0;
  b.AddListeningPort(absl::GetFlag(FLAGS_listen), creds, &port);
  if (api == "sync") {
    b.RegisterService(&sync_service);
  } else {
    b.RegisterService(&service);
  }
  b.SetMaxReceiveMessageSize(64 << 20);
  b.SetMaxSendMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "fake-server: cannot listen on " << absl::GetFlag(FLAGS_listen) << "\n";
    return kExitFailed;
  }
  const int64_t health_delay = absl::GetFlag(FLAGS_health_delay_ms);
  if (health_delay > 0) server->GetHealthCheckService()->SetServingStatus(false);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), absl::GetFlag(FLAGS_port_file).c_str());  // readers never see a partial file
  }
  std::cout << "fake-server listening on port " << port << std::endl;
  std::thread health;
  if (health_delay > 0) {
    health = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(health_delay));
      server->GetHealthCheckService()->SetServingStatus(true);
    });
  }
  // Runs until killed, or --exit-after-s (so a test that forgets it cannot leave it behind).
  std::this_thread::sleep_for(std::chrono::seconds(absl::GetFlag(FLAGS_exit_after_s)));
  if (health.joinable()) health.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return kExitOk;
}

}  // namespace
}  // namespace drafthead::fake

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as drafthead-server does
  drafthead::KeepRequestBuffersInHeap();                                // here too: the same floor
  drafthead::SetProgramInfo("drafthead-fake-server", "drafthead-fake-server: an instant DraftHead server for tests");
  std::vector<std::string> storage;
  std::vector<char*> args = drafthead::NormalizeFlagNames(argc, argv, storage);
  absl::ParseCommandLine(argc, args.data());
  return drafthead::fake::Main();
}
