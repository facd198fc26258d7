// A POSIX shared-memory object for tests, as a co-located caller makes one: created, sized and
// mapped here, unlinked and unmapped at scope exit. Names are unique per process and object.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace drafthead::testutil {

class ScopedShm {
 public:
  explicit ScopedShm(size_t bytes) : bytes_(bytes) {
    static std::atomic<int> next{0};
    key_ = "/dh_test_" + std::to_string(getpid()) + "_" + std::to_string(next++);
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) std::abort();
    data_ = static_cast<uint8_t*>(p);
  }
  ~ScopedShm() {
    munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  ScopedShm(const ScopedShm&) = delete;
  ScopedShm& operator=(const ScopedShm&) = delete;

  const std::string& key() const { return key_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  // Shrinks (or grows) the object behind the registry's back.
  void Resize(size_t bytes) const {
    const int fd = shm_open(key_.c_str(), O_RDWR, 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
    close(fd);
  }

 private:
  std::string key_;
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

}  // namespace drafthead::testutil
