// Shared-memory regions from the caller's side (servers started with --shared-memory): hidden
// rows written where the server reads them and logits read where it writes them, no bytes on the
// wire. docs/shared-memory.md says when to use which and what to keep alive.
//
//   auto region = SystemRegion::Create(*client, "sched0", 1 << 20);   // POSIX, this host
//   std::memcpy((*region)->data(), hidden_bits, hidden_bytes);
//   RequestOptions o;
//   o.logits_region = (*region)->Target(hidden_bytes, rows * vocab * 2);
//   auto logits = client->Logits(HiddenRows::InRegion((*region)->Slice(0, hidden_bytes), rows), o);
//   // logits->bytes() views the region in place.
//
// Contract: a region object owns its registration. Destruction unregisters it (bounded by the
// client's default deadline; after that the server never touches the memory), then releases what
// it created. Not thread-safe to destroy while calls that name it are in flight (they would answer
// NOT_FOUND). Failure: absl::Status; the server's codes pass through (FAILED_PRECONDITION: the
// server runs without --shared-memory of that kind).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/drafthead_client.h"

namespace drafthead::client {

// A registered region: its name on the server and slices of it for requests.
class RegisteredRegion {
 public:
  virtual ~RegisteredRegion();
  RegisteredRegion(const RegisteredRegion&) = delete;
  RegisteredRegion& operator=(const RegisteredRegion&) = delete;

  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }
  // [offset, offset + bytes) of the region, as a request names it.
  v1::RegionSlice Slice(uint64_t offset, uint64_t bytes) const;
  // The same slice as a FULL_LOGITS target (with the host address where this process maps it).
  LogitsTarget Target(uint64_t offset, uint64_t bytes) const;
  // Unregisters now (the destructor then does nothing). Idempotent.
  absl::Status Unregister();

 protected:
  RegisteredRegion(DraftHeadClient& client, std::string name, uint64_t size, uint8_t* host)
      : client_(client), name_(std::move(name)), size_(size), host_(host) {}
  absl::Status Register(const v1::RegisterRegionRequest& request);

  DraftHeadClient& client_;
  const std::string name_;
  const uint64_t size_;
  uint8_t* const host_;  // the region's first byte here, or nullptr (device memory)
  bool registered_ = false;
};

// A POSIX shared-memory object created, mapped and registered by this process. Its key is
// "/drafthead.<name>.<pid>"; destruction unregisters, unmaps and unlinks it.
class SystemRegion final : public RegisteredRegion {
 public:
  static absl::StatusOr<std::unique_ptr<SystemRegion>> Create(DraftHeadClient& client,
                                                             const std::string& name,
                                                             uint64_t bytes);
  ~SystemRegion() override;
  uint8_t* data() const { return host_; }
  const std::string& key() const { return key_; }

 private:
  SystemRegion(DraftHeadClient& client, std::string name, uint64_t size, uint8_t* host,
               std::string key)
      : RegisteredRegion(client, std::move(name), size, host), key_(std::move(key)) {}
  const std::string key_;
};

// A CUDA allocation of the caller's (cudaMalloc'd, on this host) registered by its IPC handle: the
// server maps it on its own GPU. The caller keeps the allocation alive until this object is gone.
// CUDA builds of the client only (elsewhere UNIMPLEMENTED).
class CudaRegion final : public RegisteredRegion {
 public:
  static absl::StatusOr<std::unique_ptr<CudaRegion>> Register(DraftHeadClient& client,
                                                             const std::string& name,
                                                             void* device_ptr, uint64_t bytes);
  ~CudaRegion() override = default;
  void* device_data() const { return device_; }

 private:
  CudaRegion(DraftHeadClient& client, std::string name, uint64_t size, void* device)
      : RegisteredRegion(client, std::move(name), size, nullptr), device_(device) {}
  void* const device_;
};

}  // namespace drafthead::client
