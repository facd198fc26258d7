#include "server/regions/region_registry.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace drafthead::regions {

const char* RegionKindName(RegionKind kind) {
  return kind == RegionKind::kSystem ? "system" : "cuda";
}

absl::Status SharedMemoryOff() {
  return absl::FailedPreconditionError(
      "shared-memory regions are off: start the server with --shared-memory=system,cuda (or one "
      "of them)");
}

absl::StatusOr<RegistryOptions> ParseSharedMemoryKinds(absl::string_view value) {
  RegistryOptions o;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    if (part == "system") {
      o.system = true;
    } else if (part == "cuda") {
      o.cuda = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--shared-memory: '", part, "' is not system or cuda"));
    }
  }
  return o;
}

// The registry's record of one region. The spec is immutable; the mapping lives until the region
// is gone and no access holds it.
class Region {
 public:
  Region(RegionSpec spec, std::unique_ptr<RegionMapping> mapping)
      : spec_(std::move(spec)), device_id_(mapping->device_id()), mapping_(std::move(mapping)) {}

  const RegionSpec& spec() const { return spec_; }
  int device_id() const { return device_id_; }
  uint64_t accesses() const { return accesses_.load(std::memory_order_relaxed); }

  absl::StatusOr<RegionMapping*> Begin(absl::string_view field) {
    absl::MutexLock l(&mu_);
    if (gone_)
      return absl::NotFoundError(absl::StrCat(field, ": region '", spec_.name,
                                              "' was unregistered"));
    ++active_;
    accesses_.fetch_add(1, std::memory_order_relaxed);
    return mapping_.get();
  }

  void End() {
    std::unique_ptr<RegionMapping> unmap;  // destroyed outside the lock
    absl::MutexLock l(&mu_);
    if (--active_ == 0 && gone_) unmap = std::move(mapping_);
  }

  // Marks the region gone and unmaps it once no access holds it (waiting until `deadline`).
  absl::Status Retire(absl::Time deadline) {
    std::unique_ptr<RegionMapping> unmap;
    absl::MutexLock l(&mu_);
    gone_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline))
      return absl::DeadlineExceededError(absl::StrCat(
          "region '", spec_.name, "': an access in progress outlived the unregister wait; the "
          "region is unregistered and will be unmapped when it ends"));
    unmap = std::move(mapping_);
    return absl::OkStatus();
  }

 private:
  const RegionSpec spec_;
  const int device_id_;
  std::atomic<uint64_t> accesses_{0};
  absl::Mutex mu_;
  std::unique_ptr<RegionMapping> mapping_ ABSL_GUARDED_BY(mu_);
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace {

// [offset, offset + size) within [0, limit), without overflow.
bool SliceFits(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

}  // namespace

// ---- RegionAccess

RegionAccess::RegionAccess(std::shared_ptr<Region> region, RegionMapping* mapping,
                           uint64_t offset, uint64_t size)
    : region_(std::move(region)), mapping_(mapping), offset_(offset), size_(size) {}

RegionAccess::RegionAccess(RegionAccess&& other) noexcept
    : region_(std::move(other.region_)), mapping_(other.mapping_), offset_(other.offset_),
      size_(other.size_) {
  other.mapping_ = nullptr;
}

RegionAccess::~RegionAccess() {
  if (region_) region_->End();
}

uint8_t* RegionAccess::host_data() const {
  uint8_t* base = mapping_->host_data();
  return base == nullptr ? nullptr : base + offset_;
}

void* RegionAccess::device_data() const {
  void* base = mapping_->device_data();
  return base == nullptr ? nullptr : static_cast<uint8_t*>(base) + offset_;
}

absl::Status RegionAccess::Read(uint64_t at, void* host_dst, size_t n) const {
  if (!SliceFits(at, n, size_))
    return absl::InvalidArgumentError(absl::StrCat("read of [", at, ", +", n, ") outside a ",
                                                   size_, "-byte slice"));
  return mapping_->Read(offset_ + at, host_dst, n);
}

absl::Status RegionAccess::Write(uint64_t at, const void* host_src, size_t n) const {
  if (!SliceFits(at, n, size_))
    return absl::InvalidArgumentError(absl::StrCat("write of [", at, ", +", n, ") outside a ",
                                                   size_, "-byte slice"));
  return mapping_->Write(offset_ + at, host_src, n);
}

absl::Status RegionAccess::WriteRows(uint64_t at, uint64_t dst_pitch, const void* host_src, uint64_t src_pitch,
                                     uint64_t width, uint64_t rows) const {
  if (rows == 0 || width == 0) return absl::OkStatus();
  // The last row's end: at + (rows - 1) x dst_pitch + width, each step checked against the slice.
  const bool fits = width <= dst_pitch && (rows - 1) <= (size_ - std::min(size_, at)) / dst_pitch &&
                    SliceFits(at + (rows - 1) * dst_pitch, width, size_);
  if (!fits)
    return absl::InvalidArgumentError(absl::StrCat("write of ", rows, " rows of ", width, " bytes ", dst_pitch,
                                                   " apart from ", at, " outside a ", size_, "-byte slice"));
  return mapping_->WriteRows(offset_ + at, dst_pitch, host_src, src_pitch, width, rows);
}

absl::Status RegionMapping::WriteRows(uint64_t offset, uint64_t dst_pitch, const void* host_src, uint64_t src_pitch,
                                      uint64_t width, uint64_t rows) {
  const auto* src = static_cast<const uint8_t*>(host_src);
  for (uint64_t i = 0; i < rows; ++i) DH_RETURN_IF_ERROR(Write(offset + i * dst_pitch, src + i * src_pitch, width));
  return absl::OkStatus();
}

// ---- RegionRef

const std::string& RegionRef::name() const { return region_->spec().name; }
RegionKind RegionRef::kind() const { return region_->spec().kind; }
uint64_t RegionRef::byte_size() const { return region_->spec().byte_size; }

absl::StatusOr<RegionAccess> RegionRef::Access(uint64_t offset, uint64_t size,
                                               absl::string_view field) const {
  const uint64_t limit = region_->spec().byte_size;
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat(field, ": byte_size is 0"));
  if (!SliceFits(offset, size, limit))
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": offset ", offset, " + byte_size ", size, " is outside region '", name(),
        "' (", limit, " bytes)"));
  DH_ASSIGN_OR_RETURN(RegionMapping * mapping, region_->Begin(field));
  RegionAccess access(region_, mapping, offset, size);  // ends the access on every return below
  absl::Status backed = mapping->CheckBacked();
  if (!backed.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", backed.message()));
  return access;
}

