// Faults survived, measured: a supervised group (--restart=on-failure) under load from callers
// that retry UNAVAILABLE within their deadline (the client library's policy); kill -9 of each rank
// in turn (rank 0 too), then SIGSTOP of a worker. Every request must be answered, none wrong, and
// the time from each fault to SERVING again (a new group) is printed as a table.
//
// The same binary is the real-shape benchmark (docs/operations.md, "Faults survived"): the
// environment overrides the shapes and the faults, e.g.
//   DRAFTHEAD_FAULTS_ARGS="--tp=4 --hidden-size=5120 --padded-vocab=129280 --twin=/tmp/twin.dhtwin"
//   DRAFTHEAD_FAULTS="kill:1,kill:0,stop:2"  build/tests/faults_test
// Cost at the default tiny shapes: ~15 s (mostly the supervisor's back-off: 0.5, 1, 2, 4 s).
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/drafthead_client.h"
#include "e2e_util.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::ChildPids;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;
using client::ClientOptions;
using client::DraftHeadClient;

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// The rank a process was started as (its --rank=N argument; rank 0 has none); -1 when its command
// line is gone (a dying process).
int RankOf(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::string arg;
  bool any = false;
  while (std::getline(f, arg, '\0')) {
    any = true;
    if (arg.rfind("--rank=", 0) == 0) return std::stoi(arg.substr(7));
  }
  return any ? 0 : -1;
}

// How many groups have reached SERVING so far (each rank 0 logs event=serving once).
int GroupsServed(ServerProcess& sup) {
  const std::string log = sup.Log();
  int n = 0;
  for (size_t at = log.find("event=serving "); at != std::string::npos; at = log.find("event=serving ", at + 1)) ++n;
  return n;
}

bool Zombie(pid_t pid) { return testing::ProcessGone(pid, std::chrono::milliseconds(0)); }

// The group's live rank processes now: rank -> pid. Rank 0 is the supervisor's child without a
// --rank argument (a dead group's workers may briefly be the supervisor's children too: it reaps
// orphans).
std::map<int, pid_t> Ranks(pid_t supervisor) {
  std::map<int, pid_t> out;
  for (pid_t g : ChildPids(supervisor))
    if (RankOf(g) == 0 && !Zombie(g)) {
      if (out.count(0)) return {};  // two groups: the old one is not gone yet
      out[0] = g;
    }
  if (!out.count(0)) return out;
  for (pid_t w : ChildPids(out[0]))
    if (!Zombie(w)) out[RankOf(w)] = w;
  return out;
}

struct Fault {
  std::string what;  // "kill" (SIGKILL) or "stop" (SIGSTOP)
  int rank;
};

std::vector<Fault> Faults() {
  std::vector<Fault> out;
  for (absl::string_view f : absl::StrSplit(Env("DRAFTHEAD_FAULTS", "kill:1,kill:2,kill:0,stop:1"), ',')) {
    std::vector<std::string> p = absl::StrSplit(f, ':');
    if (p.size() == 2) out.push_back({p[0], std::stoi(p[1])});
  }
  return out;
}

// Callers: each sends argmax requests for a fixed set of inputs and checks every answer against
// the one the group gave before any fault (the same group computes the same answer).
class Callers {
 public:
  Callers(DraftHeadClient& client, std::vector<std::vector<uint16_t>> inputs,
          std::vector<std::vector<int32_t>> expected, int threads)
      : client_(client), inputs_(std::move(inputs)), expected_(std::move(expected)) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this, t] { Run(t); });
  }
  ~Callers() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  int ok() const { return ok_; }
  int wrong() const { return wrong_; }
  int failed() const { return failed_; }
  std::string first_failure() {
    std::lock_guard<std::mutex> l(mu_);
    return first_failure_;
  }

 private:
  void Run(int t) {
    for (size_t i = t; !stop_; ++i) {
      const size_t k = i % inputs_.size();
      auto r = client_.Argmax(std::span<const uint16_t>(inputs_[k]));
      if (!r.ok()) {
        ++failed_;
        std::lock_guard<std::mutex> l(mu_);
        if (first_failure_.empty()) first_failure_ = r.status().ToString();
      } else if (r->token_ids != expected_[k]) {
        ++wrong_;
      } else {
        ++ok_;
      }
    }
  }
  DraftHeadClient& client_;
  const std::vector<std::vector<uint16_t>> inputs_;
  const std::vector<std::vector<int32_t>> expected_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, wrong_{0}, failed_{0};
  std::mutex mu_;
  std::string first_failure_;
  std::vector<std::thread> threads_;
};

