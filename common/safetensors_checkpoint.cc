// Checkpoints: one .safetensors file, or a directory with model.safetensors.index.json or a single
// *.safetensors file (common/safetensors.h says which); files opened on first use.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <new>

#include "common/safetensors.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace drafthead::st {

using internal::ErrnoStatus;
using internal::Quote;
using json = nlohmann::json;

namespace {

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = 256ull << 20;

// weight_map values name files inside the checkpoint directory; anything that could resolve
// elsewhere ("../x", "/etc/x", "sub/x", ".") is refused.
bool IsPlainFileName(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\\') == std::string::npos && f.find('\0') == std::string::npos;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat(path, ": cannot open"));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat(path, ": read"));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > limit) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", limit, " bytes"));
    }
  }
  ::close(fd);
  return out;
}

absl::StatusOr<std::map<std::string, std::string, std::less<>>> ParseIndex(
    const std::string& index_path) {
  absl::StatusOr<std::string> text = ReadSmallFile(index_path, kMaxIndexBytes);
  if (!text.ok()) return text.status();
  std::map<std::string, std::string, std::less<>> map;
  try {
    const json root = json::parse(*text);
    if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": no \"weight_map\" object"));
    for (const auto& [tensor, file] : root["weight_map"].items()) {
      if (!file.is_string())
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor ", Quote(tensor), ": file is not a string"));
      const std::string f = file.get<std::string>();
      if (!IsPlainFileName(f))
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor ", Quote(tensor),
                                                       ": file ", Quote(f),
                                                       " is not a plain name in the directory"));
      map[tensor] = f;
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(index_path, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  return map;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint file or directory"));
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->path_ = path;
  if (!fs::is_directory(st)) {
    c->single_file_ = path;
    return c;
  }
  c->dir_ = path;
  const std::string index = absl::StrCat(path, "/", kIndexName);
  if (fs::exists(index, ec)) {
    absl::StatusOr<std::map<std::string, std::string, std::less<>>> m = ParseIndex(index);
    if (!m.ok()) return m.status();
    c->weight_map_ = *std::move(m);
    return c;
  }
  std::vector<std::string> found;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 12 && name.ends_with(".safetensors") && it->is_regular_file(ec))
      found.push_back(name);
  }
  if (ec) return absl::InternalError(absl::StrCat(path, ": listing the directory: ", ec.message()));
  std::sort(found.begin(), found.end());
  if (found.empty())
    return absl::NotFoundError(absl::StrCat(path, ": no ", kIndexName, " and no *.safetensors"));
  if (found.size() > 1)
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", found.size(),
                                                   " *.safetensors files (", absl::StrJoin(found, ", "),
                                                   ") and no ", kIndexName, " to say which holds what"));
  c->single_file_ = absl::StrCat(path, "/", found[0]);
  return c;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::File(std::string_view tensor) {
  std::string file = single_file_;
  if (file.empty()) {
    auto it = weight_map_.find(tensor);
    if (it == weight_map_.end())
      return absl::NotFoundError(absl::StrCat(dir_, "/", kIndexName, ": tensor ", Quote(tensor),
                                              " is not in the weight_map"));
    file = absl::StrCat(dir_, "/", it->second);
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = files_.find(file);
  if (it == files_.end()) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(file);
    if (!f.ok()) {
      // Header-level errors do not know which tensor was wanted: say so.
      const std::string q = Quote(tensor);
      if (f.status().message().find(q) != absl::string_view::npos) return f.status();
      return absl::Status(f.status().code(),
                          absl::StrCat(f.status().message(), " (reading tensor ", q, ")"));
    }
    it = files_.emplace(file, *std::move(f)).first;
  }
  const SafetensorsFile* f = it->second.get();
  if (absl::StatusOr<const TensorInfo*> t = f->Find(tensor); !t.ok()) return t.status();
  return f;
}

absl::StatusOr<const TensorInfo*> Checkpoint::Info(std::string_view tensor) {
  absl::StatusOr<const SafetensorsFile*> f = File(tensor);
  if (!f.ok()) return f.status();
  return (*f)->Find(tensor);
}

absl::Status Checkpoint::ReadRows(std::string_view tensor, int64_t r0, int64_t n, void* dst,
                                  uint64_t dst_bytes) {
  absl::StatusOr<const SafetensorsFile*> f = File(tensor);
  if (!f.ok()) return f.status();
  return (*f)->ReadRows(tensor, r0, n, dst, dst_bytes);
}

}  // namespace drafthead::st
