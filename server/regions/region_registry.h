// Shared-memory regions registered by co-located callers, so hidden rows and logits skip the wire:
// POSIX shared memory (SYSTEM: shm_open + mmap) and CUDA IPC allocations (CUDA_IPC:
// cudaIpcOpenMemHandle on rank 0's GPU, peer access where the memory lives on another GPU of the
// host). API-neutral: the DraftHead service (server/api/service.cc) and the KServe v2 service's
// shared-memory extension both sit on this one registry.
//
// Contract
// - Ownership: the registry owns every mapping. A region is mapped once, at Register, and
//   unmapped when it is unregistered (or the registry is destroyed) -- never while a RegionAccess
//   on it is alive: Unregister marks the region gone (no new access succeeds), waits (bounded,
//   kUnregisterWait) for the accesses in progress to end, then unmaps. A RegionRef (held by a
//   queued request) pins the bookkeeping only, not the mapping: after Unregister returns, nothing
//   reads or writes the caller's memory, whatever is still queued (its Access answers NOT_FOUND).
// - Threads: every method is thread-safe. Accesses to one region run concurrently with each
//   other; Register / Unregister / List take the registry's lock briefly (never during a copy).
// - Failure (absl::Status, converted at the RPC edge): a kind not enabled -> FAILED_PRECONDITION
//   naming --shared-memory; a taken name -> ALREADY_EXISTS; an unknown name -> NOT_FOUND; a bad
//   key, handle, device, offset or size, an object that cannot be opened or is too small, a slice
//   outside its region -> INVALID_ARGUMENT with the reason (slices name the caller's field). A
//   CUDA failure while copying maps through common/cuda_status.h.
// - Bounds: every byte read or written lies inside [0, byte_size) of a registered region; the
//   POSIX object's current size is re-checked at each access (a caller that shrinks it gets
//   INVALID_ARGUMENT, not a SIGBUS in the server).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace drafthead::regions {

enum class RegionKind { kSystem, kCudaIpc };
const char* RegionKindName(RegionKind kind);  // "system", "cuda"

inline constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
inline constexpr absl::Duration kUnregisterWait = absl::Seconds(10);

// What a caller registers (the proto's RegisterRegionRequest, API-neutral).
struct RegionSpec {
  std::string name;
  RegionKind kind = RegionKind::kSystem;
  std::string shm_key;          // kSystem: "/name" as given to shm_open
  std::string cuda_ipc_handle;  // kCudaIpc: the 64-byte cudaIpcMemHandle_t
  std::string cuda_device;      // kCudaIpc: PCI bus id of the GPU holding it ("" = rank 0's GPU)
  uint64_t offset = 0;          // into the object / allocation
  uint64_t byte_size = 0;
};

// A registered region as listed (Triton's shared-memory status RPCs report these).
struct RegionStatus {
  RegionSpec spec;        // cuda_ipc_handle left empty
  int cuda_device_id = -1;  // kCudaIpc: the ordinal of the GPU holding the memory
  uint64_t accesses = 0;  // reads and writes served so far
};

// Which kinds the server serves (--shared-memory=system,cuda) and where CUDA regions are opened.
struct RegistryOptions {
  bool system = false;
  bool cuda = false;
  int cuda_device = 0;  // rank 0's GPU ordinal
};

// FAILED_PRECONDITION: regions are off, start the server with --shared-memory.
absl::Status SharedMemoryOff();

// Parses --shared-memory's value: "", "system", "cuda" or "system,cuda" (any order).
absl::StatusOr<RegistryOptions> ParseSharedMemoryKinds(absl::string_view value);

// One mapped region: bytes [0, size) of what was registered. Implementations: POSIX (always),
// CUDA IPC (CUDA builds). Read/Write are bounds-checked by the caller (RegionAccess).
class RegionMapping {
 public:
  virtual ~RegionMapping() = default;  // unmaps
  virtual uint8_t* host_data() = 0;    // nullptr when the bytes are device memory
  virtual void* device_data() = 0;     // nullptr when the bytes are host memory
  virtual int device_id() const { return -1; }
  // Re-checks that every mapped byte is still backed (POSIX: the object was not shrunk).
  virtual absl::Status CheckBacked() { return absl::OkStatus(); }
  virtual absl::Status Read(uint64_t offset, void* host_dst, size_t n) = 0;
  virtual absl::Status Write(uint64_t offset, const void* host_src, size_t n) = 0;
  // `rows` rows of `width` bytes, `src_pitch` apart in host memory, to `dst_pitch` apart from
  // `offset` (one strided copy where the memory is a device's; row by row by default).
  virtual absl::Status WriteRows(uint64_t offset, uint64_t dst_pitch, const void* host_src, uint64_t src_pitch,
                                 uint64_t width, uint64_t rows);
};

