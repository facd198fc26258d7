#include "common/command_line.h"

#include <algorithm>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"

namespace drafthead {

std::string FlagNameToUnderscores(std::string_view arg) {
  std::string out(arg);
  if (out.size() < 2 || out[0] != '-' || out == "--") return out;
  const size_t begin = out[1] == '-' ? 2 : 1;
  const size_t end = std::min(out.find('='), out.size());
  for (size_t i = begin; i < end; ++i)
    if (out[i] == '-') out[i] = '_';
  return out;
}

std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (size_t i = 1; i < storage.size() && storage[i] != "--"; ++i)
    storage[i] = FlagNameToUnderscores(storage[i]);
  std::vector<char*> out;
  out.reserve(storage.size() + 1);
  for (std::string& s : storage) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void SetProgramInfo(std::string_view program, std::string_view usage) {
  absl::SetProgramUsageMessage(absl::string_view(usage.data(), usage.size()));
  absl::FlagsUsageConfig config;
  config.version_string = [name = std::string(program)] { return absl::StrCat(name, " ", kVersion, "\n"); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace drafthead
