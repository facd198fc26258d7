// Operating the server: TLS and mutual TLS, Prometheus metrics (checked with promtool), a SIGTERM
// drain under load with zero failed requests, backpressure. Loopback only, bounded loops.
#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "e2e_util.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::Channel;
using testing::ServerProcess;
using testing::WaitServing;

constexpr int64_t kK = 256;

v1::LogitsRequest Req(int rows, v1::Mode mode, uint64_t seed = 1) {
  const auto x = ref::RandomBf16(rows * kK, seed);
  v1::LogitsRequest r;
  r.set_rows(rows);
  r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  r.set_mode(mode);
  r.set_top_k(4);
  r.set_temperature(1.0f);
  return r;
}

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

class Ops : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    target_ = "127.0.0.1:" + std::to_string(testing::FreePort());
  }
  std::vector<std::string> Base(int tp) {
    return {"--tp=" + std::to_string(tp), "--backend=cpu", "--comm=gloo", "--listen=" + target_,
            "--threads=1", "--synthetic=5", "--hidden-size=256", "--padded-vocab=2048"};
  }
  testutil::TempDir tmp_;  // removed after the test
  std::string dir_, target_;
};

// Certificates: a CA, a server cert for 127.0.0.1, a client cert from the CA, and a client cert
// from an unrelated CA.
void MakeCerts(const std::string& d) {
  const std::string o = " >/dev/null 2>&1";
  ASSERT_EQ(Sh("cd " + d + " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
               "-keyout ca.key -out ca.crt" + o), 0);
  ASSERT_EQ(Sh("cd " + d + " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rogue-ca "
               "-keyout rogue.key -out rogue.crt" + o), 0);
  for (std::string who : {"server", "client"}) {
    const std::string ca = "ca";
    ASSERT_EQ(Sh("cd " + d + " && openssl req -newkey rsa:2048 -nodes -subj /CN=" + who + " -keyout " +
                 who + ".key -out " + who + ".csr" + o), 0);
    std::ofstream(d + "/" + who + ".ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    ASSERT_EQ(Sh("cd " + d + " && openssl x509 -req -in " + who + ".csr -CA " + ca + ".crt -CAkey " + ca +
                 ".key -CAcreateserial -days 2 -extfile " + who + ".ext -out " + who + ".crt" + o), 0);
  }
  ASSERT_EQ(Sh("cd " + d + " && openssl req -newkey rsa:2048 -nodes -subj /CN=intruder -keyout intruder.key "
               "-out intruder.csr" + o + " && openssl x509 -req -in intruder.csr -CA rogue.crt -CAkey rogue.key "
               "-CAcreateserial -days 2 -out intruder.crt" + o), 0);
}

std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& d, const std::string& cert) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = testutil::ReadFile(d + "/ca.crt");
  if (!cert.empty()) {
    o.pem_cert_chain = testutil::ReadFile(d + "/" + cert + ".crt");
    o.pem_private_key = testutil::ReadFile(d + "/" + cert + ".key");
  }
  return grpc::SslCredentials(o);
}

grpc::Status Call(const std::shared_ptr<grpc::Channel>& ch, const v1::LogitsRequest& r,
                  v1::LogitsResponse* resp, int ms = 10000) {
  auto stub = v1::DraftHead::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  return stub->ComputeLogits(&ctx, r, resp);
}

