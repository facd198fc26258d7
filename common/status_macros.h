// Status helpers: one check macro per library, each returning an absl::Status that carries the
// failing statement, file:line and (where known) the rank. No exceptions cross these.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define DH_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status dh_status_ = (expr);      \
    if (!dh_status_.ok()) return dh_status_; \
  } while (0)

#define DH_CONCAT_INNER(a, b) a##b
#define DH_CONCAT(a, b) DH_CONCAT_INNER(a, b)
#define DH_ASSIGN_OR_RETURN(lhs, expr) DH_ASSIGN_OR_RETURN_IMPL(DH_CONCAT(dh_or_, __LINE__), lhs, expr)
#define DH_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

namespace drafthead {

// "what failed (file:line, rank R): detail"
inline std::string FailureSite(const char* stmt, const char* file, int line, int rank) {
  if (rank >= 0) return absl::StrCat(stmt, " (", file, ":", line, ", rank ", rank, ")");
  return absl::StrCat(stmt, " (", file, ":", line, ")");
}

}  // namespace drafthead
