// The safetensors reader: dtypes, header parsing and validation, the mmap'd SafetensorsFile.
// Checkpoint layouts are in safetensors_checkpoint.cc, the writer in safetensors_writer.cc.
#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace drafthead::st {
namespace {

using internal::ErrnoStatus;
using internal::Quote;
using json = nlohmann::json;

struct DTypeRow {
  DType dtype;
  const char* name;
  int64_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::kBool, "BOOL", 1},   {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},       {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kU16, "U16", 2},
    {DType::kI16, "I16", 2},     {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},   {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},     {DType::kF32, "F32", 4},
    {DType::kU64, "U64", 8},     {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},
};

std::string TensorCtx(const std::string& path, std::string_view tensor) {
  return absl::StrCat(path, ": tensor ", Quote(tensor), ": ");
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A short rendering of an untrusted JSON value for messages: scalars as themselves, containers by
// type (dumping them could recurse as deep as the attacker nested them).
std::string Brief(const json& j) {
  if (j.is_primitive()) {
    std::string s = j.dump();
    if (s.size() > 40) s = s.substr(0, 40) + "...";
    return s;
  }
  return absl::StrCat("<", j.type_name(), ">");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A JSON number that is a non-negative integer (2.0 and -1 are not).
std::optional<uint64_t> NonNegativeInt(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

absl::StatusOr<TensorInfo> ParseTensor(const std::string& name, const json& j,
                                       uint64_t data_bytes, const std::string& path) {
  const std::string ctx = TensorCtx(path, name);
  if (!j.is_object()) return absl::InvalidArgumentError(ctx + "entry is not a JSON object");
  TensorInfo t;
  t.name = name;

  const auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string())
    return absl::InvalidArgumentError(ctx + "missing or non-string \"dtype\"");
  const std::string& dtype_name = dt->get_ref<const std::string&>();
  const std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype) return absl::InvalidArgumentError(ctx + "unknown dtype " + Quote(dtype_name));
  t.dtype = *dtype;

  const auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array())
    return absl::InvalidArgumentError(ctx + "missing or non-array \"shape\"");
  uint64_t numel = 1;
  for (const json& d : *sh) {
    const std::optional<uint64_t> v = NonNegativeInt(d);
    if (!v || *v > static_cast<uint64_t>(INT64_MAX))
      return absl::InvalidArgumentError(ctx + "shape entry " + Brief(d) +
                                        " is not a non-negative integer");
    t.shape.push_back(static_cast<int64_t>(*v));
    // Checked: a product past 2^63 could otherwise wrap to a small, "valid" size.
    if (__builtin_mul_overflow(numel, *v, &numel) || numel > static_cast<uint64_t>(INT64_MAX))
      return absl::InvalidArgumentError(ctx + "shape " + ShapeText(t.shape) +
                                        "... overflows int64 elements");
  }
  t.numel = static_cast<int64_t>(numel);
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(t.dtype)), &nbytes))
    return absl::InvalidArgumentError(ctx + "byte size of shape " + ShapeText(t.shape) +
                                      " overflows");

  const auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2)
    return absl::InvalidArgumentError(ctx + "\"data_offsets\" is not an array of two integers");
  const std::optional<uint64_t> b = NonNegativeInt((*off)[0]);
  const std::optional<uint64_t> e = NonNegativeInt((*off)[1]);
  if (!b || !e)
    return absl::InvalidArgumentError(ctx + "data_offsets [" + Brief((*off)[0]) + ", " +
                                      Brief((*off)[1]) + "] are not non-negative integers");
  const std::string offs = absl::StrCat("[", *b, ", ", *e, "]");
  if (*b > *e) return absl::InvalidArgumentError(ctx + "data_offsets " + offs + " begin after end");
  if (*e - *b != nbytes)
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, "data_offsets ", offs, " span ", *e - *b, " bytes but ", dtype_name, " ",
        ShapeText(t.shape), " needs ", nbytes));
  if (*e > data_bytes)
    return absl::DataLossError(absl::StrCat(ctx, "data_offsets ", offs,
                                            " run past the end of the data section (", data_bytes,
                                            " bytes): file truncated?"));
  t.begin = *b;
  t.end = *e;
  return t;
}

