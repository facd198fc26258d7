// Structured logs: one line per event on stderr, logfmt style, rank-tagged:
//   ts=2026-12-02T16:40:01.123Z level=info rank=0 event=shard_loaded bytes=165478400 ms=812
// Thread-safe (each line is written with one write(2)).
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace drafthead {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void SetLogRank(int rank);
void SetLogLevel(LogLevel min_level);
void LogLine(LogLevel level, std::string_view event, const std::string& fields);

// Quotes a value when it holds spaces, quotes or '='.
std::string LogValue(std::string_view v);

namespace log_internal {
inline void AppendFields(std::string*) {}
template <typename V, typename... Rest>
void AppendFields(std::string* out, std::string_view key, const V& value, const Rest&... rest) {
  if constexpr (std::is_convertible_v<V, std::string_view>) {
    absl::StrAppend(out, " ", std::string(key), "=", LogValue(std::string_view(value)));
  } else {
    absl::StrAppend(out, " ", std::string(key), "=", value);
  }
  AppendFields(out, rest...);
}
}  // namespace log_internal

// Log(LogLevel::kInfo, "shard_loaded", "bytes", n, "ms", t);
template <typename... KV>
void Log(LogLevel level, std::string_view event, const KV&... kv) {
  std::string fields;
  log_internal::AppendFields(&fields, kv...);
  LogLine(level, event, fields);
}

}  // namespace drafthead
