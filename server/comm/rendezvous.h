// Rendezvous for a rank group through the leader's address alone (no shared filesystem): rank 0
// runs a tiny TCP key-value store (KvServer) at --leader=HOST:PORT; every rank, rank 0 included,
// talks to it through a KvClient. Gloo's rendezvous (gloo::rendezvous::Store) and NCCL's unique id
// both go through it.
//
// Protocol: length-prefixed frames over TCP, one request/response at a time per connection:
// 'S' key value -> 'K'; 'G' key -> 'V' value, or 'N' when absent (the client polls until the
// key appears or its timeout passes).
// Threads: KvServer serves each connection on its own thread; a KvClient is used by one thread.
// Deadlines: no socket call here blocks past the deadline of the operation it serves (see each
// method); a garbage frame (unknown op, length over 64 MB) fails at once rather than being waited
// out. Codes: DEADLINE_EXCEEDED when a deadline passes, UNAVAILABLE for a closed/unreachable peer,
// INTERNAL for a garbage frame. After any failure a KvClient's connection is unusable.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace drafthead {

class KvServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving. A connection may idle between
  // frames until the server is destroyed; a frame once begun, and each reply, must complete within
  // io_timeout or the connection is dropped (a stalled or non-reading peer).
  static absl::StatusOr<std::unique_ptr<KvServer>> Start(
      const std::string& host, int port, std::chrono::milliseconds io_timeout = std::chrono::seconds(10));
  ~KvServer();
  int port() const { return port_; }

 private:
  KvServer() = default;
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::chrono::milliseconds io_timeout_{0};
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  absl::Mutex mu_;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> conns_ ABSL_GUARDED_BY(mu_);  // one per accepted connection
  std::vector<int> conn_fds_ ABSL_GUARDED_BY(mu_);
};

class KvClient {
 public:
  using Clock = std::chrono::steady_clock;
  using Deadline = Clock::time_point;

  // Connects to host:port, retrying until `timeout` (the leader may not be up yet; each connect is
  // non-blocking, bounded by what is left). `timeout` (the join's) also bounds each Set.
  static absl::StatusOr<std::unique_ptr<KvClient>> Connect(const std::string& hostport,
                                                           std::chrono::milliseconds timeout);
  ~KvClient();

  // Bounded by Connect's timeout: a leader that accepts and then says nothing is DEADLINE_EXCEEDED.
  absl::Status Set(const std::string& key, const std::string& value);
  // Waits until the key is set or the timeout passes (DEADLINE_EXCEEDED naming the key); the
  // requests and replies themselves are bounded by the same timeout.
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);

 private:
  KvClient(int fd, std::string peer, std::chrono::milliseconds io_timeout)
      : fd_(fd), peer_(std::move(peer)), io_timeout_(io_timeout) {}
  absl::StatusOr<std::string> Roundtrip(char op, const std::string& key, const std::string& value,
                                        char* reply_op, Deadline deadline);
  int fd_;  // non-blocking: every call waits in poll() with a deadline
  std::string peer_;
  std::chrono::milliseconds io_timeout_;
};

}  // namespace drafthead
