// drafthead-bench-cpu: the CPU LM-head GEMV against this machine's streaming-read bandwidth.
//
// For one shard (default the real one, N=32320 x K=5120) with synthetic weights (random valid
// e4m3 codes and exponents; random bf16 for the bf16 head) it times HeadGemvFp8 and HeadGemvBf16
// for each M and prints a table: median time, GB/s of weight bytes (fp8: codes + exponents; bf16:
// the bf16 shard), the percentage of a streaming read measured in the same run (an AVX2 sum over
// a large buffer on all threads), and GFLOP/s (2 M N K / t) to show where compute takes over.
//
// Flags: --threads=T (0: all hardware threads) --reps=R --m=1,5,16,64 --n=N --k=K
//        --stream-mib=MIB --isa=auto|scalar|avx2|avx512bf16 --vs=ISA (the fp8 GEMV with a second
//        implementation in the same run, with the speedup) --cold (stream the big buffer before
//        each rep so the shard starts outside the caches) --no-bf16 --cpu-time (the GEMV columns
//        in process CPU time instead of wall time: for a machine shared with other jobs, where
//        wall time counts the waits for a core; best with --threads=1)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/head_gemv.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/numeric.h"

namespace {

using drafthead::cpu::GemvIsa;
using drafthead::cpu::ThreadPool;
using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 0;
  int reps = 9;
  std::vector<int> ms = {1, 5, 16, 64};
  int64_t n = 32320;
  int64_t k = 5120;
  int64_t stream_mib = 1024;
  GemvIsa isa = GemvIsa::kAuto;
  bool cpu_time = false;
  bool vs_set = false;
  GemvIsa vs = GemvIsa::kAvx2;
  bool cold = false;
  bool bf16 = true;
};

[[noreturn]] void Usage(const char* bad) {
  std::fprintf(stderr,
               "bad flag %s\nusage: drafthead-bench-cpu [--threads=T] [--reps=R] [--m=1,5,16,64] "
               "[--n=N] [--k=K] [--stream-mib=MIB] [--isa=auto|scalar|avx2|avx512bf16] [--vs=ISA] [--cold] "
               "[--no-bf16] [--cpu-time]\n",
               bad);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      const size_t l = std::strlen(name);
      return a.compare(0, l, name) == 0 ? a.c_str() + l : nullptr;
    };
    if (const char* v = val("--threads=")) {
      o.threads = std::atoi(v);
    } else if (const char* v = val("--reps=")) {
      o.reps = std::max(1, std::atoi(v));
    } else if (const char* v = val("--m=")) {
      o.ms.clear();
      for (const char* p = v; *p;) {
        o.ms.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else if (const char* v = val("--n=")) {
      o.n = std::atoll(v);
    } else if (const char* v = val("--k=")) {
      o.k = std::atoll(v);
    } else if (const char* v = val("--stream-mib=")) {
      o.stream_mib = std::max<int64_t>(64, std::atoll(v)) / 4 * 4;  // whole 4 MiB pieces
    } else if (const char* v = val("--isa=")) {
      if (!drafthead::cpu::ParseGemvIsa(v, &o.isa)) Usage(argv[i]);
    } else if (const char* v = val("--vs=")) {
      if (!drafthead::cpu::ParseGemvIsa(v, &o.vs)) Usage(argv[i]);
      o.vs_set = true;
    } else if (a == "--cpu-time") {
      o.cpu_time = true;
    } else if (a == "--cold") {
      o.cold = true;
    } else if (a == "--no-bf16") {
      o.bf16 = false;
    } else {
      Usage(argv[i]);
    }
  }
  for (int m : o.ms)
    if (m < 1) Usage("--m");
  for (GemvIsa i : {o.isa, o.vs})
    if (!drafthead::cpu::GemvIsaAvailable(i)) Usage("--isa/--vs (not available on this CPU)");
  if (o.n < 1 || o.k < 32 || o.k % 32 != 0) Usage("--n/--k");
  return o;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Streaming read: sum the buffer as 32-bit ints. Four sub-streams per thread (a quarter of the
// range each, read side by side) give the memory system as many streams in flight as the GEMV's
// weight rows do; a single sequential stream per core measures well below what the bus delivers.
__attribute__((target("avx2"))) uint64_t SumRange(const uint8_t* p, int64_t bytes) {
  const int64_t q = bytes / 4;
  const uint8_t *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 64 <= q; i += 64) {
    a0 = _mm256_add_epi32(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p0 + i)));
    a1 = _mm256_add_epi32(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p1 + i)));
    a2 = _mm256_add_epi32(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p2 + i)));
    a3 = _mm256_add_epi32(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p3 + i)));
    a0 = _mm256_add_epi32(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p0 + i + 32)));
    a1 = _mm256_add_epi32(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p1 + i + 32)));
    a2 = _mm256_add_epi32(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p2 + i + 32)));
    a3 = _mm256_add_epi32(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p3 + i + 32)));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  uint64_t t = 0;
  for (uint32_t l : lanes) t += l;
  return t;
}

