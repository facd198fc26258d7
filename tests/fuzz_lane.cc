// libFuzzer: a lane's untrusted inputs, as the server reads them out of a caller's shared memory:
// the header's constant part (CheckLaneHeader) and descriptors (ParseDescriptor) with any region
// count and inline size. Nothing may crash, overflow or read outside the input; an accepted
// descriptor names only the lane's regions and an answer that fits where it goes.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "server/lane/lane_descriptor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace drafthead;
  if (size < 8) return 0;
  uint32_t regions, inline_bytes;
  std::memcpy(&regions, data, 4);
  std::memcpy(&inline_bytes, data + 4, 4);
  regions %= 5;
  data += 8;
  size -= 8;
  if (size >= 128 + 128) {  // a header's constant part, then descriptors
    lane::LaneHeader h{};
    std::memcpy(static_cast<void*>(&h), data, 128);
    const uint64_t bytes = h.total_bytes ^ (data[0] & 1);
    (void)CheckLaneHeader(h, bytes, h.nonce, h.client_pid);
    data += 128;
    size -= 128;
  }
  std::vector<std::string> names;
  for (uint32_t i = 0; i < regions; ++i) names.push_back("r" + std::to_string(i));
  LaneLimits limits{64, 256, inline_bytes % (lane::kMaxInlineBytes + 1)};
  for (; size >= sizeof(lane::LaneRequest); data += sizeof(lane::LaneRequest), size -= sizeof(lane::LaneRequest)) {
    lane::LaneRequest d;
    std::memcpy(&d, data, sizeof d);
    auto p = ParseDescriptor(d, names, limits);
    if (!p.ok()) continue;
    if (d.hidden.region >= regions) __builtin_trap();
    if (p->tokens_region.empty() && p->token_bytes > limits.inline_bytes) __builtin_trap();
    if (!p->tokens_region.empty() && p->token_bytes > d.output.byte_size) __builtin_trap();
  }
  return 0;
}
