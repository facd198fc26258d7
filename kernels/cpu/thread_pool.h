// A fixed pool of worker threads for data-parallel loops over a shard. One caller at a time
// (each rank's compute thread owns its pool); ParallelFor blocks until every chunk is done.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace drafthead::cpu {

class ThreadPool {
 public:
  // threads <= 0: one per hardware thread. The calling thread takes part, so threads - 1 are
  // spawned.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into chunks of at least `grain` and runs fn(begin, end) on them, in parallel.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, next_ = 0;
  int pending_ = 0;  // workers still inside the current job
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace drafthead::cpu