absl::StatusOr<Header> ParseHeaderImpl(const uint8_t* bytes, uint64_t size, uint64_t file_size,
                                       const std::string& path) {
  if (file_size < 8 || size < 8)
    return absl::DataLossError(absl::StrCat(path, ": file is ", file_size,
                                            " bytes, too short for a safetensors header"));
  const uint64_t hlen = LoadLe64(bytes);
  if (hlen > kMaxHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", hlen,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  if (hlen > file_size - 8)
    return absl::DataLossError(absl::StrCat(path, ": header length ", hlen,
                                            " runs past the end of the file (", file_size,
                                            " bytes): truncated or not safetensors"));
  if (hlen > size - 8)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": only ", size, " of the header's ", 8 + hlen, " bytes were given"));

  json root;
  try {
    root = json::parse(bytes + 8, bytes + 8 + hlen);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!root.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is JSON but not an object"));

  Header h;
  h.data_start = 8 + hlen;
  const uint64_t data_bytes = file_size - h.data_start;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ is not an object"));
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": __metadata__ value of ", Quote(k), " is not a string"));
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorInfo> t = ParseTensor(name, value, data_bytes, path);
    if (!t.ok()) return t.status();
    h.tensors.push_back(*std::move(t));
  }
  // json objects iterate in key order already; sorting keeps Find's binary search honest.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return h;
}

}  // namespace

const char* DTypeName(DType d) {
  for (const DTypeRow& r : kDTypes)
    if (r.dtype == d) return r.name;
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (name == r.name) return r.dtype;
  return std::nullopt;
}

int64_t DTypeSize(DType d) {
  for (const DTypeRow& r : kDTypes)
    if (r.dtype == d) return r.size;
  return 1;
}

const TensorInfo* Header::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

absl::StatusOr<Header> ParseHeader(const uint8_t* bytes, uint64_t size, uint64_t file_size,
                                   std::string_view path_view) {
  const std::string path(path_view);
  // Nothing may escape: nlohmann throws type errors and bad_alloc on hostile input.
  try {
    return ParseHeaderImpl(bytes, size, file_size, path);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": out of memory parsing the header"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed header: ", e.what()));
  }
}

// ---- SafetensorsFile ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO in place of a checkpoint must fail the S_ISREG check, not hang open().
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat(path, ": fstat"));
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": file is ", size, " bytes, too short for a safetensors header"));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) return ErrnoStatus(map_err, absl::StrCat(path, ": mmap"));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->data_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  absl::StatusOr<Header> h = ParseHeader(f->data_, size, size, path);
  if (!h.ok()) return h.status();  // ~SafetensorsFile unmaps
  f->header_ = *std::move(h);
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromMemory(const uint8_t* data,
                                                                             uint64_t size,
                                                                             std::string path) {
  absl::StatusOr<Header> h = ParseHeader(data, size, size, path);
  if (!h.ok()) return h.status();
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(path);
  f->data_ = data;
  f->size_ = size;
  f->header_ = *std::move(h);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<const TensorInfo*> SafetensorsFile::Find(std::string_view tensor) const {
  const TensorInfo* t = header_.Find(tensor);
  if (t == nullptr) {
    // Name what is there (a few of them): a user who mistyped --tensor sees the right spelling.
    constexpr size_t kListed = 8;
    std::vector<std::string> names;
    for (size_t i = 0; i < header_.tensors.size() && i < kListed; ++i)
      names.push_back(Quote(header_.tensors[i].name));
    if (header_.tensors.size() > kListed) names.push_back("...");
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", Quote(tensor, "\""), " (",
                                            header_.tensors.size(), " tensors",
                                            names.empty() ? "" : ": ", absl::StrJoin(names, ", "),
                                            ")"));
  }
  return t;
}

