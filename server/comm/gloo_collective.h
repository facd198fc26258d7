// The Gloo implementation of Collective: TCP transport, rendezvous through the leader's KvServer.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/comm/collective.h"
#include "server/comm/rendezvous.h"

namespace drafthead {

// Joins the group as `rank` of `world`. `bind_host` is the address this rank's Gloo device
// listens on (peers must be able to reach it). `store` is used only during this call. Fails
// (naming the rank that did not show up) after `timeout`. `same_host_links`: this rank's wish to
// move the data over Unix sockets when every rank shares rank 0's host (same_host_links.h; the
// group uses them only if every rank wishes it and every worker reaches rank 0).
absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(int rank, int world,
                                                               const std::string& bind_host,
                                                               KvClient& store,
                                                               std::chrono::milliseconds timeout,
                                                               bool same_host_links = true);

}  // namespace drafthead
