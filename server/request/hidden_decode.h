// Hidden rows into bf16 bits for the GEMV, checked on the way: fp32 rounded to nearest even, bf16
// copied. Both refuse Inf/NaN, and fp32 values that round to a bf16 infinity. Each source byte is
// read once (the source may be a shared-memory region its owner writes meanwhile): the bad value
// is returned as read, not re-read. Vectorised with AVX-512 (F + BW), else AVX2, where the CPU has
// it (checked once at run time); the portable versions are the reference and the fallback.
//
// Each returns n when every value is good, else the index of the first bad one with its bits in
// *bad_bits; dst then holds the values before it. src needs no alignment.
#pragma once

#include <cstddef>
#include <cstdint>

namespace drafthead::hidden {

size_t Fp32ToBf16(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits);
size_t CopyBf16(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits);

size_t Fp32ToBf16Portable(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits);
size_t CopyBf16Portable(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits);
// The AVX-512 (F + BW) versions; call only where CpuHasAvx512Bw().
size_t Fp32ToBf16Avx512(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits);
size_t CopyBf16Avx512(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits);
bool CpuHasAvx512Bw();
// The AVX2 versions; call only where CpuHasAvx2().
size_t Fp32ToBf16Avx2(const char* src, size_t n, uint16_t* dst, uint32_t* bad_bits);
size_t CopyBf16Avx2(const char* src, size_t n, uint16_t* dst, uint16_t* bad_bits);
bool CpuHasAvx2();

}  // namespace drafthead::hidden
