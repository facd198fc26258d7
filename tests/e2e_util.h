// End-to-end helpers: start drafthead-server as a real process group on loopback, wait for its
// health, talk to it over gRPC, and stop it. Everything is bounded in time.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "drafthead/v1/drafthead.grpc.pb.h"
#include "test_util.h"

namespace drafthead::testing {

inline std::string BinDir() {
  const char* d = std::getenv("DRAFTHEAD_BIN_DIR");
  return d ? d : ".";
}

// A loopback port free now, and never one this process was given before: the kernel may hand a
// closed port out again at once, so two ports asked for in a row (a server's gRPC and metrics
// ports) could otherwise be the same.
inline int FreePort() {
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> l(mu);
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    const int port = ntohs(a.sin_port);
    if (given.insert(port).second) return port;
  }
}

// Children of `pid` (the launcher's worker ranks).
inline std::vector<pid_t> ChildPids(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t c;
  while (f >> c) out.push_back(c);
  return out;
}

// True once pid has exited (gone, or a zombie awaiting its reaper).
inline bool ProcessGone(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string a, b, state;
    if (!(f >> a >> b >> state) || state == "Z") return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

class ServerProcess {
 public:
  // Starts `drafthead-server args...` (or another of the project's programs: `program` relative to
  // the build folder), logging its stderr to log_path.
  ServerProcess(std::vector<std::string> args, std::string log_path,
                const std::string& program = "server/drafthead-server")
      : log_(std::move(log_path)) {
    args.insert(args.begin(), BinDir() + "/" + program);
    pid_ = fork();
    if (pid_ == 0) {
      // A test that dies (an abort, a sanitizer's report) takes its server with it: a server left
      // holding the test's stdout would keep ctest waiting until its timeout.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      FILE* f = std::freopen(log_.c_str(), "w", stderr);
      (void)f;
      std::vector<char*> a;
      for (auto& s : args) a.push_back(s.data());
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      for (pid_t c : ChildPids(pid_)) kill(c, SIGKILL);
      kill(pid_, SIGKILL);
      Wait(std::chrono::seconds(10));
    }
  }
  pid_t pid() const { return pid_; }
  std::string Log() const { return testutil::ReadFile(log_); }
  // Waits for the process to exit; returns its wait status, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout) {
    if (exited_) return status_;
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        status_ = st;
        return st;
      }
      if (std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  bool Running() { return Wait(std::chrono::milliseconds(0)) == -1; }

 private:
  pid_t pid_ = -1;
  std::string log_;
  bool exited_ = false;
  int status_ = 0;
};

inline std::shared_ptr<grpc::Channel> Channel(
    const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials()) {
  grpc::ChannelArguments ca;
  ca.SetMaxReceiveMessageSize(-1);
  ca.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(target, creds, ca);
}

// grpc.health.v1.Health/Check through the generic stub: 1 = SERVING, 2 = NOT_SERVING, -1 = no answer.
inline int HealthStatus(const std::shared_ptr<grpc::Channel>& ch) {
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::Slice empty("", 0);
  grpc::ByteBuffer req(&empty, 1), resp;  // empty HealthCheckRequest: service ""
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  if (!s.ok()) return -1;
  std::vector<grpc::Slice> slices;
  resp.Dump(&slices);
  std::string bytes;
  for (auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  if (bytes.empty()) return 0;  // UNKNOWN (field absent)
  if (bytes.size() >= 2 && bytes[0] == 0x08) return bytes[1];
  return -1;
}

// Polls health until SERVING, the process exits, or the timeout passes.
inline bool WaitServing(ServerProcess& p, const std::string& target, std::chrono::seconds timeout,
                        std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials()) {
  auto ch = Channel(target, creds);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (!p.Running()) return false;
    if (HealthStatus(ch) == 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace drafthead::testing
