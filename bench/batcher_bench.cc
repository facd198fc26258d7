// The batcher's own cost per request, fair queueing against FIFO (issue 24): CALLERS callers each
// keep one request of ROWS rows queued (a closed loop at c = CALLERS, as bench/fair_queue_bench.sh
// drives the server), the engine side takes batches and each taken request is resubmitted at once
// by its caller. One thread, no engine: what is left is Submit + Take per request.
//
//   drafthead-bench-batcher [CALLERS=64] [ROWS=5] [SECONDS=2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "server/sched/batcher.h"

namespace drafthead {
namespace {

double NsPerRequest(QueuePolicy policy, int callers, uint32_t rows, double seconds) {
  BatcherOptions o;
  o.policy = policy;
  Batcher b(o);
  auto req = std::make_shared<PreparedRequest>();
  req->rows = rows;
  auto submit = [&](int caller) {
    BatchItem it;
    it.req = req;
    it.caller = CallerKey{"unary", static_cast<uint64_t>(caller)};
    it.enqueued = Clock::now();
    it.done = [](const absl::Status&, const BatchRowsResult*) {};
    b.Submit(std::move(it)).IgnoreError();
  };
  for (int c = 0; c < callers; ++c) submit(c);
  uint64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 100; ++i) {
      std::vector<BatchItem> batch = b.Take(std::chrono::milliseconds(0));
      b.BatchStarted();
      for (const BatchItem& it : batch) submit(static_cast<int>(it.caller.id));
      n += batch.size();
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  return ns / static_cast<double>(n);
}

}  // namespace
}  // namespace drafthead

int main(int argc, char** argv) {
  const int callers = argc > 1 ? std::atoi(argv[1]) : 64;
  const uint32_t rows = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 5;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 2.0;
  std::printf("| policy | callers | rows | ns per request (Submit + Take) |\n| --- | --- | --- | --- |\n");
  for (int round = 0; round < 2; ++round) {
    for (auto p : {drafthead::QueuePolicy::kFair, drafthead::QueuePolicy::kFifo}) {
      std::printf("| %s | %d | %u | %.0f |\n", drafthead::QueuePolicyName(p), callers, rows,
                  drafthead::NsPerRequest(p, callers, rows, seconds));
    }
  }
  return 0;
}
