// The gRPC metadata key a client sends on every unary call to say which of its channels (its
// callers) the call belongs to. The server queues unary calls fairly by caller: by connection
// (the peer address), told apart further by this value, since over a Unix socket every
// connection's peer reads the same. A client sends one value per channel (a random id of the
// client and the channel's index); a call without it counts as its connection's.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace drafthead {

inline constexpr char kCallerHeader[] = "drafthead-caller";

// kCallerHeader's values for a client's `channels` channels: a random id of the client, then the
// channel's index.
inline std::vector<std::string> NewCallerIds(size_t channels) {
  std::random_device rd;
  const std::string me = absl::StrCat(absl::Hex(rd()), absl::Hex(rd()));
  std::vector<std::string> ids;
  for (size_t i = 0; i < channels; ++i) ids.push_back(absl::StrCat(me, "-", i));
  return ids;
}

}  // namespace drafthead
