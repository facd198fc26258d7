// SYSTEM regions: a POSIX shared-memory object, opened read-write and mapped once. The descriptor
// stays open so each access can re-check the object's size (a shrunk object would otherwise turn
// the next access into a SIGBUS).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/regions/region_registry.h"

namespace drafthead::regions {
namespace {

std::string ErrnoText(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof(buf));  // the GNU form returns the text
}

// A single "/name": one leading slash and no other, no "..", no NUL, at most NAME_MAX.
absl::Status CheckShmKey(const std::string& key) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm_key: '", key, "' is not a single /name (", why, ")"));
  };
  if (key.size() < 2 || key[0] != '/') return bad("it must start with '/' and name something");
  if (key.find('/', 1) != std::string::npos) return bad("no '/' after the first");
  if (key.find("..") != std::string::npos) return bad("no '..'");
  if (key.find('\0') != std::string::npos) return bad("no NUL byte");
  if (key.size() > 255) return bad("at most 255 characters");
  return absl::OkStatus();
}

class PosixMapping final : public RegionMapping {
 public:
  PosixMapping(std::string key, int fd, void* map, size_t map_len, uint8_t* data, uint64_t end)
      : key_(std::move(key)), fd_(fd), map_(map), map_len_(map_len), data_(data), end_(end) {}
  ~PosixMapping() override {
    munmap(map_, map_len_);
    close(fd_);
  }

  uint8_t* host_data() override { return data_; }
  void* device_data() override { return nullptr; }

  absl::Status CheckBacked() override {
    struct stat st;
    if (fstat(fd_, &st) != 0)
      return absl::InvalidArgumentError(absl::StrCat("shared-memory object '", key_,
                                                     "' cannot be checked: ", ErrnoText(errno)));
    if (static_cast<uint64_t>(st.st_size) < end_)
      return absl::InvalidArgumentError(absl::StrCat(
          "shared-memory object '", key_, "' shrank to ", st.st_size,
          " bytes, below the region's end at ", end_));
    return absl::OkStatus();
  }

  absl::Status Read(uint64_t offset, void* host_dst, size_t n) override {
    std::memcpy(host_dst, data_ + offset, n);
    return absl::OkStatus();
  }
  absl::Status Write(uint64_t offset, const void* host_src, size_t n) override {
    std::memcpy(data_ + offset, host_src, n);
    return absl::OkStatus();
  }

 private:
  const std::string key_;
  const int fd_;
  void* const map_;
  const size_t map_len_;
  uint8_t* const data_;  // the region's first byte (map_ + the offset's remainder in its page)
  const uint64_t end_;   // offset + byte_size in the object
};

}  // namespace

absl::StatusOr<std::unique_ptr<RegionMapping>> MapPosixRegion(const RegionSpec& spec) {
  DH_RETURN_IF_ERROR(CheckShmKey(spec.shm_key));
  if (spec.byte_size == 0) return absl::InvalidArgumentError("byte_size: must be > 0");
  if (spec.offset > UINT64_MAX - spec.byte_size)
    return absl::InvalidArgumentError("offset: offset + byte_size overflows");
  const int fd = shm_open(spec.shm_key.c_str(), O_RDWR, 0);
  if (fd < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("shm_key: cannot open '", spec.shm_key, "': ", ErrnoText(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shm_key: cannot stat '", spec.shm_key, "': ", ErrnoText(err)));
  }
  const uint64_t end = spec.offset + spec.byte_size;
  if (static_cast<uint64_t>(st.st_size) < end) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size: offset ", spec.offset, " + byte_size ", spec.byte_size, " = ", end,
        " exceeds the size of '", spec.shm_key, "' (", st.st_size, " bytes)"));
  }
  // mmap wants a page-aligned file offset: map from the page holding the region's first byte.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = spec.offset - spec.offset % page;
  const size_t len = static_cast<size_t>(end - start);
  void* map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shm_key: cannot map '", spec.shm_key, "': ", ErrnoText(err)));
  }
  uint8_t* data = static_cast<uint8_t*>(map) + (spec.offset - start);
  return std::make_unique<PosixMapping>(spec.shm_key, fd, map, len, data, end);
}

}  // namespace drafthead::regions
