// Many replicas: the C++ client balancing over three local replicas (ClientOptions::
// balance_replicas: round_robin over health-checked addresses, as against a Kubernetes headless
// Service), one of which is stopped (SIGTERM: drain) mid-run. Nothing is lost: every call is
// answered; every replica served before the stop, the other two after it. The replicas listen on
// 127.0.0.1/2/3 with one port, as pods behind one DNS name do. And the load client with
// --balance-replicas spreads its calls over all three. Cost: ~5-10 s.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/drafthead_client.h"
#include "e2e_util.h"
#include "reference.h"

namespace drafthead {
namespace {

using client::ClientOptions;
using client::DraftHeadClient;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

constexpr int kReplicas = 3;

// drafthead_requests_total summed over modes and codes, from a replica's /metrics.
int RequestsServed(const std::string& host, int port) {
  httplib::Client http(host, port);
  http.set_read_timeout(5, 0);
  auto res = http.Get("/metrics");
  if (!res || res->status != 200) return -1;
  int total = 0;
  const std::string key = "drafthead_requests_total{";
  for (size_t at = res->body.find(key); at != std::string::npos; at = res->body.find(key, at + 1)) {
    const size_t sp = res->body.find("} ", at);
    total += std::atoi(res->body.c_str() + sp + 2);
  }
  return total;
}

// Three replicas of a tiny head on 127.0.0.1/2/3, one port; `target_` names them all.
class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = testing::FreePort();
    target_ = "ipv4:";
    for (int r = 0; r < kReplicas; ++r) {
      hosts_.push_back("127.0.0." + std::to_string(r + 1));
      metrics_ports_.push_back(testing::FreePort());
      replicas_.push_back(std::make_unique<ServerProcess>(
          std::vector<std::string>{"--tp=1", "--backend=cpu", "--comm=gloo", "--threads=1", "--synthetic=5",
                                   "--hidden-size=256", "--padded-vocab=2048", "--drain-grace=1s",
                                   "--listen=" + hosts_[r] + ":" + std::to_string(port_),
                                   "--metrics-listen=" + hosts_[r] + ":" + std::to_string(metrics_ports_[r])},
          tmp_.path() + "/replica" + std::to_string(r) + ".log"));
      absl::StrAppend(&target_, r ? "," : "", hosts_[r], ":", port_);
    }
    for (int r = 0; r < kReplicas; ++r)
      ASSERT_TRUE(testing::WaitServing(*replicas_[r], hosts_[r] + ":" + std::to_string(port_), std::chrono::seconds(60)))
          << replicas_[r]->Log();
  }
  int Served(int r) const { return RequestsServed(hosts_[r], metrics_ports_[r]); }

  testutil::TempDir tmp_;
  int port_ = 0;
  std::string target_;
  std::vector<std::string> hosts_;
  std::vector<int> metrics_ports_;
  std::vector<std::unique_ptr<ServerProcess>> replicas_;
};

TEST_F(Replicas, RoundRobinOverHealthCheckedReplicasLosesNothingWhenOneStops) {
  ClientOptions o;
  o.balance_replicas = true;
  o.default_deadline = absl::Seconds(20);
  auto client = DraftHeadClient::Connect(target_, o);
  ASSERT_TRUE(client.ok()) << client.status();
  const auto x = ref::RandomBf16(2 * 256, 3);
  auto expected = (*client)->Argmax(std::span<const uint16_t>(x));
  ASSERT_TRUE(expected.ok()) << expected.status();

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, wrong{0}, failed{0};
  std::mutex mu;
  std::string first_failure;
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      while (!stop) {
        auto r = (*client)->Argmax(std::span<const uint16_t>(x));
        if (!r.ok()) {
          ++failed;
          std::lock_guard<std::mutex> l(mu);
          if (first_failure.empty()) first_failure = r.status().ToString();
        } else if (r->token_ids != expected->token_ids) {
          ++wrong;
        } else {
          ++ok;
        }
      }
    });
  }
  // Every replica takes a share before the stop.
  const auto until = Clock::now() + std::chrono::seconds(20);
  auto all_served = [&] {
    for (int r = 0; r < kReplicas; ++r)
      if (Served(r) < 5) return false;
    return true;
  };
  while (!all_served() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(all_served()) << "round robin did not reach every replica";

  // Stop replica 1 (SIGTERM: NOT_SERVING, drain grace, drain, exit 0) mid-run.
  kill(replicas_[1]->pid(), SIGTERM);
  const int st = replicas_[1]->Wait(std::chrono::seconds(30));
  ASSERT_NE(st, -1) << "replica 1 did not stop";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << replicas_[1]->Log();
  const int others_before = Served(0) + Served(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  stop = true;
  for (auto& t : callers) t.join();
  const int others_after = Served(0) + Served(2);
  std::printf("%d calls answered, %d wrong, %d failed; the other replicas served %d after the stop\n", ok.load(),
              wrong.load(), failed.load(), others_after - others_before);
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(others_after - others_before, 10) << "the remaining replicas did not take over";
}

// The load client spreads its calls over the replicas with --balance-replicas, as an operator
// load-tests a replica set behind one DNS name.
TEST_F(Replicas, LoadClientBalancesOverReplicasWithItsFlag) {
  const std::string json = tmp_.path() + "/load.json";
  ServerProcess load({"load", "--target=" + target_, "--balance-replicas", "--rows=2", "--mode=argmax",
                      "--concurrency=4", "--requests=300", "--quiet", "--json=" + json},
                     tmp_.path() + "/load.log", "client/drafthead-client");
  const int st = load.Wait(std::chrono::seconds(60));
  ASSERT_NE(st, -1) << "the load client did not finish";
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << load.Log();
  const std::string report = testutil::ReadFile(json);
  EXPECT_NE(report.find("\"balance_replicas\": true"), std::string::npos) << report.substr(0, 600);
  EXPECT_NE(report.find("\"errors\": 0"), std::string::npos) << report.substr(0, 2000);
  int total = 0;
  for (int r = 0; r < kReplicas; ++r) {
    const int served = Served(r);
    total += served;
    // Round robin: each replica near a third of the 300 (the probe request and retries aside).
    EXPECT_GE(served, 60) << "replica " << r << " served " << served;
  }
  EXPECT_GE(total, 300);
}

}  // namespace
}  // namespace drafthead
