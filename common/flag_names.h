// The command-line contract spells flags with dashes (--hidden-size); absl flags are declared
// with underscores. Rewrites "--a-b=v" to "--a_b=v" (the name part only) before parsing.
#pragma once

#include <string>
#include <vector>

namespace drafthead {

inline std::vector<char*> DashesToUnderscores(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  std::vector<char*> out;
  bool after_terminator = false;
  for (int i = 0; i < argc; ++i) {
    std::string& a = storage[i];
    if (i > 0 && !after_terminator && a == "--") after_terminator = true;
    if (i > 0 && !after_terminator && a.size() > 2 && a[0] == '-') {
      const size_t start = a[1] == '-' ? 2 : 1;
      const size_t end = std::min(a.find('='), a.size());
      for (size_t j = start; j < end; ++j)
        if (a[j] == '-') a[j] = '_';
    }
  }
  for (auto& s : storage) out.push_back(s.data());
  return out;
}

}  // namespace drafthead
