// The safetensors writer: header serialization and the streaming, rename-into-place writer.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "common/safetensors.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace drafthead::st {

using internal::ErrnoStatus;
using internal::Quote;
using json = nlohmann::json;

absl::StatusOr<std::string> SerializeHeader(const std::vector<TensorSpec>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  try {
    json root = json::object();
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const TensorSpec& t : tensors) {
      if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
        return absl::InvalidArgumentError(
            absl::StrCat("tensor name ", Quote(t.name), " is empty, reserved or repeated"));
      uint64_t bytes = static_cast<uint64_t>(DTypeSize(t.dtype));
      json shape = json::array();
      for (int64_t d : t.shape) {
        if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
          return absl::InvalidArgumentError(
              absl::StrCat("tensor ", Quote(t.name), ": bad or overflowing shape"));
        shape.push_back(d);
      }
      json entry = json::object();
      entry["dtype"] = std::string(DTypeName(t.dtype));
      entry["shape"] = std::move(shape);
      entry["data_offsets"] = json::array({offset, offset + bytes});
      root[t.name] = std::move(entry);
      offset += bytes;
    }
    if (!metadata.empty()) {
      json meta = json::object();
      for (const auto& [k, v] : metadata) meta[k] = v;
      root["__metadata__"] = std::move(meta);
    }
    std::string text = root.dump();
    // The format recommends padding with spaces so the data section starts 8-byte aligned.
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  } catch (const std::exception& e) {  // e.g. a name that is not UTF-8
    return absl::InvalidArgumentError(absl::StrCat("cannot serialize the header: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = SerializeHeader(tensors, metadata);
  if (!header.ok())
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_path_ = absl::StrCat(path, ".tmp.", ::getpid());
  for (const TensorSpec& t : tensors) {
    uint64_t bytes = static_cast<uint64_t>(DTypeSize(t.dtype));
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);  // checked by SerializeHeader
    w->data_total_ += bytes;
  }
  w->fd_ = ::open(w->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return ErrnoStatus(errno, absl::StrCat(w->tmp_path_, ": cannot create"));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(header->size() >> (8 * i));
  if (absl::Status s = w->WriteRaw(len, 8); !s.ok()) return s;
  if (absl::Status s = w->WriteRaw(header->data(), header->size()); !s.ok()) return s;
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

absl::Status SafetensorsWriter::WriteRaw(const void* data, uint64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, 1ull << 30));
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoStatus(errno, absl::StrCat(tmp_path_, ": write"));
    p += w;
    bytes -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Append(const void* data, uint64_t bytes) {
  if (finished_ || fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat(path_, ": append after Finish"));
  if (bytes > data_total_ - data_written_)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", bytes, " more bytes than the ",
                                                   data_total_ - data_written_, " left to write"));
  if (absl::Status s = WriteRaw(data, bytes); !s.ok()) return s;
  data_written_ += bytes;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (finished_ || fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish called twice"));
  if (data_written_ != data_total_)
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", data_written_, " of ",
                                                      data_total_, " data bytes written"));
  if (::fsync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat(tmp_path_, ": fsync"));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat(tmp_path_, ": close"));
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    return ErrnoStatus(errno, absl::StrCat("rename ", tmp_path_, " -> ", path_));
  finished_ = true;
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorData& t : tensors) {
    uint64_t need = static_cast<uint64_t>(DTypeSize(t.spec.dtype));
    bool overflow = false;
    for (int64_t d : t.spec.shape)
      overflow |= d < 0 || __builtin_mul_overflow(need, static_cast<uint64_t>(d), &need);
    if (overflow || need != t.bytes || (t.bytes > 0 && t.data == nullptr))
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", Quote(t.spec.name), ": ",
                                                     t.bytes, " bytes given for its shape"));
    specs.push_back(t.spec);
  }
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
      SafetensorsWriter::Create(path, std::move(specs), metadata);
  if (!w.ok()) return w.status();
  for (const TensorData& t : tensors)
    if (absl::Status s = (*w)->Append(t.data, t.bytes); !s.ok()) return s;
  return (*w)->Finish();
}

}  // namespace drafthead::st
