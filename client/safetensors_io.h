// A minimal, self-contained safetensors reader and writer for the client (hidden-state inputs and
// logits outputs). Independent of server/: the client ships without the server's code.
//
// Format: u64 little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data region; offsets are relative to the start of the data region.
//
// The reader validates everything it is given (header length, JSON, dtype, shape x element size
// against the byte range, ranges inside the data region and not overlapping) and says what is
// wrong, naming the file and the tensor: inputs are user files, never trusted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace drafthead::client {

// Size in bytes of one element of a safetensors dtype ("BF16", "F32", "I32", ...); 0 if unknown.
size_t SafetensorsDtypeSize(absl::string_view dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as in the file: "BF16", "F32", "I32", "U8", ...
  std::vector<uint64_t> shape;  // empty for a scalar
  std::string data;             // little-endian, row-major

  uint64_t elements() const;
};

class SafetensorsFile {
 public:
  // Parses a whole file image. `origin` names the source in error messages.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, absl::string_view origin = "input");
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  // The tensor called `name`, or NOT_FOUND listing the names present.
  absl::StatusOr<const SafetensorsTensor*> Find(absl::string_view name) const;
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string origin_;
  std::vector<SafetensorsTensor> tensors_;  // in data-offset order
  std::map<std::string, std::string> metadata_;
};

// Serializes tensors in the given order (the header is space-padded to a multiple of 8 bytes,
// as the reference implementation writes it). Checks shape x dtype size against each data size.
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                                 const std::map<std::string, std::string>& metadata = {});
// Writes atomically enough for a CLI: to PATH.tmp, then renamed over PATH.
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace drafthead::client
