// The fp8 twin of a bf16 shard on the CPU (SPEC "The fp8 twin"): e4m3 codes [n, k] and one biased
// power-of-two exponent per 32x32 block [ceil(n/32), k/32]. Bit-identical to the original's
// make_twin and to the CUDA builder (kernels/cuda/twin.cu).
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace drafthead::cpu {

inline int64_t TwinExpRows(int64_t n) { return (n + 31) / 32; }

// w: bf16 bits [n, k], k a multiple of 32. codes: [n, k]; exps: [ceil(n/32), k/32].
// Rows past n in the last block count as zeros. Non-finite weights are the caller's to reject.
void MakeTwin(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, uint8_t* exps,
              ThreadPool& pool);

// One 32-row block band [32*band, min(n, 32*band+32)) of the twin; MakeTwin runs these in parallel.
void MakeTwinBand(const uint16_t* w, int64_t n, int64_t k, int64_t band, uint8_t* codes,
                  uint8_t* exps);

}  // namespace drafthead::cpu
