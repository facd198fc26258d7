#include "server/app/shutdown.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

#include "common/exit_codes.h"
#include "common/log.h"

namespace drafthead {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

[[noreturn]] void ExitNow(int code) {
  std::fflush(nullptr);
  _exit(code);  // no destructors: other threads may sit in collectives or hold the objects
}

}  // namespace

void ShutdownSignal::Notify(const ShutdownReason& reason) {
  absl::MutexLock l(&mu_);
  if (!serving_) {
    if (reason.failed()) {
      Log(LogLevel::kError, "start_failed", "error", std::string(reason.failure.message()));
      ExitNow(kExitFailed);
    }
    Log(LogLevel::kWarn, "stopped_during_startup", "signal", reason.signal);
    ExitNow(kExitSignalBase + reason.signal);
  }
  if (!reason.failed() && role_ == Role::kWorker) {
    Log(LogLevel::kInfo, "signal_deferred_to_rank0", "signal", reason.signal);
    return;
  }
  if (reason.signal != 0 && reason_.signal == 0) reason_.signal = reason.signal;
  if (reason.failed() && !reason_.failed()) reason_.failure = reason.failure;
  notified_ = true;
}

void ShutdownSignal::MarkServing() {
  absl::MutexLock l(&mu_);
  serving_ = true;
}

void ShutdownSignal::Wait() const {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(&notified_));
}

ShutdownReason ShutdownSignal::reason() const {
  absl::MutexLock l(&mu_);
  return reason_;
}

void BlockShutdownSignals() {
  const sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

SignalThread::SignalThread(ShutdownSignal& shutdown) : shutdown_(shutdown) {
  thread_ = std::thread([this] {
    const sigset_t set = ShutdownSignals();
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (stopping_) return;
      shutdown_.Notify(ShutdownReason::Signal(sig));
    }
  });
}

SignalThread::~SignalThread() {
  stopping_ = true;
  // Directed at this thread alone, and blocked everywhere, so its sigwait takes it.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

void ExitOnTerminate() {
  std::set_terminate([] {
    std::string what = "unknown";
    if (auto e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
    }
    Log(LogLevel::kError, "fatal_collective_failure", "error", what);
    ExitNow(kExitFatalCollectiveFailure);
  });
}

}  // namespace drafthead
