// Small helpers shared by the client's command-line programs.
#pragma once

#include <cstring>
#include <string>
#include <vector>

namespace drafthead::client {

// The CLI contract spells flags with dashes (--hidden-size, --tls-ca) but ABSL_FLAG names are C++
// identifiers and absl::ParseCommandLine does not map '-' to '_'. Rewrites "--a-b[=v]" to
// "--a_b[=v]" (the name part only) in place of argv, up to a bare "--". `storage` keeps the
// rewritten strings alive as long as argv is used.
inline void NormalizeFlagDashes(int argc, char** argv, std::vector<std::string>& storage) {
  storage.reserve(argc);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--") == 0) break;
    if (a[0] != '-' || a[1] == '\0') continue;
    const char* name = a + (a[1] == '-' ? 2 : 1);
    const char* end = std::strchr(name, '=');
    const size_t n = end ? static_cast<size_t>(end - name) : std::strlen(name);
    if (std::memchr(name, '-', n) == nullptr) continue;
    std::string s(a);
    const size_t off = static_cast<size_t>(name - a);
    for (size_t j = off; j < off + n; ++j) {
      if (s[j] == '-') s[j] = '_';
    }
    storage.push_back(std::move(s));
    argv[i] = storage.back().data();
  }
}

}  // namespace drafthead::client
