// Which gRPC API serves the unary ComputeLogits (--unary-api), chosen once at start-up.
#pragma once

#include <string_view>

namespace drafthead {

// kCallback: Debian's gRPC 1.51 hands each call to a callback pool thread (one thread wake-up
// more). kSync: the thread that polled the call runs it, and blocks until it is answered.
enum class UnaryApi { kCallback, kSync };

inline const char* UnaryApiName(UnaryApi api) { return api == UnaryApi::kSync ? "sync" : "callback"; }

// "callback" or "sync"; false for anything else.
inline bool ParseUnaryApi(std::string_view name, UnaryApi* api) {
  if (name == "callback") *api = UnaryApi::kCallback;
  else if (name == "sync") *api = UnaryApi::kSync;
  else return false;
  return true;
}

}  // namespace drafthead
