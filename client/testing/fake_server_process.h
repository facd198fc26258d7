// Test helper: runs build/client/drafthead-fake-server as a child process on a free loopback port.
// The child gets --exit-after-s so that even a crashed test cannot leave it running for long.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace drafthead::client::testing {

class FakeServerProcess {
 public:
  // `args`: extra flags, e.g. {"--delay-us=2000"}. port() is 0 if the server did not come up.
  explicit FakeServerProcess(std::vector<std::string> args = {}, int exit_after_s = 120) {
    const char* bin_dir = std::getenv("DRAFTHEAD_BIN_DIR");
    const std::string bin = std::string(bin_dir ? bin_dir : ".") + "/client/drafthead-fake-server";
    char tmpl[] = "/tmp/dh-fake-XXXXXX";
    dir_ = mkdtemp(tmpl) ? tmpl : "/tmp";
    const std::string port_file = dir_ + "/port";
    std::vector<std::string> argv_s = {bin, "--listen=127.0.0.1:0", "--port-file=" + port_file,
                                       "--exit-after-s=" + std::to_string(exit_after_s)};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& s : argv_s) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream f(port_file);
      if (f >> port_) break;
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~FakeServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status;
      waitpid(pid_, &status, 0);
    }
    std::remove((dir_ + "/port").c_str());
    rmdir(dir_.c_str());
  }
  FakeServerProcess(const FakeServerProcess&) = delete;
  FakeServerProcess& operator=(const FakeServerProcess&) = delete;

  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
};

}  // namespace drafthead::client::testing
