// The gRPC metadata key a client sends on every unary call to say which of its channels (its
// callers) the call belongs to. The server queues unary calls fairly by caller: by connection
// (the peer address), told apart further by this value, since over a Unix socket every
// connection's peer reads the same. A client sends one value per channel (a random id of the
// client and the channel's index); a call without it counts as its connection's.
#pragma once

namespace drafthead {

inline constexpr char kCallerHeader[] = "drafthead-caller";

}  // namespace drafthead
