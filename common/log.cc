#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace drafthead {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}
}  // namespace

void SetLogRank(int rank) { g_rank = rank; }
void SetLogLevel(LogLevel min_level) { g_level = static_cast<int>(min_level); }

std::string LogValue(std::string_view v) {
  if (!v.empty() && v.find_first_of(" \"=\t\n") == std::string_view::npos) return std::string(v);
  std::string q = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') q.push_back('\\');
    if (c == '\n') {
      q += "\\n";
      continue;
    }
    q.push_back(c);
  }
  q.push_back('"');
  return q;
}

void LogLine(LogLevel level, std::string_view event, const std::string& fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  std::string line = absl::StrCat("ts=", ts, ".", absl::Dec(ms, absl::kZeroPad3), "Z level=",
                                  LevelName(level));
  const int rank = g_rank.load();
  if (rank >= 0) absl::StrAppend(&line, " rank=", rank);
  absl::StrAppend(&line, " event=", std::string(event), fields, "\n");
  ssize_t unused = ::write(2, line.data(), line.size());
  (void)unused;
}

}  // namespace drafthead
