// The argument of the lane's copy kernel (lane_copy.cu), shared by the kernel and its launcher
// (lane_cuda.cc): up to kLaneCopyPieces copies between device addresses (device memory or host
// memory mapped for the device), then one 32-bit word written after all of them (a fence or
// consumed word in mapped host memory; word == 0: none).
#pragma once

#include <cstdint>

namespace drafthead::lane {

inline constexpr uint32_t kLaneCopyPieces = 4;

struct LaneCopyArgs {
  uint64_t src[kLaneCopyPieces];
  uint64_t dst[kLaneCopyPieces];
  uint64_t bytes[kLaneCopyPieces];
  uint64_t word;   // device address of the word written after the copies; 0: none
  uint32_t value;  // what it is set to
  uint32_t n;      // pieces used
  uint32_t fresh;  // 1: the sources are host memory another process writes (ld.global.cv: never a stale cached line)
  uint32_t reserved;
};

}  // namespace drafthead::lane