class Region;  // the registry's record of one region (defined in region_registry.cc)

// A live access to a slice [offset, offset + size) of a region: while it exists the region stays
// mapped (Unregister waits for it). Move-only; keep it for the duration of one copy, no longer,
// or (a request whose logits the GPU backend copies into a CUDA region) until it is answered.
class RegionAccess {
 public:
  RegionAccess(RegionAccess&& other) noexcept;
  RegionAccess& operator=(RegionAccess&&) = delete;
  RegionAccess(const RegionAccess&) = delete;
  ~RegionAccess();

  uint64_t size() const { return size_; }
  // The slice's bytes when the region is host memory (SYSTEM), else nullptr. Valid while this
  // access lives. The caller may change them concurrently: read each byte once.
  uint8_t* host_data() const;
  // The slice's device address when the region is CUDA memory, else nullptr.
  void* device_data() const;
  // Copies [at, at + n) of the slice to / from host memory; INVALID_ARGUMENT outside the slice.
  absl::Status Read(uint64_t at, void* host_dst, size_t n) const;
  absl::Status Write(uint64_t at, const void* host_src, size_t n) const;
  // `rows` rows of `width` bytes from host memory (`src_pitch` apart) to [at + i x dst_pitch,
  // + width) of the slice; INVALID_ARGUMENT if any falls outside it or width > dst_pitch.
  absl::Status WriteRows(uint64_t at, uint64_t dst_pitch, const void* host_src, uint64_t src_pitch, uint64_t width,
                         uint64_t rows) const;

 private:
  friend class RegionRef;
  RegionAccess(std::shared_ptr<Region> region, RegionMapping* mapping, uint64_t offset, uint64_t size);
  std::shared_ptr<Region> region_;
  RegionMapping* mapping_;
  uint64_t offset_, size_;
};

// A pin on a registered region's record (not its mapping), cheap to copy: what a queued request
// holds between validation and completion.
class RegionRef {
 public:
  RegionRef() = default;
  explicit operator bool() const { return region_ != nullptr; }
  const std::string& name() const;
  RegionKind kind() const;
  uint64_t byte_size() const;
  // Starts an access to [offset, offset + size): INVALID_ARGUMENT naming `field` when the slice
  // is empty or outside the region; NOT_FOUND once the region is unregistered.
  absl::StatusOr<RegionAccess> Access(uint64_t offset, uint64_t size, absl::string_view field) const;

 private:
  friend class RegionRegistry;
  explicit RegionRef(std::shared_ptr<Region> region) : region_(std::move(region)) {}
  std::shared_ptr<Region> region_;
};

class RegionRegistry {
 public:
  explicit RegionRegistry(RegistryOptions options);
  ~RegionRegistry();  // unregisters (unmaps) everything
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  const RegistryOptions& options() const { return options_; }
  bool any_enabled() const { return options_.system || options_.cuda; }
  // OK, or FAILED_PRECONDITION naming the flag (and what the server runs with).
  absl::Status CheckEnabled(RegionKind kind) const;
  absl::Status CheckAnyEnabled() const;

  // Validates the spec, maps the region, and records it under its name.
  absl::Status Register(const RegionSpec& spec);
  // Unregisters `name` (empty: every region), waiting up to kUnregisterWait for accesses in
  // progress; `only` set: regions of that kind alone (Triton's per-kind unregister). NOT_FOUND for
  // an unknown name (or one of the other kind). DEADLINE_EXCEEDED if an access outlived the wait
  // (the region is gone all the same; the last access unmaps it).
  absl::Status Unregister(absl::string_view name, std::optional<RegionKind> only = std::nullopt);
  // The region under `name`, pinned: NOT_FOUND naming `field` when there is none.
  absl::StatusOr<RegionRef> Find(absl::string_view name, absl::string_view field) const;
  // Registered regions in name order (`name` non-empty: that one, NOT_FOUND if absent).
  absl::StatusOr<std::vector<RegionStatus>> List(absl::string_view name = {}) const;

 private:
  absl::Status Retire(std::vector<std::shared_ptr<Region>> gone);

  const RegistryOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Region>, std::less<>> regions_ ABSL_GUARDED_BY(mu_);
};

// The mappings (region_posix.cc, region_cuda.cc). Each validates its inputs, INVALID_ARGUMENT
// with the reason.
absl::StatusOr<std::unique_ptr<RegionMapping>> MapPosixRegion(const RegionSpec& spec);
absl::StatusOr<std::unique_ptr<RegionMapping>> MapCudaIpcRegion(const RegionSpec& spec,
                                                                int serving_device);

}  // namespace drafthead::regions
