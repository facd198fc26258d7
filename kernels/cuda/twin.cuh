// The fp8 twin builder on the GPU (SPEC "The fp8 twin"), bit-identical to kernels/cpu/twin.cc:
// both sides call the same kernels/numeric.h functions (TwinBlockExponent, FloatToE4m3), and this
// library is compiled with --fmad=false so no multiply-add is contracted differently.
//
// Pointers are device memory; the call is asynchronous on `stream`. Fails (cudaErrorInvalidValue)
// for k not a positive multiple of 32 or n <= 0; never reads rows past n (they count as zeros).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace drafthead::cuda {

// w: bf16 bits [n, k]; codes: [n, k]; exps: [ceil(n/32), k/32].
cudaError_t MakeTwin(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, uint8_t* exps,
                     cudaStream_t stream);

}  // namespace drafthead::cuda