TEST(Faults, SupervisedGroupSurvivesEveryRanksDeathAndAStoppedWorker) {
  testutil::TempDir tmp;
  const std::string target = "127.0.0.1:" + std::to_string(testing::FreePort());
  std::vector<std::string> args = {"--backend=cpu", "--comm=gloo", "--threads=1", "--listen=" + target,
                                   "--restart=on-failure", "--op-timeout=1s"};
  for (absl::string_view a : absl::StrSplit(Env("DRAFTHEAD_FAULTS_ARGS",
                                                "--tp=3 --synthetic=5 --hidden-size=256 --padded-vocab=2048"),
                                            ' ', absl::SkipEmpty()))
    args.emplace_back(a);
  ServerProcess sup(args, tmp.path() + "/server.log");
  ASSERT_TRUE(testing::WaitServing(sup, target, std::chrono::seconds(600))) << sup.Log();

  ClientOptions o;
  o.retry.max_attempts = 1000;  // retried until the deadline
  o.retry.initial_backoff = absl::Milliseconds(50);
  o.retry.max_backoff = absl::Milliseconds(500);
  o.default_deadline = absl::Seconds(60);
  auto client = DraftHeadClient::Connect(target, o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto hidden = (*client)->HiddenSize();
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  std::vector<std::vector<uint16_t>> inputs;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 8; ++i) {
    inputs.push_back(ref::RandomBf16(2 * *hidden, 100 + i));
    auto r = (*client)->Argmax(std::span<const uint16_t>(inputs.back()));
    ASSERT_TRUE(r.ok()) << r.status();
    expected.push_back(r->token_ids);
  }

  Callers callers(**client, inputs, expected, 4);
  auto health = testing::Channel(target);
  struct Row {
    std::string fault;
    double to_serving_ms;
    int backoff_ms;  // the supervisor's back-off inside that time (from its log)
    int answered;
  };
  // The supervisor's n-th "supervisor_restarting after_ms=N".
  auto backoff_ms = [&sup](size_t n) {
    const std::string log = sup.Log(), key = "event=supervisor_restarting after_ms=";
    size_t at = 0;
    for (size_t i = 0; i <= n; ++i) {
      at = log.find(key, at);
      if (at == std::string::npos) return -1;
      at += key.size();
    }
    return std::atoi(log.c_str() + at);
  };
  std::vector<Row> table;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (const Fault& f : Faults()) {
    const auto before = Ranks(sup.pid());
    ASSERT_TRUE(before.count(f.rank)) << "no rank " << f.rank << " now\n" << sup.Log();
    const int answered_before = callers.ok(), served_before = GroupsServed(sup);
    const auto t0 = Clock::now();
    kill(before.at(f.rank), f.what == "stop" ? SIGSTOP : SIGKILL);
    // Recovered: a new group has reached SERVING and health says so.
    double ms = -1;
    while (Clock::now() - t0 < std::chrono::seconds(120)) {
      if (GroupsServed(sup) > served_before && testing::HealthStatus(health) == 1) {
        ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GE(ms, 0) << f.what << " of rank " << f.rank << ": never SERVING again\n" << sup.Log();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // answered in the new group too
    table.push_back({absl::StrCat(f.what == "stop" ? "SIGSTOP" : "kill -9", " rank ", f.rank), ms,
                     backoff_ms(table.size()), callers.ok() - answered_before});
  }
  // The last group serves the callers too.
  const int answered_last = callers.ok();
  for (auto until = Clock::now() + std::chrono::seconds(30); Clock::now() < until && callers.ok() < answered_last + 10;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(callers.ok(), answered_last + 10) << "the group that serves after the last fault answers nobody";
  callers.Stop();
  std::printf("\n| fault | fault -> SERVING again (ms) | of which supervisor back-off (ms) | requests answered meanwhile |\n"
              "| --- | --- | --- | --- |\n");
  for (const Row& r : table)
    std::printf("| %s | %.0f | %d | %d |\n", r.fault.c_str(), r.to_serving_ms, r.backoff_ms, r.answered);
  std::printf("callers: %d answered, %d wrong, %d failed\n", callers.ok(), callers.wrong(), callers.failed());
  EXPECT_EQ(callers.wrong(), 0);
  EXPECT_EQ(callers.failed(), 0) << callers.first_failure();
  EXPECT_GT(callers.ok(), 0);

  kill(sup.pid(), SIGTERM);
  const int st = sup.Wait(std::chrono::seconds(60));
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << sup.Log();
}

}  // namespace
}  // namespace drafthead
