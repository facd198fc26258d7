// drafthead-server end to end on loopback: real rank processes over Gloo, the gRPC API, the
// client-visible contract. Shapes are small (K = 256) so the suite stays quick on 2 cores; the
// real shapes run in the README's main job.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "e2e_util.h"
#include "kernels/numeric.h"
#include "reference.h"
#include "server/weights/shard_weights.h"

namespace drafthead {
namespace {

using testing::Channel;
using testing::ServerProcess;
using testing::WaitServing;

constexpr int64_t kK = 256;

v1::LogitsRequest Req(const std::vector<uint16_t>& x, int rows, v1::Mode mode) {
  v1::LogitsRequest r;
  r.set_request_id(42);
  r.set_rows(rows);
  r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  r.set_mode(mode);
  return r;
}

grpc::Status Call(v1::DraftHead::Stub& stub, const v1::LogitsRequest& req, v1::LogitsResponse* resp,
                  int deadline_ms = 20000) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  return stub.ComputeLogits(&ctx, req, resp);
}

std::vector<float> Fp32(const v1::LogitsResponse& r) {
  std::vector<float> v(r.logits().size() / 4);
  std::memcpy(v.data(), r.logits().data(), r.logits().size());
  return v;
}

// Full fp32 logits and every mode, checked against the float64 reference of the per-shard twin.
void CheckAgainstReference(v1::DraftHead::Stub& stub, const std::vector<uint16_t>& w, int64_t rows,
                           int tp, int64_t vocab) {
  for (int m : {1, 5, 64}) {
    const auto x = ref::RandomBf16(m * kK, 31 * m);
    const auto ref =
        ref::ReferenceLogits(w.data(), rows, kK, tp, x.data(), m, vocab, ref::RefHead::kFp8Twin);
    auto req = Req(x, m, v1::FULL_LOGITS);
    req.set_logits_dtype(v1::FP32);
    v1::LogitsResponse resp;
    grpc::Status s = Call(stub, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.request_id(), 42u);
    ASSERT_EQ(resp.rows(), static_cast<uint32_t>(m));
    ASSERT_EQ(resp.vocab_size(), vocab);
    const auto y = Fp32(resp);
    ASSERT_EQ(y.size(), static_cast<size_t>(m) * vocab);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], ref.y[i], 1e-5 * ref.abs[i] + 1e-30) << "m=" << m << " entry " << i;
    auto tk = Req(x, m, v1::TOP_K);
    tk.set_top_k(8);
    tk.set_return_probs(true);
    v1::LogitsResponse rt;
    s = Call(stub, tk, &rt);
    ASSERT_TRUE(s.ok()) << s.error_message();
    auto am = Req(x, m, v1::ARGMAX);
    v1::LogitsResponse ra;
    ASSERT_TRUE(Call(stub, am, &ra).ok());
    for (int i = 0; i < m; ++i) {
      std::vector<float> row(y.begin() + i * vocab, y.begin() + (i + 1) * vocab);
      const auto best = ref::RefTopK(row.data(), vocab, 8);
      double mx = -1e300, z = 0;
      for (float v : row) mx = std::max(mx, static_cast<double>(v));
      for (float v : row) z += std::exp(v - mx);
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(rt.token_ids(i * 8 + j), best[j]) << "row " << i;
        ASSERT_EQ(rt.values(i * 8 + j), row[best[j]]);
        ASSERT_NEAR(rt.probs(i * 8 + j), std::exp(row[best[j]] - mx) / z, 1e-5);
      }
      ASSERT_EQ(ra.token_ids(i), best[0]);
    }
  }
}

class E2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    port_ = testing::FreePort();
    target_ = "127.0.0.1:" + std::to_string(port_);
  }
  std::vector<std::string> Base(int tp) {
    return {"--tp=" + std::to_string(tp), "--backend=cpu", "--comm=gloo", "--listen=" + target_,
            "--threads=1", "--op-timeout=3s", "--join-timeout=30s"};
  }
  testutil::TempDir tmp_;  // removed after the test
  std::string dir_, target_;
  int port_ = 0;
};

