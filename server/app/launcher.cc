#include "server/app/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace drafthead {
namespace {

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "ended";
}

pid_t SpawnSelf(const std::vector<std::string>& args, bool die_with_parent) {
  std::vector<char*> cargv;
  for (const auto& a : args) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: unblock the signals the parent routes to its signal thread.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_UNBLOCK, &all, nullptr);
  if (die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
  }
  execv("/proc/self/exe", cargv.data());
  _exit(127);
}

}  // namespace

absl::StatusOr<std::vector<pid_t>> SpawnWorkerRanks(const std::vector<std::string>& argv, int world,
                                                    const std::string& leader) {
  std::vector<pid_t> pids;
  for (int r = 1; r < world; ++r) {
    std::vector<std::string> a = argv;
    a.push_back(absl::StrCat("--rank=", r));
    a.push_back(absl::StrCat("--world=", world));
    a.push_back(absl::StrCat("--leader=", leader));
    a.push_back(absl::StrCat("--local-rank=", r));
    pid_t pid = SpawnSelf(a, /*die_with_parent=*/true);
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      return absl::InternalError(absl::StrCat("fork for rank ", r, ": ", std::strerror(errno)));
    }
    pids.push_back(pid);
  }
  return pids;
}

struct ChildWatcher::State {
  std::vector<pid_t> pids;  // set before the thread starts, then read-only
  absl::Mutex mu;
  std::vector<bool> alive ABSL_GUARDED_BY(mu);
  std::atomic<bool> stop{false};
  std::thread thread;
};

ChildWatcher::ChildWatcher(std::vector<pid_t> pids,
                           std::function<void(int, const std::string&, bool)> on_exit)
    : s_(new State()) {
  s_->pids = std::move(pids);
  s_->alive.assign(s_->pids.size(), true);
  State* s = s_;
  s_->thread = std::thread([s, on_exit] {
    size_t left = s->pids.size();
    while (left > 0 && !s->stop) {
      // waitpid(-1): rank 0 may be a container's PID 1 and then also reaps strays (children the
      // entrypoint left before exec'ing us) rather than leaving zombies.
      int status = 0;
      const pid_t r = waitpid(-1, &status, WNOHANG);
      if (r <= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      size_t i = 0;
      while (i < s->pids.size() && s->pids[i] != r) ++i;
      if (i == s->pids.size()) {
        Log(LogLevel::kDebug, "reaped_stray_child", "pid", r);
        continue;
      }
      {
        absl::MutexLock l(&s->mu);
        s->alive[i] = false;
      }
      --left;
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      on_exit(static_cast<int>(i) + 1, DescribeExit(status), clean);
    }
  });
}

ChildWatcher::~ChildWatcher() {
  s_->stop = true;
  s_->thread.join();
  delete s_;
}

void ChildWatcher::SignalAll(int sig) {
  absl::MutexLock l(&s_->mu);
  for (size_t i = 0; i < s_->pids.size(); ++i)
    if (s_->alive[i]) kill(s_->pids[i], sig);
}

bool ChildWatcher::WaitAll(int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    {
      absl::MutexLock l(&s_->mu);
      bool any = false;
      for (bool a : s_->alive) any = any || a;
      if (!any) return true;
    }
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int SuperviseGroup(const std::vector<std::string>& argv) {
  std::vector<std::string> a = argv;
  a.push_back("--restart=no");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  int backoff_ms = 500;
  for (int attempt = 1;; ++attempt) {
    const auto started = std::chrono::steady_clock::now();
    pid_t pid = SpawnSelf(a, /*die_with_parent=*/true);
    if (pid < 0) return 1;
    Log(LogLevel::kInfo, "supervisor_started_group", "pid", pid, "attempt", attempt);
    int status = 0;
    bool stop_requested = false;
    for (;;) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      timespec ts{0, 50 * 1000 * 1000};
      siginfo_t info;
      int sig = sigtimedwait(&set, &info, &ts);
      if (sig == SIGTERM || sig == SIGINT) {
        stop_requested = true;
        kill(pid, SIGTERM);  // the group drains and exits
      }
    }
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    Log(clean ? LogLevel::kInfo : LogLevel::kError, "supervisor_group_exited", "how",
        DescribeExit(status));
    if (clean || stop_requested) return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(60)) backoff_ms = 500;
    Log(LogLevel::kWarn, "supervisor_restarting", "after_ms", backoff_ms);
    timespec ts{backoff_ms / 1000, (backoff_ms % 1000) * 1000000L};
    siginfo_t info;
    if (sigtimedwait(&set, &info, &ts) > 0) return 1;
    backoff_ms = std::min(backoff_ms * 2, 30000);
  }
}

}  // namespace drafthead
