// Command-line plumbing every drafthead program shares: the dash spelling of flag names, and
// absl's --help and --version texts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace drafthead {

// The command-line contract spells flag names with dashes (--hidden-size); absl flags are C++
// identifiers and absl::ParseCommandLine does not map '-' to '_'. Returns `arg` with every '-' of
// its name part turned into '_': the part after the leading "-" or "--" and before the first '='
// (values are never touched: --rows=-3:-1 stays). Anything that is not a flag ("x", "-", "--")
// comes back unchanged.
std::string FlagNameToUnderscores(std::string_view arg);

// FlagNameToUnderscores over argv[1..argc), stopping at a bare "--" (what follows is positional
// and left as it is). `storage` owns the strings; the result (argc pointers into it, then a
// nullptr) is valid as long as `storage` is neither changed nor destroyed.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage);

// Sets absl's --help usage text and its --version answer ("PROGRAM VERSION", the CMake project
// version). Call before absl::ParseCommandLine.
void SetProgramInfo(std::string_view program, std::string_view usage);

}  // namespace drafthead
