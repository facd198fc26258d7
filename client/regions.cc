#include "client/regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace drafthead::client {

RegisteredRegion::~RegisteredRegion() { Unregister().IgnoreError(); }

v1::RegionSlice RegisteredRegion::Slice(uint64_t offset, uint64_t bytes) const {
  v1::RegionSlice s;
  s.set_region(name_);
  s.set_offset(offset);
  s.set_byte_size(bytes);
  return s;
}

LogitsTarget RegisteredRegion::Target(uint64_t offset, uint64_t bytes) const {
  return {Slice(offset, bytes), host_ == nullptr ? nullptr : host_ + offset};
}

absl::Status RegisteredRegion::Register(const v1::RegisterRegionRequest& request) {
  absl::Status s = client_.RegisterRegion(request);
  registered_ = s.ok();
  return s;
}

absl::Status RegisteredRegion::Unregister() {
  if (!registered_) return absl::OkStatus();
  registered_ = false;
  return client_.UnregisterRegion(name_);
}

absl::StatusOr<std::unique_ptr<SystemRegion>> SystemRegion::Create(DraftHeadClient& client,
                                                                   const std::string& name,
                                                                   uint64_t bytes) {
  const std::string key = absl::StrCat("/drafthead.", name, ".", getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return absl::FailedPreconditionError(absl::StrCat("shm_open ", key, ": ", std::strerror(errno)));
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("sizing or mapping ", key, " (", bytes,
                                                     " bytes): ", std::strerror(err)));
  }
  std::unique_ptr<SystemRegion> r(
      new SystemRegion(client, name, bytes, static_cast<uint8_t*>(p), key));
  v1::RegisterRegionRequest req;
  req.set_name(name);
  req.set_kind(v1::SYSTEM);
  req.set_shm_key(key);
  req.set_byte_size(bytes);
  if (absl::Status s = r->RegisteredRegion::Register(req); !s.ok()) return s;
  return r;
}

SystemRegion::~SystemRegion() {
  Unregister().IgnoreError();  // before the memory goes
  munmap(host_, size_);
  shm_unlink(key_.c_str());
}

#ifndef DRAFTHEAD_HAVE_CUDA
absl::StatusOr<std::unique_ptr<CudaRegion>> CudaRegion::Register(DraftHeadClient&,
                                                                 const std::string&, void*,
                                                                 uint64_t) {
  return absl::UnimplementedError("CUDA regions need a CUDA build of the drafthead client");
}
#endif

}  // namespace drafthead::client
