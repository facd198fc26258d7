#include "common/command_line.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/version.h"

namespace drafthead {
namespace {

TEST(FlagNameToUnderscores, RewritesOnlyTheNamePart) {
  EXPECT_EQ(FlagNameToUnderscores("--hidden-size=5120"), "--hidden_size=5120");
  EXPECT_EQ(FlagNameToUnderscores("--no-probe"), "--no_probe");
  EXPECT_EQ(FlagNameToUnderscores("-tls-ca=a-b.pem"), "-tls_ca=a-b.pem");
  EXPECT_EQ(FlagNameToUnderscores("--rows=-3:-1"), "--rows=-3:-1");
  EXPECT_EQ(FlagNameToUnderscores("--leader=my-host:29500"), "--leader=my-host:29500");
}

TEST(FlagNameToUnderscores, LeavesNonFlagsAlone) {
  for (const char* a : {"", "-", "--", "info", "file-name.safetensors", "-c", "-1"})
    EXPECT_EQ(FlagNameToUnderscores(a), a);
}

TEST(NormalizeFlagNames, KeepsTheProgramAndStopsAtABareDoubleDash) {
  std::vector<std::string> in = {"/bin/drafthead-server", "--max-rows=8", "info", "--", "--max-top-k=3"};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  std::vector<std::string> storage;
  const std::vector<char*> out = NormalizeFlagNames(static_cast<int>(argv.size()), argv.data(), storage);
  ASSERT_EQ(out.size(), in.size() + 1);
  EXPECT_EQ(out.back(), nullptr);
  EXPECT_STREQ(out[0], "/bin/drafthead-server");
  EXPECT_STREQ(out[1], "--max_rows=8");
  EXPECT_STREQ(out[2], "info");
  EXPECT_STREQ(out[3], "--");
  EXPECT_STREQ(out[4], "--max-top-k=3");
  EXPECT_EQ(in[1], "--max-rows=8") << "the caller's argv is not modified";
}

TEST(Version, ComesFromTheCMakeProject) {
  const std::string v = kVersion;
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2) << v;
}

}  // namespace
}  // namespace drafthead
