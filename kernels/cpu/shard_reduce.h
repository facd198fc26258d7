// Per-shard reductions of one row of fp32 logits on the CPU, and the merge rank 0 runs over every
// rank's candidates. The CUDA kernels (kernels/cuda/shard_reduce.cuh) produce the same Candidate /
// SoftmaxPartial records, so the merge is shared.
//
// A row's logits y[0, n_valid) are the shard's uncropped columns; column j is token id_base + j.
#pragma once

#include <cstdint>

#include "kernels/candidate.h"

namespace drafthead::cpu {

// A row of full logits in bf16 (FloatToBf16 per value: round to nearest even, NaN kept quiet).
// Here, in the kernels' -O3 library, the loop vectorises (0.78 -> 0.34 ns a value on SSE2).
void LogitsToBf16(const float* y, int64_t n, uint16_t* out);

// The max and the sum of exp over y / temperature of a row's n valid columns (sum 0 when the max
// is not finite, NaN when a column is): libm's exp in double per column (the reference), or 8 at
// a time with AVX-512F where the CPU has it (SoftmaxPartialOf picks).
SoftmaxPartial SoftmaxPartialPortable(const float* y, int64_t n, float temperature);
SoftmaxPartial SoftmaxPartialOf(const float* y, int64_t n, float temperature);
bool SoftmaxPartialVectorised();  // whether SoftmaxPartialOf takes the AVX-512F path here
namespace internal {
#if defined(__x86_64__) || defined(__i386__)
// shard_reduce_avx512.cc (built with -mavx512f); call only when SoftmaxPartialVectorised().
SoftmaxPartial SoftmaxPartialAvx512(const float* y, int64_t n, float temperature);
#endif
}  // namespace internal

// The k best columns, best first (ties to the smaller id); slots past n_valid get id -1.
// part: SoftmaxPartialOf the row (only when part != nullptr).
void ShardTopK(const float* y, int64_t n_valid, int32_t id_base, uint32_t k, float temperature,
               Candidate* out, SoftmaxPartial* part);

// The best column (ties to the smaller id).
void ShardArgmax(const float* y, int64_t n_valid, int32_t id_base, Candidate* out);

// The Gumbel-max sample: the column with the largest SampleKey(y, T, seed, row, id).
void ShardSample(const float* y, int64_t n_valid, int32_t id_base, float temperature,
                 uint64_t seed, uint32_t row, Candidate* out);

// Merges `lists` sorted candidate lists of `per_list` entries each (rank r's at
// lists + r * stride) into the best k, best first. Returns how many real candidates came out.
uint32_t MergeCandidates(const Candidate* const* lists, int nlists, uint32_t per_list, uint32_t k,
                         Candidate* out);

// Combines the ranks' softmax partials into the global (max, sum); the probability of a logit v
// is then exp(v / T - max) / sum.
struct SoftmaxTotal {
  double max_scaled;
  double sum_exp;
};
SoftmaxTotal CombineSoftmax(const SoftmaxPartial* const* parts, int n);
float SoftmaxProb(const SoftmaxTotal& t, float logit, float temperature);

}  // namespace drafthead::cpu
