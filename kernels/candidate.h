// Reduction candidates and softmax partials: what each rank's per-shard reductions produce and
// what rank 0 combines. Shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

#include "kernels/numeric.h"

namespace drafthead {

// key orders candidates (the logit for TOP_K / ARGMAX, logit/T + gumbel for SAMPLE); logit is
// the value the response reports. id < 0 marks "no candidate" (a rank with fewer valid columns
// than k).
struct Candidate {
  int32_t id;
  float key;
  float logit;
};

// Per-rank softmax partials of logit / T over the rank's valid columns: the combined softmax is
// exact given every rank's (max, sum of exp(v - max)).
struct SoftmaxPartial {
  float max_scaled;
  float sum_exp;
};

static_assert(sizeof(Candidate) == 12 && sizeof(SoftmaxPartial) == 8);

DH_HD float OrderKey(float key) { return key != key ? -__builtin_huge_valf() : key; }  // NaN last

// True when a ranks before b: larger key first, ties to the smaller id; empty candidates last.
DH_HD bool CandidateBefore(const Candidate& a, const Candidate& b) {
  if ((a.id < 0) != (b.id < 0)) return a.id >= 0;
  const float ka = OrderKey(a.key), kb = OrderKey(b.key);
  if (ka != kb) return ka > kb;
  return static_cast<uint32_t>(a.id) < static_cast<uint32_t>(b.id);
}

}  // namespace drafthead