TEST_F(Ops, MutualTlsAdmitsOnlyClientsWithACertFromTheCa) {
  MakeCerts(dir_);
  auto args = Base(2);
  args.push_back("--tls-cert=" + dir_ + "/server.crt");
  args.push_back("--tls-key=" + dir_ + "/server.key");
  args.push_back("--tls-client-ca=" + dir_ + "/ca.crt");
  ServerProcess p(args, dir_ + "/tls.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60), Tls(dir_, "client"))) << p.Log();
  v1::LogitsResponse resp;
  EXPECT_TRUE(Call(Channel(target_, Tls(dir_, "client")), Req(2, v1::ARGMAX), &resp).ok());
  EXPECT_EQ(resp.token_ids_size(), 2);
  EXPECT_FALSE(Call(Channel(target_, Tls(dir_, "")), Req(2, v1::ARGMAX), &resp, 3000).ok())
      << "a client without a certificate got in";
  EXPECT_FALSE(Call(Channel(target_, Tls(dir_, "intruder")), Req(2, v1::ARGMAX), &resp, 3000).ok())
      << "a client with a certificate from another CA got in";
  EXPECT_FALSE(Call(Channel(target_), Req(2, v1::ARGMAX), &resp, 3000).ok())
      << "a plaintext client got in";
}

TEST_F(Ops, TlsWithoutClientCertificates) {
  MakeCerts(dir_);
  auto args = Base(1);
  args.push_back("--tls-cert=" + dir_ + "/server.crt");
  args.push_back("--tls-key=" + dir_ + "/server.key");
  ServerProcess p(args, dir_ + "/tls1.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60), Tls(dir_, ""))) << p.Log();
  v1::LogitsResponse resp;
  EXPECT_TRUE(Call(Channel(target_, Tls(dir_, "")), Req(1, v1::ARGMAX), &resp).ok());
}

TEST_F(Ops, MetricsPassPromtoolAndCountRequests) {
  const int mport = testing::FreePort();
  auto args = Base(2);
  args.push_back("--metrics-listen=127.0.0.1:" + std::to_string(mport));
  ServerProcess p(args, dir_ + "/metrics.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  auto ch = Channel(target_);
  v1::LogitsResponse resp;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Call(ch, Req(5, v1::ARGMAX), &resp).ok());
  ASSERT_TRUE(Call(ch, Req(5, v1::TOP_K), &resp).ok());
  auto bad = Req(5, v1::ARGMAX);
  bad.set_rows(0);
  EXPECT_FALSE(Call(ch, bad, &resp).ok());
  httplib::Client http("127.0.0.1", mport);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  const std::string text = res->body;
  EXPECT_NE(text.find("drafthead_requests_total{mode=\"argmax\",code=\"OK\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("drafthead_requests_total{mode=\"top_k\",code=\"OK\"} 1"), std::string::npos);
  EXPECT_NE(text.find("code=\"INVALID_ARGUMENT\"} 1"), std::string::npos);
  EXPECT_NE(text.find("drafthead_rows_total{mode=\"argmax\"} 15"), std::string::npos);
  EXPECT_NE(text.find("drafthead_rank_up{rank=\"1\"} 1"), std::string::npos);
  EXPECT_NE(text.find("drafthead_serving 1"), std::string::npos);
  EXPECT_NE(text.find("drafthead_batch_rows_bucket{le=\"+Inf\"} 4"), std::string::npos);
  std::ofstream(dir_ + "/metrics.txt") << text;
  if (Sh("command -v promtool >/dev/null") != 0) GTEST_SKIP() << "promtool (Debian: prometheus) not installed";
  EXPECT_EQ(Sh("promtool check metrics < " + dir_ + "/metrics.txt > " + dir_ + "/promtool.out 2>&1"), 0)
      << testutil::ReadFile(dir_ + "/promtool.out");
}

TEST_F(Ops, SigtermDrainsUnderLoadWithZeroFailures) {
  auto args = Base(2);
  args.push_back("--drain-grace=5s");  // the health watcher's NOT_SERVING seen in time on a loaded host
  ServerProcess p(args, dir_ + "/drain.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  std::atomic<bool> stop_sending{false};
  std::atomic<int> ok{0}, failed{0};
  std::string first_failure;
  std::mutex mu;
  // A health watcher plays the load balancer: once NOT_SERVING, no new requests are sent.
  std::thread watcher([&] {
    auto ch = Channel(target_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!stop_sending && std::chrono::steady_clock::now() < until) {
      if (testing::HealthStatus(ch) != 1) stop_sending = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop_sending = true;
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      auto ch = Channel(target_);
      for (int i = 0; i < 2000 && !stop_sending; ++i) {
        v1::LogitsResponse resp;
        grpc::Status s = Call(ch, Req(5, static_cast<v1::Mode>(1 + (i + c) % 3), i), &resp);
        if (s.ok()) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard<std::mutex> l(mu);
          if (first_failure.empty()) first_failure = s.error_message();
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  kill(p.pid(), SIGTERM);
  for (auto& t : clients) t.join();
  watcher.join();
  const int st = p.Wait(std::chrono::seconds(30));
  ASSERT_NE(st, -1) << "did not exit after the drain";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << p.Log();
  EXPECT_GT(ok.load(), 10);
  EXPECT_EQ(failed.load(), 0) << first_failure;
}

TEST_F(Ops, QueueOverflowIsRefusedAtOnce) {
  // 8-row requests against a 60-row batch and queue: seven fit (56 rows), the batch is not full so
  // it waits out the 2 s delay, and every further request finds the queue full. No race with the
  // batch loop: the queue cannot drain before the delay ends, however slowly the clients start.
  auto args = Base(1);
  args.push_back("--max-rows=60");
  args.push_back("--max-queue-rows=60");
  args.push_back("--max-queue-delay-us=2000000");
  ServerProcess p(args, dir_ + "/queue.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  std::atomic<int> exhausted{0}, ok{0}, other{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < 24; ++c) {
    ts.emplace_back([&] {
      v1::LogitsResponse resp;
      grpc::Status s = Call(Channel(target_), Req(8, v1::ARGMAX), &resp);
      if (s.ok()) ++ok;
      else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
      else ++other;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_GT(exhausted.load(), 0);
  EXPECT_GE(ok.load(), 7);  // the held batch
  EXPECT_EQ(other.load(), 0);
}

TEST_F(Ops, ExpiredDeadlineIsNotComputed) {
  const int mport = testing::FreePort();
  auto args = Base(1);
  args.push_back("--max-queue-delay-us=300000");  // the request waits longer than its deadline
  args.push_back("--metrics-listen=127.0.0.1:" + std::to_string(mport));
  ServerProcess p(args, dir_ + "/deadline.log");
  ASSERT_TRUE(WaitServing(p, target_, std::chrono::seconds(60))) << p.Log();
  v1::LogitsResponse resp;
  // Connected first, so that the 50 ms reach the server (a slowed connect would spend them).
  auto channel = Channel(target_);
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30)));
  grpc::Status s = Call(channel, Req(1, v1::ARGMAX), &resp, 50);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server dropped it before compute: no batch ran, and it was counted as expired/cancelled
  // (once its queue delay is over: polled, up to 10 s).
  httplib::Client http("127.0.0.1", mport);
  std::string body;
  bool dropped = false;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       !dropped && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto res = http.Get("/metrics");
    ASSERT_TRUE(res && res->status == 200);
    body = res->body;
    dropped = body.find("code=\"DEADLINE_EXCEEDED\"} 1") != std::string::npos ||
              body.find("code=\"CANCELLED\"} 1") != std::string::npos;
  }
  EXPECT_TRUE(dropped) << body;
  EXPECT_NE(body.find("drafthead_batches_total 0"), std::string::npos) << body;
}

TEST_F(Ops, RestartOnFailureBringsTheGroupBack) {
  auto args = Base(2);
  args.push_back("--restart=on-failure");
  args.push_back("--op-timeout=2s");
  ServerProcess sup(args, dir_ + "/restart.log");
  ASSERT_TRUE(WaitServing(sup, target_, std::chrono::seconds(60))) << sup.Log();
  auto groups = testing::ChildPids(sup.pid());
  ASSERT_EQ(groups.size(), 1u);
  auto workers = testing::ChildPids(groups[0]);
  ASSERT_EQ(workers.size(), 1u);
  kill(workers[0], SIGKILL);
  ASSERT_TRUE(testing::ProcessGone(groups[0], std::chrono::seconds(15))) << "the failed group did not exit";
  ASSERT_TRUE(WaitServing(sup, target_, std::chrono::seconds(60))) << sup.Log();
  auto again = testing::ChildPids(sup.pid());
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0], groups[0]);
  v1::LogitsResponse resp;
  EXPECT_TRUE(Call(Channel(target_), Req(2, v1::ARGMAX), &resp).ok());
  kill(sup.pid(), SIGTERM);
  const int st = sup.Wait(std::chrono::seconds(30));
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << sup.Log();
}

}  // namespace
}  // namespace drafthead
