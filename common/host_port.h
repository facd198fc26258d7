// "host:port" addresses, split once for every listener and dialer (rendezvous, metrics, the
// leader's address). Threads: any. Failure: INVALID_ARGUMENT naming the address.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace drafthead {

// "host:port" or "[v6]:port"; an empty host means every interface ("0.0.0.0").
absl::Status SplitHostPort(const std::string& hostport, std::string* host, int* port);

}  // namespace drafthead
