// Reports of a load test: text summary, JSON (schema in docs/client.md), CSV (one line per
// request) and a self-contained HTML page with inline SVG plots.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "client/load_tester.h"
#include "drafthead/v1/drafthead.pb.h"
#include "nlohmann/json.hpp"

namespace drafthead::client {

inline constexpr int kLoadReportSchemaVersion = 1;

struct LoadReport {
  nlohmann::ordered_json config = nlohmann::ordered_json::object();  // the settings, as run
  std::optional<v1::ModelInfo> server;                               // GetModelInfo, when it answered
  std::vector<LoadResult> runs;                                      // one; one per point of a sweep
  bool sweep = false;
  std::string started_at;                                            // UTC, RFC 3339
};

// "OK", "CANCELLED", ... "UNAUTHENTICATED"; "CODE_<n>" outside 0..16.
std::string StatusCodeName(int code);

std::string FormatText(const LoadReport& report);
nlohmann::ordered_json ToJson(const LoadReport& report);
// Header line, then one line per request of every run (LoadOptions::record_requests).
std::string ToCsv(const LoadReport& report);
std::string ToHtml(const LoadReport& report);

}  // namespace drafthead::client
