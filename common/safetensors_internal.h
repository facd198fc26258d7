// Helpers shared by the safetensors reader, checkpoint and writer (common/safetensors*.cc) only.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace drafthead::st::internal {

// Names come from untrusted files: quote them escaped and bounded.
inline std::string Quote(std::string_view s, const char* quote = "'") {
  constexpr size_t kMax = 200;
  const std::string_view head = s.substr(0, kMax);
  std::string out = absl::StrCat(quote, absl::CHexEscape(absl::string_view(head.data(), head.size())), quote);
  if (s.size() > kMax) absl::StrAppend(&out, "...");
  return out;
}

// `msg: strerror(err)` with the code a caller can act on.
inline absl::Status ErrnoStatus(int err, std::string msg) {
  absl::StrAppend(&msg, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT || err == ENOMEM) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace drafthead::st::internal