// ---- RegionRegistry

RegionRegistry::RegionRegistry(RegistryOptions options) : options_(options) {}

RegionRegistry::~RegionRegistry() { Unregister("").IgnoreError(); }

absl::Status RegionRegistry::CheckEnabled(RegionKind kind) const {
  const bool on = kind == RegionKind::kSystem ? options_.system : options_.cuda;
  if (on) return absl::OkStatus();
  std::vector<std::string> kinds;
  if (options_.system) kinds.push_back("system");
  if (options_.cuda) kinds.push_back("cuda");
  if (kinds.empty()) return SharedMemoryOff();
  return absl::FailedPreconditionError(absl::StrCat(
      RegionKindName(kind), " shared-memory regions are off: start the server with "
      "--shared-memory=", RegionKindName(kind), " (it runs with --shared-memory=",
      absl::StrJoin(kinds, ","), ")"));
}

absl::Status RegionRegistry::CheckAnyEnabled() const {
  return any_enabled() ? absl::OkStatus() : SharedMemoryOff();
}

absl::Status RegionRegistry::Register(const RegionSpec& spec) {
  DH_RETURN_IF_ERROR(CheckEnabled(spec.kind));
  if (spec.name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  auto taken = [&] {
    return absl::AlreadyExistsError(
        absl::StrCat("name: a region named '", spec.name, "' is already registered"));
  };
  {
    absl::MutexLock l(&mu_);
    if (regions_.count(spec.name)) return taken();  // before mapping anything
  }
  absl::StatusOr<std::unique_ptr<RegionMapping>> mapping =
      spec.kind == RegionKind::kSystem ? MapPosixRegion(spec)
                                       : MapCudaIpcRegion(spec, options_.cuda_device);
  if (!mapping.ok()) return mapping.status();
  RegionSpec kept = spec;
  kept.cuda_ipc_handle.clear();
  auto region = std::make_shared<Region>(std::move(kept), std::move(mapping).value());
  absl::MutexLock l(&mu_);
  if (!regions_.emplace(spec.name, std::move(region)).second) return taken();  // lost a race
  return absl::OkStatus();
}

absl::Status RegionRegistry::Unregister(absl::string_view name, std::optional<RegionKind> only) {
  std::vector<std::shared_ptr<Region>> gone;
  {
    absl::MutexLock l(&mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      const bool named = name.empty() || it->first == name;
      const bool kind_ok = !only || it->second->spec().kind == *only;
      if (named && kind_ok) {
        gone.push_back(std::move(it->second));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!name.empty() && gone.empty())
    return absl::NotFoundError(absl::StrCat(
        "name: no ", only ? RegionKindName(*only) : "", only ? " " : "", "region named '", name,
        "' is registered"));
  return Retire(std::move(gone));
}

absl::Status RegionRegistry::Retire(std::vector<std::shared_ptr<Region>> gone) {
  const absl::Time deadline = absl::Now() + kUnregisterWait;
  absl::Status first;
  for (auto& r : gone) first.Update(r->Retire(deadline));
  return first;
}

absl::StatusOr<RegionRef> RegionRegistry::Find(absl::string_view name,
                                               absl::string_view field) const {
  absl::MutexLock l(&mu_);
  auto it = regions_.find(name);
  if (it == regions_.end())
    return absl::NotFoundError(
        absl::StrCat(field, ": no region named '", name, "' is registered"));
  return RegionRef(it->second);
}

absl::StatusOr<std::vector<RegionStatus>> RegionRegistry::List(absl::string_view name) const {
  std::vector<RegionStatus> out;
  absl::MutexLock l(&mu_);
  for (const auto& [key, region] : regions_) {
    if (!name.empty() && key != name) continue;
    out.push_back({region->spec(), region->device_id(), region->accesses()});
  }
  if (!name.empty() && out.empty())
    return absl::NotFoundError(absl::StrCat("name: no region named '", name, "' is registered"));
  return out;
}

#ifndef DRAFTHEAD_HAVE_CUDA
absl::StatusOr<std::unique_ptr<RegionMapping>> MapCudaIpcRegion(const RegionSpec&, int) {
  return absl::UnimplementedError("cuda shared-memory regions need a CUDA build of drafthead");
}
#endif

}  // namespace drafthead::regions
