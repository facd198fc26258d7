// drafthead-bench-request: the request edge's own cost (PrepareRequest: checks, the hidden rows
// decoded and checked into the request's buffer) at the real hidden size, against its floor (the
// same decode into a buffer already allocated and warm). Prints a Markdown table; medians of
// rounds of timed calls. Usage: drafthead-bench-request [--hidden=5120] [--iters=2000] [--rounds=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.h"
#include "server/request/hidden_decode.h"
#include "server/request/request.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double MedianUs(int rounds, int iters, F&& f) {
  std::vector<double> r;
  for (int k = 0; k < rounds; ++k) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    r.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
  }
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t hidden = 5120;
  int iters = 2000, rounds = 7;
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--hidden=", 9)) hidden = std::atoll(argv[i] + 9);
    else if (!std::strncmp(argv[i], "--iters=", 8)) iters = std::atoi(argv[i] + 8);
    else if (!std::strncmp(argv[i], "--rounds=", 9)) rounds = std::atoi(argv[i] + 9);
    else {
      std::fprintf(stderr, "usage: %s [--hidden=N] [--iters=N] [--rounds=N]\n", argv[0]);
      return 2;
    }
  }
  drafthead::ServingLimits limits;
  limits.hidden = hidden;
  limits.vocab_size = 129280;
  limits.max_rows = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss;
  std::printf("## PrepareRequest, hidden %lld (median of %d rounds of %d calls)\n\n",
              static_cast<long long>(hidden), rounds, iters);
  std::printf("| rows | hidden dtype | bytes | PrepareRequest us | floor: decode into a warm buffer us | ratio |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (const int rows : {1, 5, 16, 64}) {
    for (const bool fp32 : {false, true}) {
      const size_t elems = static_cast<size_t>(rows) * hidden;
      std::vector<float> f(elems);
      for (float& v : f) v = gauss(rng);
      drafthead::v1::LogitsRequest req;
      req.set_rows(rows);
      req.set_mode(drafthead::v1::TOP_K);
      req.set_top_k(8);
      if (fp32) {
        req.set_hidden_dtype(drafthead::v1::FP32);
        req.set_hidden(std::string(reinterpret_cast<const char*>(f.data()), elems * 4));
      } else {
        std::vector<uint16_t> b(elems);
        for (size_t i = 0; i < elems; ++i) b[i] = drafthead::FloatToBf16(f[i]);
        req.set_hidden(std::string(reinterpret_cast<const char*>(b.data()), elems * 2));
      }
      size_t sink = 0;
      const double prep = MedianUs(rounds, iters, [&] {
        auto p = drafthead::PrepareRequest(req, limits);
        if (!p.ok()) std::abort();
        sink += p->x[0];
      });
      std::vector<uint16_t> warm(elems);
      const double floor = MedianUs(rounds, iters, [&] {
        size_t ok;
        if (fp32) {
          uint32_t bits = 0;
          ok = drafthead::hidden::Fp32ToBf16(req.hidden().data(), elems, warm.data(), &bits);
        } else {
          uint16_t bits = 0;
          ok = drafthead::hidden::CopyBf16(req.hidden().data(), elems, warm.data(), &bits);
        }
        if (ok != elems) std::abort();
        sink += warm[0];
      });
      std::printf("| %d | %s | %zu | %.2f | %.2f | %.2f |%s\n", rows, fp32 ? "fp32" : "bf16",
                  req.hidden().size(), prep, floor, prep / floor, sink == 1 ? " " : "");
    }
  }
  return 0;
}