TEST_F(E2E, FourRanksServeEveryModeAndRejectBadInput) {
  const int64_t rows = 4100, vocab = 4000;  // S = 1025 (not a multiple of 32), last shard padded
  auto args = Base(4);
  for (auto a : {"--synthetic=7", "--hidden-size=256", "--padded-vocab=4100", "--vocab-size=4000",
                 "--keep-bf16", "--max-top-k=64"})
    args.push_back(a);
  ServerProcess p(args, dir_ + "/server.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  auto stub = v1::DraftHead::NewStub(Channel(target_));

  // ModelInfo.
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.hidden_size(), 256u);
    EXPECT_EQ(info.vocab_size(), 4000u);
    EXPECT_EQ(info.padded_vocab(), 4100u);
    EXPECT_EQ(info.tp(), 4u);
    EXPECT_EQ(info.shard_rows(), 1025u);
    EXPECT_EQ(info.max_rows(), 64u);
    EXPECT_EQ(info.backend(), "cpu");
    EXPECT_EQ(info.comm(), "gloo");
    EXPECT_EQ(info.heads_size(), 2);
  }

  std::vector<uint16_t> w(rows * kK);
  SynthesizeRows(7, 0, rows, kK, w.data());
  CheckAgainstReference(*stub, w, rows, 4, vocab);

  // Bad requests: INVALID_ARGUMENT naming the field, and the next valid request still works.
  const auto x = ref::RandomBf16(2 * kK, 3);
  struct Bad {
    std::string field;
    std::function<void(v1::LogitsRequest&)> edit;
  };
  std::vector<Bad> bads = {
      {"rows", [](auto& r) { r.set_rows(0); }},
      {"rows", [](auto& r) { r.set_rows(65); }},
      {"hidden", [](auto& r) { r.set_hidden("abc"); }},
      {"hidden_dtype", [](auto& r) { r.set_hidden_dtype(static_cast<v1::DType>(7)); }},
      {"mode", [](auto& r) { r.set_mode(static_cast<v1::Mode>(7)); }},
      {"logits_dtype", [](auto& r) { r.set_logits_dtype(static_cast<v1::DType>(7)); }},
      {"top_k", [](auto& r) { r.set_mode(v1::TOP_K); r.set_top_k(0); }},
      {"top_k", [](auto& r) { r.set_mode(v1::TOP_K); r.set_top_k(65); }},
      {"temperature", [](auto& r) { r.set_mode(v1::SAMPLE); r.set_temperature(0); }},
      {"temperature", [](auto& r) { r.set_mode(v1::SAMPLE); r.set_temperature(-2); }},
      {"temperature", [](auto& r) { r.set_mode(v1::SAMPLE); r.set_temperature(std::nanf("")); }},
      {"head", [](auto& r) { r.set_head(static_cast<v1::Head>(9)); }},
  };
  for (const auto& b : bads) {
    auto r = Req(x, 2, v1::FULL_LOGITS);
    b.edit(r);
    v1::LogitsResponse resp;
    grpc::Status s = Call(*stub, r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.field;
    EXPECT_EQ(s.error_message().rfind(b.field + ":", 0), 0u) << s.error_message();
    v1::LogitsResponse ok;
    ASSERT_TRUE(Call(*stub, Req(x, 2, v1::ARGMAX), &ok).ok()) << "after a bad " << b.field;
    EXPECT_EQ(ok.token_ids_size(), 2);
  }

  // BF16_EXACT head (kept): against its own float64 reference.
  {
    auto r = Req(x, 2, v1::FULL_LOGITS);
    r.set_head(v1::BF16_EXACT);
    r.set_logits_dtype(v1::FP32);
    v1::LogitsResponse resp;
    ASSERT_TRUE(Call(*stub, r, &resp).ok());
    const auto ref =
        ref::ReferenceLogits(w.data(), rows, kK, 4, x.data(), 2, vocab, ref::RefHead::kBf16Exact);
    const auto y = Fp32(resp);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref.y[i], 1e-5 * ref.abs[i] + 1e-30);
  }

  // Default bf16 logits: 64 x 4000 x 2 bytes, the rounded fp32 logits.
  {
    const auto x64 = ref::RandomBf16(64 * kK, 11);
    auto r = Req(x64, 64, v1::FULL_LOGITS);
    v1::LogitsResponse rb, rf;
    ASSERT_TRUE(Call(*stub, r, &rb).ok());
    r.set_logits_dtype(v1::FP32);
    ASSERT_TRUE(Call(*stub, r, &rf).ok());
    ASSERT_EQ(rb.logits().size(), 64u * 4000 * 2);
    EXPECT_EQ(rb.logits_dtype(), v1::BF16);
    const auto y = Fp32(rf);
    const uint16_t* b = reinterpret_cast<const uint16_t*>(rb.logits().data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(b[i], FloatToBf16(y[i]));
  }

  // StreamLogits: answers in order, a bad request answered in-band, the stream goes on.
  {
    grpc::ClientContext ctx;
    auto stream = stub->StreamLogits(&ctx);
    for (int i = 0; i < 6; ++i) {
      auto r = Req(x, 2, v1::ARGMAX);
      r.set_request_id(100 + i);
      if (i == 2) r.set_rows(0);
      ASSERT_TRUE(stream->Write(r));
    }
    stream->WritesDone();
    v1::LogitsResponse resp;
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(stream->Read(&resp)) << i;
      EXPECT_EQ(resp.request_id(), 100u + i);
      if (i == 2) {
        EXPECT_EQ(resp.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
        EXPECT_EQ(resp.error().message().rfind("rows:", 0), 0u);
      } else {
        EXPECT_EQ(resp.error().code(), 0);
        EXPECT_EQ(resp.token_ids_size(), 2);
      }
    }
    EXPECT_FALSE(stream->Read(&resp));
    EXPECT_TRUE(stream->Finish().ok());
  }

  // SIGTERM: drains and the whole group exits 0.
  kill(p.pid(), SIGTERM);
  const int st = p.Wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << "did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << p.Log();
}

