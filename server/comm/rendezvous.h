// Rendezvous for a rank group through the leader's address alone (no shared filesystem): rank 0
// runs a tiny TCP key-value store (KvServer) at --leader=HOST:PORT; every rank, rank 0 included,
// talks to it through a KvClient. Gloo's rendezvous (gloo::rendezvous::Store) and NCCL's unique id
// both go through it.
//
// Protocol: length-prefixed frames over TCP, one request/response at a time per connection:
// 'S' key value -> 'K'; 'G' key -> 'V' value, or 'N' when absent (the client polls until the
// key appears or its timeout passes).
// Threads: KvServer serves each connection on its own thread; a KvClient is used by one thread.
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

// "host:port" or "[v6]:port".
absl::Status SplitHostPort(const std::string& hostport, std::string* host, int* port);

class KvServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving.
  static absl::StatusOr<std::unique_ptr<KvServer>> Start(const std::string& host, int port);
  ~KvServer();
  int port() const { return port_; }

 private:
  KvServer() = default;
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  absl::Mutex mu_;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> conns_ ABSL_GUARDED_BY(mu_);  // one per accepted connection
  std::vector<int> conn_fds_ ABSL_GUARDED_BY(mu_);
};

class KvClient {
 public:
  // Connects to host:port, retrying until `timeout` (the leader may not be up yet).
  static absl::StatusOr<std::unique_ptr<KvClient>> Connect(const std::string& hostport,
                                                           std::chrono::milliseconds timeout);
  ~KvClient();

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits until the key is set or the timeout passes (DEADLINE_EXCEEDED naming the key).
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);

 private:
  explicit KvClient(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  absl::StatusOr<std::string> Roundtrip(char op, const std::string& key, const std::string& value,
                                        char* reply_op);
  int fd_;
  std::string peer_;
};

}  // namespace drafthead
