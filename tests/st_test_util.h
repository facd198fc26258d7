// Test helpers for safetensors files: an independent, hand-rolled writer (string-built JSON, no
// nlohmann, nothing from common/safetensors.h) so the reader is not only checked against its own
// writer, plus bf16 helpers. File helpers (TempDir, ReadFile, WriteFile) are in test_util.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/numeric.h"
#include "test_util.h"

namespace drafthead::testutil {

struct RawTensor {
  std::string name;
  std::string dtype;  // as the format spells it
  std::vector<int64_t> shape;
  std::string data;   // raw little-endian bytes
};

inline std::string ShapeJson(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// The header JSON for tensors laid out back to back in order; `metadata_json` (an object body
// like "\"k\":\"v\"") is emitted as __metadata__ when non-empty.
inline std::string HeaderJson(const std::vector<RawTensor>& ts, const std::string& metadata_json = "") {
  std::string h = "{";
  bool first = true;
  if (!metadata_json.empty()) {
    h += "\"__metadata__\":{" + metadata_json + "}";
    first = false;
  }
  uint64_t off = 0;
  for (const RawTensor& t : ts) {
    if (!first) h += ",";
    first = false;
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + ShapeJson(t.shape) +
         ",\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.data.size()) +
         "]}";
    off += t.data.size();
  }
  return h + "}";
}

// 8-byte little-endian length + header + data.
inline std::string Pack(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

inline std::string BuildFile(const std::vector<RawTensor>& ts, const std::string& metadata_json = "") {
  std::string data;
  for (const RawTensor& t : ts) data += t.data;
  return Pack(HeaderJson(ts, metadata_json), data);
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// bf16 [rows, k] with a distinct, exactly representable value per element.
inline std::vector<uint16_t> PatternBf16(int64_t rows, int64_t k, float scale = 1.0f / 64) {
  std::vector<uint16_t> w(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c)
      w[r * k + c] = FloatToBf16(scale * static_cast<float>((r * 7 + c * 3) % 97 - 48) +
                                 static_cast<float>(r) * 0.5f);
  return w;
}

}  // namespace drafthead::testutil