struct FaultCase {
  int worker;  // index among rank 0's children (rank = worker + 1)
  int signal;  // SIGKILL: a dead rank; SIGSTOP: a hung one
  bool links = true;  // --same-host-links (the default); false: Gloo's TCP pairs carry the batches
};

class RankFault : public E2E, public ::testing::WithParamInterface<FaultCase> {};

// Under load, a worker killed (or hung) makes requests fail with UNAVAILABLE within the op timeout,
// never hang, and the whole group exits non-zero.
TEST_P(RankFault, RequestsFailUnavailableAndTheGroupExits) {
  const FaultCase fc = GetParam();
  auto args = Base(3);
  for (auto a : {"--synthetic=3", "--hidden-size=256", "--padded-vocab=3000", "--op-timeout=2s"})
    args.push_back(a);
  args.push_back(fc.links ? "--same-host-links=true" : "--same-host-links=false");
  ServerProcess p(args, dir_ + "/server.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  EXPECT_NE(p.Log().find(fc.links ? "transport=unix" : "transport=tcp"), std::string::npos)
      << p.Log();
  auto kids = testing::ChildPids(p.pid());
  ASSERT_EQ(kids.size(), 2u);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> first_unavailable_ms{-1};
  std::atomic<int> wrong_code{0}, ok_before{0};
  std::atomic<int64_t> kill_ms{-1};
  const auto t_start = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_start).count();
  };
  std::vector<std::thread> load;
  for (int c = 0; c < 4; ++c) {
    load.emplace_back([&, c] {
      auto stub = v1::DraftHead::NewStub(Channel(target_));
      const auto x = ref::RandomBf16(5 * kK, c);
      for (int i = 0; i < 100000 && !stop; ++i) {
        v1::LogitsResponse resp;
        auto req = Req(x, 5, v1::TOP_K);
        req.set_top_k(8);
        grpc::Status s = Call(*stub, req, &resp, 10000);
        if (s.ok()) {
          if (kill_ms < 0) ++ok_before;
          continue;
        }
        if (s.error_code() != grpc::StatusCode::UNAVAILABLE && ++wrong_code == 1)
          std::printf("unexpected status %d: %s\n", s.error_code(), s.error_message().c_str());
        int64_t expected = -1;
        first_unavailable_ms.compare_exchange_strong(expected, since());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  // Killed once requests are being answered (polled: a loaded machine may take a while).
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       ok_before.load() == 0 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill_ms = since();
  kill(kids[fc.worker], fc.signal);
  const int st = p.Wait(std::chrono::seconds(20));
  const int64_t exit_ms = since();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : load) t.join();
  ASSERT_NE(st, -1) << "group did not exit after the fault";
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a failed group must exit non-zero";
  EXPECT_GT(ok_before.load(), 0);
  ASSERT_GE(first_unavailable_ms.load(), 0) << "no request saw UNAVAILABLE";
  EXPECT_EQ(wrong_code.load(), 0);
  const int64_t to_unavailable = first_unavailable_ms - kill_ms, to_exit = exit_ms - kill_ms;
  std::printf("fault signal=%d rank=%d: first UNAVAILABLE after %lld ms, group exit after %lld ms\n",
              fc.signal, fc.worker + 1, static_cast<long long>(to_unavailable), static_cast<long long>(to_exit));
  // The op timeout (2 s) and slack for a loaded machine (collective_test's kSlack).
  EXPECT_LT(to_unavailable, 2000 + 5000) << "UNAVAILABLE must come within the op timeout";
  EXPECT_LT(to_exit, 2000 + 5000);
  // The other worker goes too (it must not outlive rank 0).
  EXPECT_TRUE(testing::ProcessGone(kids[1 - fc.worker], std::chrono::seconds(5)));
  if (fc.signal == SIGSTOP) kill(kids[fc.worker], SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(EachWorker, RankFault,
                         ::testing::Values(FaultCase{0, SIGKILL}, FaultCase{1, SIGKILL}, FaultCase{1, SIGSTOP},
                                           FaultCase{1, SIGKILL, false}, FaultCase{1, SIGSTOP, false}),
                         [](const auto& info) {
                           return std::string(info.param.signal == SIGKILL ? "kill" : "hang") + "_rank" +
                                  std::to_string(info.param.worker + 1) + (info.param.links ? "" : "_tcp");
                         });

// A minimal safetensors writer, independent of the server's.
void WriteSafetensors(const std::string& path,
                      const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>>& tensors,
                      size_t truncate_by = 0) {
  std::string header = "{";
  std::string data;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, shape, bytes] = tensors[i];
    std::string sh;
    for (size_t j = 0; j < shape.size(); ++j) sh += (j ? "," : "") + std::to_string(shape[j]);
    header += (i ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"BF16\",\"shape\":[" + sh +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + bytes.size()) + "]}";
    data += bytes;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f.write(data.data(), data.size() - truncate_by);
}

std::string Bytes(const std::vector<uint16_t>& v, size_t begin, size_t count) {
  return std::string(reinterpret_cast<const char*>(v.data() + begin), count * 2);
}

// --unary-api=sync: the real server's unary calls on gRPC's synchronous API: every mode against
// the reference, 32 callers at once (queued calls block their threads until answered), and a
// SIGTERM drains and exits 0.
TEST_F(E2E, SyncUnaryApiServesEveryModeUnderLoadAndDrains) {
  const int64_t rows = 4100, vocab = 4000;
  auto args = Base(1);
  for (auto a : {"--synthetic=7", "--hidden-size=256", "--padded-vocab=4100", "--vocab-size=4000",
                 "--max-top-k=64", "--unary-api=sync", "--sync-max-pollers=8"})
    args.push_back(a);
  ServerProcess p(args, dir_ + "/server.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  auto stub = v1::DraftHead::NewStub(Channel(target_));
  std::vector<uint16_t> w(rows * kK);
  SynthesizeRows(7, 0, rows, kK, w.data());
  CheckAgainstReference(*stub, w, rows, 1, vocab);

  const auto x = ref::RandomBf16(3 * kK, 5);
  v1::LogitsResponse want;
  ASSERT_TRUE(Call(*stub, Req(x, 3, v1::ARGMAX), &want).ok());
  std::atomic<int> ok{0}, wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 32; ++t)
    callers.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        v1::LogitsResponse r;
        if (!Call(*stub, Req(x, 3, v1::ARGMAX), &r).ok()) continue;
        (std::equal(r.token_ids().begin(), r.token_ids().end(), want.token_ids().begin(), want.token_ids().end()) ? ok : wrong)++;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 320);
  EXPECT_EQ(wrong.load(), 0);

  kill(p.pid(), SIGTERM);
  const int st = p.Wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << "no exit after SIGTERM\n" << p.Log();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << p.Log();
  EXPECT_NE(p.Log().find("unary_api=sync"), std::string::npos) << p.Log();
}

TEST_F(E2E, ShardedCheckpointDirectoryAndTwinFile) {
  const int64_t rows = 1000;
  const auto w = ref::RandomBf16(rows * kK, 77, 0.03);
  // The head lives in the second file of a two-file checkpoint.
  const std::string ckpt = dir_ + "/ckpt";
  mkdir(ckpt.c_str(), 0755);
  WriteSafetensors(ckpt + "/model-00001-of-00002.safetensors",
                   {{"model.embed.weight", {4, kK}, std::string(4 * kK * 2, '\1')}});
  WriteSafetensors(ckpt + "/model-00002-of-00002.safetensors",
                   {{"other", {2, 32}, std::string(128, '\0')},
                    {"lm_head.weight", {rows, kK}, Bytes(w, 0, rows * kK)}});
  std::ofstream(ckpt + "/model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"model.embed.weight":"model-00001-of-00002.safetensors",)"
      << R"("other":"model-00002-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors"}})";
  {
    auto args = Base(2);
    args.push_back("--weights=" + ckpt);
    ServerProcess p(args, dir_ + "/dir.log");
    ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
    auto stub = v1::DraftHead::NewStub(Channel(target_));
    CheckAgainstReference(*stub, w, rows, 2, rows);
    kill(p.pid(), SIGTERM);
    ASSERT_NE(p.Wait(std::chrono::seconds(20)), -1);
  }
  // drafthead-quantize then --twin: the same answers.
  const std::string twin = dir_ + "/twin.safetensors";
  const std::string cmd = testing::BinDir() + "/tools/drafthead-quantize --weights=" + ckpt +
                          " --tensor=lm_head.weight --tp=2 --out=" + twin + " > " + dir_ + "/q.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  {
    auto args = Base(2);
    args.push_back("--weights=" + ckpt);
    args.push_back("--twin=" + twin);
    ServerProcess p(args, dir_ + "/twin.log");
    ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
    auto stub = v1::DraftHead::NewStub(Channel(target_));
    CheckAgainstReference(*stub, w, rows, 2, rows);
  }
}

TEST_F(E2E, TruncatedCheckpointFailsAtStartNamingTheFile) {
  const int64_t rows = 64;
  const auto w = ref::RandomBf16(rows * kK, 5);
  const std::string path = dir_ + "/trunc.safetensors";
  WriteSafetensors(path, {{"lm_head.weight", {rows, kK}, Bytes(w, 0, rows * kK)}}, 1000);
  auto args = Base(2);
  args.push_back("--weights=" + path);
  ServerProcess p(args, dir_ + "/trunc.log");
  const int st = p.Wait(std::chrono::seconds(30));
  ASSERT_NE(st, -1) << "server kept running on a truncated checkpoint";
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const std::string log = p.Log();
  EXPECT_NE(log.find("trunc.safetensors"), std::string::npos) << log;
  EXPECT_NE(log.find("lm_head.weight"), std::string::npos) << log;
}

TEST_F(E2E, SigtermDuringStartupExitsPromptly) {
  // Real shapes: loading takes seconds, long enough to be interrupted.
  auto args = Base(2);
  args.push_back("--synthetic=1");
  ServerProcess p(args, dir_ + "/startup.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_TRUE(p.Running()) << p.Log();
  // Listening but loading: health says NOT_SERVING (2), never SERVING.
  int health = -1;
  for (int i = 0; i < 50 && health == -1 && p.Running(); ++i) {
    health = testing::HealthStatus(Channel(target_));
    if (health == -1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(health, 2);
  auto kids = testing::ChildPids(p.pid());
  const auto t0 = std::chrono::steady_clock::now();
  kill(p.pid(), SIGTERM);
  const int st = p.Wait(std::chrono::seconds(5));
  ASSERT_NE(st, -1) << "SIGTERM during start-up was not honoured";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  for (pid_t k : kids) EXPECT_TRUE(testing::ProcessGone(k, std::chrono::seconds(5)));
  EXPECT_NE(p.Log().find("stopped_during_startup"), std::string::npos) << p.Log();
}

TEST_F(E2E, AWorkerDyingDuringStartupFailsTheGroupAtOnce) {
  auto args = Base(3);
  args.push_back("--synthetic=1");
  ServerProcess p(args, dir_ + "/startup-kill.log");
  std::vector<pid_t> kids;  // both workers forked (polled: a loaded machine starts rank 0 slowly)
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       kids.size() < 2 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kids = testing::ChildPids(p.pid());
  }
  ASSERT_EQ(kids.size(), 2u) << p.Log();
  kill(kids[0], SIGKILL);
  const int st = p.Wait(std::chrono::seconds(5));
  ASSERT_NE(st, -1) << "rank 0 kept waiting for a dead rank";
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_TRUE(testing::ProcessGone(kids[1], std::chrono::seconds(5)));
}

TEST_F(E2E, ARankThatCannotJoinIsReported) {
  // Rank 1 of 2 pointed at a leader that never comes: it says why and exits.
  ServerProcess p({"--rank=1", "--world=2", "--leader=127.0.0.1:" + std::to_string(testing::FreePort()),
                   "--synthetic=1", "--hidden-size=256", "--padded-vocab=256", "--join-timeout=1s"},
                  dir_ + "/join.log");
  const int st = p.Wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1);
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_NE(p.Log().find("join_failed"), std::string::npos) << p.Log();
}

TEST_F(E2E, AnUnknownIsaIsRefusedByName) {
  // --isa picks the CPU backend's GEMV (kernels/cpu/head_gemv.h); a bad value stops the server.
  auto args = Base(1);
  for (auto a : {"--synthetic=1", "--hidden-size=256", "--padded-vocab=256", "--isa=avx1024"})
    args.push_back(a);
  ServerProcess p(args, dir_ + "/isa.log");
  const int st = p.Wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1);
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_NE(p.Log().find("--isa must be"), std::string::npos) << p.Log();
}

}  // namespace
}  // namespace drafthead
