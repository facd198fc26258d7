// The per-row reductions every backend's epilogue implements, and the largest TOP_K k any kernel
// serves. The wire format (server/group/wire_format.h) asserts that its RowMode numbering and
// its --max-top-k cap agree with these, so the kernels need not depend on server/.
#pragma once

#include <cstdint>

namespace drafthead {

enum class ReduceMode : uint8_t { kFullLogits = 0, kTopK = 1, kArgmax = 2, kSample = 3 };

// TOP_K k <= kMaxTopK: the CUDA radix select keeps this many keys in shared memory per CTA.
inline constexpr uint32_t kMaxTopK = 1024;

}  // namespace drafthead
