#include "kernels/cpu/shard_reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace drafthead::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Orders a min-heap so that the worst candidate sits on top.
struct WorseFirst {
  bool operator()(const Candidate& a, const Candidate& b) const { return CandidateBefore(a, b); }
};

// Visits the columns [j, n) of y that may rank before the worst candidate kept so far, whose key
// worst() returns (OrderKey of it; it may change at each visit). Every column here has a larger id
// than the kept ones, so one enters only with a greater value (a tie never does, nor NaN, ordered
// last): most blocks of a row hold none, and a whole block's check is a branch-free compare the
// compiler vectorises (2.1 -> 0.24 ns a column over 129280, docs/NOTES.md session 11).
template <typename Worst, typename Visit>
void VisitEntering(const float* y, int64_t j, int64_t n, const Worst& worst, const Visit& visit) {
  constexpr int64_t kBlock = 64;
  while (j < n) {
    const int64_t end = std::min(j + kBlock, n);
    if (end - j == kBlock) {
      const float w = worst();
      int enters = 0;
      for (int64_t i = 0; i < kBlock; ++i) enters |= y[j + i] > w;
      if (!enters) {
        j = end;
        continue;
      }
    }
    for (; j < end; ++j) visit(j);
  }
}

}  // namespace

void LogitsToBf16(const float* y, int64_t n, uint16_t* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = FloatToBf16(y[j]);
}

void ShardTopK(const float* y, int64_t n_valid, int32_t id_base, uint32_t k, float temperature,
               Candidate* out, SoftmaxPartial* part) {
  std::vector<Candidate> heap;
  heap.reserve(k);
  int64_t j = 0;
  for (; j < n_valid && heap.size() < k; ++j) {
    heap.push_back(Candidate{static_cast<int32_t>(id_base + j), y[j], y[j]});
    std::push_heap(heap.begin(), heap.end(), WorseFirst());
  }
  // The heap is full (or k == 0: nothing to keep).
  if (k > 0) {
    VisitEntering(y, j, n_valid, [&] { return OrderKey(heap.front().key); }, [&](int64_t i) {
      const Candidate c{static_cast<int32_t>(id_base + i), y[i], y[i]};
      if (CandidateBefore(c, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), WorseFirst());
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), WorseFirst());
      }
    });
  }
  std::sort(heap.begin(), heap.end(), [](const Candidate& a, const Candidate& b) {
    return CandidateBefore(a, b);
  });
  for (uint32_t i = 0; i < k; ++i) out[i] = i < heap.size() ? heap[i] : Candidate{-1, kNegInf, 0.f};
  if (part != nullptr) *part = SoftmaxPartialOf(y, n_valid, temperature);
}

SoftmaxPartial SoftmaxPartialPortable(const float* y, int64_t n, float temperature) {
  float mx = kNegInf;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, y[j] / temperature);
  double sum = 0.0;
  if (n > 0 && std::isfinite(mx)) {
    for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(y[j] / temperature) - mx);
  }
  return SoftmaxPartial{mx, static_cast<float>(sum)};
}

bool SoftmaxPartialVectorised() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

SoftmaxPartial SoftmaxPartialOf(const float* y, int64_t n, float temperature) {
#if defined(__x86_64__) || defined(__i386__)
  if (SoftmaxPartialVectorised()) return internal::SoftmaxPartialAvx512(y, n, temperature);
#endif
  return SoftmaxPartialPortable(y, n, temperature);
}

void ShardArgmax(const float* y, int64_t n_valid, int32_t id_base, Candidate* out) {
  Candidate best{-1, kNegInf, 0.f};
  if (n_valid > 0) best = Candidate{id_base, y[0], y[0]};
  VisitEntering(y, 1, n_valid, [&] { return OrderKey(best.key); }, [&](int64_t j) {
    const Candidate c{static_cast<int32_t>(id_base + j), y[j], y[j]};
    if (CandidateBefore(c, best)) best = c;
  });
  *out = best;
}

void ShardSample(const float* y, int64_t n_valid, int32_t id_base, float temperature,
                 uint64_t seed, uint32_t row, Candidate* out) {
  Candidate best{-1, kNegInf, 0.f};
  for (int64_t j = 0; j < n_valid; ++j) {
    const uint32_t id = static_cast<uint32_t>(id_base + j);
    const Candidate c{static_cast<int32_t>(id), SampleKey(y[j], temperature, seed, row, id), y[j]};
    if (CandidateBefore(c, best)) best = c;
  }
  *out = best;
}

uint32_t MergeCandidates(const Candidate* const* lists, int nlists, uint32_t per_list, uint32_t k,
                         Candidate* out) {
  std::vector<uint32_t> pos(nlists, 0);
  uint32_t n = 0;
  for (; n < k; ++n) {
    int pick = -1;
    for (int r = 0; r < nlists; ++r) {
      if (pos[r] >= per_list || lists[r][pos[r]].id < 0) continue;
      if (pick < 0 || CandidateBefore(lists[r][pos[r]], lists[pick][pos[pick]])) pick = r;
    }
    if (pick < 0) break;
    out[n] = lists[pick][pos[pick]++];
  }
  for (uint32_t i = n; i < k; ++i) out[i] = Candidate{-1, kNegInf, 0.f};
  return n;
}

SoftmaxTotal CombineSoftmax(const SoftmaxPartial* const* parts, int n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < n; ++r)
    if (parts[r]->sum_exp > 0) mx = std::max(mx, static_cast<double>(parts[r]->max_scaled));
  double sum = 0.0;
  for (int r = 0; r < n; ++r)
    if (parts[r]->sum_exp > 0) sum += parts[r]->sum_exp * std::exp(parts[r]->max_scaled - mx);
  return {mx, sum};
}

float SoftmaxProb(const SoftmaxTotal& t, float logit, float temperature) {
  if (!(t.sum_exp > 0)) return 0.f;
  return static_cast<float>(std::exp(static_cast<double>(logit / temperature) - t.max_scaled) /
                            t.sum_exp);
}

}  // namespace drafthead::cpu
