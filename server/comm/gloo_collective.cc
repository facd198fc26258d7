#include "server/comm/gloo_collective.h"

#include <cstring>
#include <memory>

#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/comm/same_host_links.h"

namespace drafthead {
namespace {

using Clock = std::chrono::steady_clock;

// gloo::rendezvous::Store over the leader's key-value store. Gloo reports store failures by
// exception; they are caught by MakeGlooCollective.
class KvGlooStore : public gloo::rendezvous::Store {
 public:
  KvGlooStore(KvClient& kv, std::chrono::milliseconds timeout) : kv_(kv), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = kv_.Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = kv_.Get(key, timeout_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    for (const auto& k : keys) {
      auto v = kv_.Get(k, t);
      if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    }
  }

 private:
  KvClient& kv_;
  std::chrono::milliseconds timeout_;
};

// Gloo throws on I/O failure and timeouts; both are a broken group (UNAVAILABLE, the cause in the
// message: "Timed out" for a timeout), mapped once, here.
#define DH_GLOO_CHECK(stmt, rank)                                                             \
  do {                                                                                        \
    try {                                                                                     \
      stmt;                                                                                   \
    } catch (const std::exception& e) {                                                       \
      broken_ = true;                                                                         \
      return absl::UnavailableError(                                                          \
          absl::StrCat("gloo: ", FailureSite(#stmt, __FILE__, __LINE__, rank), ": ", e.what())); \
    }                                                                                         \
  } while (0)

class GlooCollective : public Collective {
 public:
  GlooCollective(std::shared_ptr<gloo::rendezvous::Context> ctx, std::unique_ptr<SameHostLinks> links)
      : ctx_(std::move(ctx)), links_(std::move(links)) {}

  int rank() const override { return ctx_->rank; }
  int world() const override { return ctx_->size; }
  std::string name() const override { return "gloo"; }
  std::string transport() const override { return links_ ? "unix" : "tcp"; }

  absl::Status Broadcast(void* data, size_t bytes, MemorySpace space,
                         std::chrono::milliseconds timeout) override {
    DH_RETURN_IF_ERROR(Usable(space));
    if (world() == 1 || bytes == 0) return absl::OkStatus();
    if (links_) return links_->Broadcast(data, bytes, Clock::now() + timeout);  // broken state: theirs
    gloo::BroadcastOptions opts(ctx_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(0);
    opts.setTag(NextTag());
    opts.setTimeout(timeout);
    DH_GLOO_CHECK(gloo::broadcast(opts), rank());
    return absl::OkStatus();
  }

  absl::Status PostGather(void* recv, size_t bytes, MemorySpace space) override {
    DH_RETURN_IF_ERROR(Usable(space));
    posted_.reset();
    if (world() == 1 || rank() != 0 || bytes == 0 || links_) return absl::OkStatus();
    DH_GLOO_CHECK(PostReceives(recv, bytes), rank());
    return absl::OkStatus();
  }

  absl::Status Gather(const void* send, size_t bytes, void* recv, MemorySpace space,
                      std::chrono::milliseconds timeout) override {
    DH_RETURN_IF_ERROR(Usable(space));
    if (world() == 1) {
      if (bytes > 0 && recv != send) std::memcpy(recv, send, bytes);
      return absl::OkStatus();
    }
    if (bytes == 0) return absl::OkStatus();
    if (links_) return links_->Gather(send, bytes, recv, Clock::now() + timeout);
    if (posted_ != nullptr) {
      // Rank 0 with its receives posted: the same slots gloo::gather uses on the peers.
      std::unique_ptr<Posted> p = std::move(posted_);
      if (p->recv != recv || p->bytes != bytes || p->tag != PeekTag())
        return absl::InternalError("gloo: Gather does not match the PostGather before it");
      NextTag();
      std::memcpy(recv, send, bytes);
      bool ok = true;
      for (int r = 1; r < world() && ok; ++r) DH_GLOO_CHECK(ok = p->buf->waitRecv(timeout), rank());
      if (!ok) {
        broken_ = true;
        return absl::UnavailableError("gloo: the gather's receive was aborted");
      }
      return absl::OkStatus();
    }
    gloo::GatherOptions opts(ctx_);
    // Gloo's API takes a non-const input pointer but only reads it.
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes);
    if (rank() == 0) opts.setOutput(static_cast<uint8_t*>(recv), bytes * world());
    opts.setRoot(0);
    opts.setTag(NextTag());
    opts.setTimeout(timeout);
    DH_GLOO_CHECK(gloo::gather(opts), rank());
    return absl::OkStatus();
  }

 private:
  absl::Status Usable(MemorySpace space) const {
    if (broken_) return absl::UnavailableError("gloo: the group is broken by an earlier failure");
    if (space != MemorySpace::kHost)
      return absl::InvalidArgumentError("gloo: buffers must be in host memory");
    return absl::OkStatus();
  }
  uint32_t NextTag() { return tag_++ & 0x7fffffffu; }
  uint32_t PeekTag() const { return tag_ & 0x7fffffffu; }

  // Rank 0's receives of the next gather (gloo's gather slot, the tag that call will take).
  struct Posted {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    void* recv;
    size_t bytes;
    uint32_t tag;
  };
  void PostReceives(void* recv, size_t bytes) {
    auto p = std::make_unique<Posted>();
    p->buf = ctx_->createUnboundBuffer(recv, bytes * world());
    p->recv = recv;
    p->bytes = bytes;
    p->tag = PeekTag();
    const uint64_t slot = gloo::Slot::build(gloo::kGatherSlotPrefix, p->tag);
    for (int r = 1; r < world(); ++r) p->buf->recv(r, slot, r * bytes, bytes);
    posted_ = std::move(p);
  }

  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  uint32_t tag_ = 1;
  bool broken_ = false;
  std::unique_ptr<Posted> posted_;
  // Set when every rank shares rank 0's host: batches and payloads go over these instead of the
  // Gloo pairs, which stay connected (idle) for the group's life.
  std::unique_ptr<SameHostLinks> links_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(int rank, int world,
                                                               const std::string& bind_host,
                                                               KvClient& store,
                                                               std::chrono::milliseconds timeout,
                                                               bool same_host_links) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = bind_host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    KvGlooStore kv(store, timeout);
    gloo::rendezvous::PrefixStore prefixed("gloo", kv);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    ctx->setTimeout(timeout);
    ctx->connectFullMesh(prefixed, dev);
    absl::StatusOr<std::unique_ptr<SameHostLinks>> links =
        SameHostLinks::Establish(rank, world, same_host_links, store, timeout);
    if (!links.ok()) {
      return absl::UnavailableError(absl::StrCat("gloo: rank ", rank, " of ", world,
                                                 " could not agree on same-host links: ", links.status().message()));
    }
    return std::unique_ptr<Collective>(new GlooCollective(std::move(ctx), std::move(*links)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo: rank ", rank, " of ", world,
                                               " could not join the group: ", e.what()));
  }
}

}  // namespace drafthead
