#include "client/safetensors_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace drafthead::client {
namespace {

// A header larger than this is not a tensor file we could have written or want to read.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

size_t SafetensorsDtypeSize(absl::string_view d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  return 0;
}

uint64_t SafetensorsTensor::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, absl::string_view origin) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a valid safetensors file: ", what));
  };
  if (bytes.size() < 8) return bad(absl::StrCat("only ", bytes.size(), " bytes, no header length"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the file (", bytes.size(), " bytes)"));
  }
  const absl::string_view header(bytes.data() + 8, header_len);
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = bytes.size() - data_begin;

  nlohmann::json j = nlohmann::json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("header is not valid JSON");
  if (!j.is_object()) return bad("header is not a JSON object");

  SafetensorsFile file;
  file.origin_ = std::string(origin);
  struct Range { uint64_t begin, end; size_t index; };
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return bad(absl::StrCat("__metadata__[\"", m.key(), "\"] is not a string"));
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tbad = [&](absl::string_view what) { return bad(absl::StrCat("tensor \"", name, "\": ", what)); };
    if (!v.is_object()) return tbad("entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return tbad("missing or non-string \"dtype\"");
    if (sh == v.end() || !sh->is_array()) return tbad("missing or non-array \"shape\"");
    if (off == v.end() || !off->is_array() || off->size() != 2) return tbad("\"data_offsets\" is not [begin, end]");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = dt->get<std::string>();
    const size_t esize = SafetensorsDtypeSize(t.dtype);
    if (esize == 0) return tbad(absl::StrCat("unknown dtype \"", t.dtype, "\""));
    uint64_t elements = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return tbad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      t.shape.push_back(dim);
      if (MulOverflows(elements, dim, &elements)) return tbad("shape overflows");
    }
    for (const auto& o : *off) {
      if (!o.is_number_unsigned()) return tbad("data_offsets must be non-negative integers");
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    uint64_t nbytes = 0;
    if (MulOverflows(elements, esize, &nbytes)) return tbad("byte size overflows");
    if (begin > end) return tbad(absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
    if (end > data_size) {
      return tbad(absl::StrCat("data_offsets end ", end, " is past the data region (", data_size,
                               " bytes): file truncated?"));
    }
    if (end - begin != nbytes) {
      return tbad(absl::StrCat("shape x ", t.dtype, " is ", nbytes, " bytes but data_offsets span ", end - begin));
    }
    t.data.assign(bytes.data() + data_begin + begin, nbytes);
    ranges.push_back({begin, end, file.tensors_.size()});
    file.tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return bad(absl::StrCat("tensors \"", file.tensors_[ranges[i - 1].index].name, "\" and \"",
                              file.tensors_[ranges[i].index].name, "\" overlap"));
    }
  }
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) ordered.push_back(std::move(file.tensors_[r.index]));
  file.tensors_ = std::move(ordered);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return Parse(std::move(ss).str(), path);
}

absl::StatusOr<const SafetensorsTensor*> SafetensorsFile::Find(absl::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  std::vector<std::string> names;
  for (const auto& t : tensors_) names.push_back(t.name);
  return absl::NotFoundError(absl::StrCat(origin_, ": no tensor \"", name, "\" (has: ",
                                          names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const size_t esize = SafetensorsDtypeSize(t.dtype);
    if (esize == 0) return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": unknown dtype ", t.dtype));
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("bad tensor name \"", t.name, "\""));
    }
    if (header.contains(t.name)) return absl::InvalidArgumentError(absl::StrCat("duplicate tensor \"", t.name, "\""));
    if (t.elements() * esize != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": shape x ", t.dtype, " is ",
                                                     t.elements() * esize, " bytes, data has ", t.data.size()));
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  std::string out;
  out.reserve(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += h;
  for (const auto& t : tensors) out += t.data;
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace drafthead::client