uint64_t StreamSum(const uint8_t* buf, int64_t bytes, ThreadPool& pool) {
  constexpr int64_t kBlock = 4 << 20;  // 4 MiB pieces, handed out dynamically
  std::vector<uint64_t> partial(bytes / kBlock, 0);  // bytes: a multiple of 4 MiB
  pool.ParallelFor(bytes / kBlock, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) partial[b] = SumRange(buf + b * kBlock, kBlock);
  });
  uint64_t t = 0;
  for (uint64_t v : partial) t += v;
  return t;
}

uint8_t* AllocAligned(int64_t bytes) {
  const int64_t rounded = (bytes + 4095) / 4096 * 4096;
  return static_cast<uint8_t*>(std::aligned_alloc(4096, rounded));
}

// CPU time of the whole process (all threads), microseconds.
double ProcessCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

template <class Fn>
double TimeMedianUs(const Options& o, Fn&& fn, const uint8_t* flush, int64_t flush_bytes,
                    ThreadPool& pool) {
  fn();  // warm-up: page faults, thread wake-up, thread_local buffers
  std::vector<double> t;
  volatile uint64_t sink = 0;
  for (int r = 0; r < o.reps; ++r) {
    if (o.cold) sink = sink + StreamSum(flush, flush_bytes, pool);
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuUs();
    fn();
    t.push_back(o.cpu_time ? ProcessCpuUs() - c0
                           : std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return Median(t);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  ThreadPool pool(o.threads);
  const int64_t n = o.n, k = o.k, kb = k / 32, eb = (n + 31) / 32;

  // ---- streaming-read reference ---------------------------------------------------------------
  const int64_t sbytes = o.stream_mib << 20;
  uint8_t* sbuf = AllocAligned(sbytes);
  pool.ParallelFor(sbytes >> 20, 1, [&](int64_t b0, int64_t b1) {
    std::memset(sbuf + (b0 << 20), 1, (b1 - b0) << 20);  // fault the pages in on every thread
  });
  volatile uint64_t sink = StreamSum(sbuf, sbytes, pool);
  std::vector<double> st;
  for (int r = 0; r < std::max(5, o.reps); ++r) {
    const auto t0 = Clock::now();
    sink = sink + StreamSum(sbuf, sbytes, pool);
    st.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double stream_gbs = static_cast<double>(sbytes) / Median(st) / 1e9;

  // ---- synthetic shard -------------------------------------------------------------------------
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> codes(n * k), exps(eb * kb);
  for (auto& c : codes) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7f) == 0x7f) c ^= 1;  // a twin never holds the NaN codes
  }
  for (auto& e : exps) e = static_cast<uint8_t>(110 + rng() % 16);
  std::vector<uint16_t> wbf;
  if (o.bf16) {
    wbf.resize(n * k);
    std::normal_distribution<float> g(0.0f, 0.02f);
    for (auto& v : wbf) v = drafthead::FloatToBf16(g(rng));
  }
  const int mmax = *std::max_element(o.ms.begin(), o.ms.end());
  std::vector<uint16_t> x(static_cast<size_t>(mmax) * k);
  {
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto& v : x) v = drafthead::FloatToBf16(g(rng));
  }
  std::vector<float> y(static_cast<size_t>(mmax) * n);

  const double fp8_bytes = static_cast<double>(n * k + eb * kb);
  const double bf16_bytes = static_cast<double>(n * k * 2);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const char* isa = o.isa == GemvIsa::kAuto ? drafthead::cpu::HeadGemvIsa()
                                             : drafthead::cpu::GemvIsaName(o.isa);
  std::printf("drafthead-bench-cpu  %s  isa=%s  threads=%d  reps=%d  N=%lld K=%lld  %s\n", date, isa,
              pool.size(), o.reps, static_cast<long long>(n), static_cast<long long>(k),
              o.cold ? "cold (caches flushed before each rep)" : "warm (back to back)");
  if (o.cpu_time) std::printf("GEMV times are process CPU time (--cpu-time), not wall time\n");
  std::printf("streaming read (%lld MiB AVX2 sum, all threads): %.2f GB/s\n",
              static_cast<long long>(o.stream_mib), stream_gbs);
  std::printf("fp8 weight bytes %.1f MB, bf16 weight bytes %.1f MB\n\n", fp8_bytes / 1e6,
              bf16_bytes / 1e6);
  std::printf("| M | fp8 median us | fp8 GB/s | %% stream | fp8 GFLOP/s |");
  if (o.vs_set)
    std::printf(" fp8 %s us | %% stream | %s / %s |", drafthead::cpu::GemvIsaName(o.vs),
                drafthead::cpu::GemvIsaName(o.vs), isa);
  if (o.bf16) std::printf(" bf16 median us | bf16 GB/s | %% stream | bf16 GFLOP/s | fp8 speedup |");
  std::printf("\n|---|---|---|---|---|");
  if (o.vs_set) std::printf("---|---|---|");
  if (o.bf16) std::printf("---|---|---|---|---|");
  std::printf("\n");
  for (int m : o.ms) {
    const double flops = 2.0 * m * static_cast<double>(n) * static_cast<double>(k);
    const double t8 = TimeMedianUs(
        o,
        [&] {
          drafthead::cpu::HeadGemvFp8With(o.isa, x.data(), m, k, codes.data(), exps.data(), n,
                                          y.data(), n, pool);
        },
        sbuf, sbytes, pool);
    std::printf("| %d | %.0f | %.2f | %.0f%% | %.1f |", m, t8, fp8_bytes / t8 / 1e3,
                100.0 * fp8_bytes / t8 / 1e3 / stream_gbs, flops / t8 / 1e3);
    if (o.vs_set) {
      const double tv = TimeMedianUs(
          o,
          [&] {
            drafthead::cpu::HeadGemvFp8With(o.vs, x.data(), m, k, codes.data(), exps.data(), n,
                                            y.data(), n, pool);
          },
          sbuf, sbytes, pool);
      std::printf(" %.0f | %.0f%% | %.2fx |", tv, 100.0 * fp8_bytes / tv / 1e3 / stream_gbs,
                  tv / t8);
    }
    if (o.bf16) {
      const double tb = TimeMedianUs(
          o,
          [&] {
            drafthead::cpu::HeadGemvBf16With(o.isa, x.data(), m, k, wbf.data(), n, y.data(), n,
                                             pool);
          },
          sbuf, sbytes, pool);
      std::printf(" %.0f | %.2f | %.0f%% | %.1f | %.2fx |", tb, bf16_bytes / tb / 1e3,
                  100.0 * bf16_bytes / tb / 1e3 / stream_gbs, flops / tb / 1e3, tb / t8);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::free(sbuf);
  return static_cast<int>(sink & 0);
}