absl::StatusOr<std::pair<const uint8_t*, uint64_t>> SafetensorsFile::Bytes(
    std::string_view tensor) const {
  absl::StatusOr<const TensorInfo*> t = Find(tensor);
  if (!t.ok()) return t.status();
  return std::make_pair(data_ + header_.data_start + (*t)->begin, (*t)->nbytes());
}

absl::Status SafetensorsFile::CheckRowRange(const TensorInfo& t, int64_t r0, int64_t n,
                                            uint64_t* row_bytes) const {
  if (t.shape.empty())
    return absl::InvalidArgumentError(TensorCtx(path_, t.name) + "is a scalar, it has no rows");
  const int64_t rows = t.shape[0];
  if (r0 < 0 || n < 0 || r0 > rows || n > rows - r0)
    return absl::InvalidArgumentError(absl::StrCat(TensorCtx(path_, t.name), "rows [", r0, ", ",
                                                   r0, "+", n, ") outside [0, ", rows, ")"));
  *row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<uint64_t>(rows);
  return absl::OkStatus();
}

void SafetensorsFile::Advise(const TensorInfo& t, int64_t r0, int64_t n, int advice) const {
  if (!mapped_ || n <= 0) return;
  const uint64_t row_bytes = t.nbytes() / static_cast<uint64_t>(t.shape[0]);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = header_.data_start + t.begin + static_cast<uint64_t>(r0) * row_bytes;
  const uint64_t end = begin + static_cast<uint64_t>(n) * row_bytes;
  uint64_t a = begin / page * page, b = (end + page - 1) / page * page;
  if (advice == MADV_DONTNEED) {
    // Only pages wholly inside the range: a neighbour may still be in use.
    a = (begin + page - 1) / page * page;
    b = end / page * page;
  }
  b = std::min(b, (size_ + page - 1) / page * page);
  if (b > a) ::madvise(const_cast<uint8_t*>(data_) + a, b - a, advice);
}

absl::Status SafetensorsFile::ReadRows(std::string_view tensor, int64_t r0, int64_t n, void* dst,
                                       uint64_t dst_bytes) const {
  absl::StatusOr<const TensorInfo*> ti = Find(tensor);
  if (!ti.ok()) return ti.status();
  const TensorInfo& t = **ti;
  uint64_t row_bytes = 0;
  if (absl::Status s = CheckRowRange(t, r0, n, &row_bytes); !s.ok()) return s;
  const uint64_t bytes = row_bytes * static_cast<uint64_t>(n);  // <= nbytes: no overflow
  if (dst_bytes < bytes)
    return absl::InvalidArgumentError(absl::StrCat(TensorCtx(path_, t.name), "destination holds ",
                                                   dst_bytes, " bytes, ", n, " rows need ", bytes));
  if (bytes == 0) return absl::OkStatus();
  Advise(t, r0, n, MADV_WILLNEED);
  std::memcpy(dst, data_ + header_.data_start + t.begin + static_cast<uint64_t>(r0) * row_bytes,
              bytes);
  return absl::OkStatus();
}

absl::Status SafetensorsFile::ReadAll(std::string_view tensor, void* dst,
                                      uint64_t dst_bytes) const {
  absl::StatusOr<std::pair<const uint8_t*, uint64_t>> b = Bytes(tensor);
  if (!b.ok()) return b.status();
  if (dst_bytes != b->second)
    return absl::InvalidArgumentError(absl::StrCat(TensorCtx(path_, tensor), "holds ", b->second,
                                                   " bytes, the destination ", dst_bytes));
  if (b->second > 0) std::memcpy(dst, b->first, b->second);
  return absl::OkStatus();
}

void SafetensorsFile::ReleaseRows(const TensorInfo& t, int64_t r0, int64_t n) const {
  uint64_t row_bytes = 0;
  if (!CheckRowRange(t, r0, n, &row_bytes).ok() || row_bytes == 0) return;
  Advise(t, r0, n, MADV_DONTNEED);
}

}  // namespace drafthead::st
