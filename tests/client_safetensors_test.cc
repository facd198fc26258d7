// client/safetensors_io: round trip, and malformed files refused with a message naming the problem.
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "client/safetensors_io.h"

namespace drafthead::client {
namespace {

std::string WithHeader(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

TEST(Safetensors, RoundTrip) {
  std::string bf16(2 * 3 * 4, '\0');
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<char>(i * 7);
  std::string i32(4 * 3 * 2, '\x01');
  std::vector<SafetensorsTensor> in = {{"hidden", "BF16", {3, 4}, bf16}, {"ids", "I32", {3, 2}, i32}, {"scalar", "F32", {}, "abcd"}};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(in, {{"who", "test"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t hl;
  std::memcpy(&hl, bytes->data(), 8);
  EXPECT_EQ(hl % 8, 0u);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Parse(*bytes, "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), 3u);
  auto h = f->Find("hidden");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->dtype, "BF16");
  EXPECT_EQ((*h)->shape, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ((*h)->data, bf16);
  EXPECT_EQ((*f->Find("ids"))->data, i32);
  EXPECT_EQ((*f->Find("scalar"))->data, "abcd");
  EXPECT_EQ(f->metadata().at("who"), "test");
  auto missing = f->Find("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("hidden"), std::string::npos);  // lists what is there

  const std::string path = ::testing::TempDir() + "/rt.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, in).ok());
  absl::StatusOr<SafetensorsFile> g = SafetensorsFile::Read(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g->Find("hidden"))->data, bf16);
}

TEST(Safetensors, WriterRefusesInconsistentTensors) {
  EXPECT_FALSE(SerializeSafetensors({{"x", "BF16", {2, 2}, "abc"}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", "Q7", {1}, "a"}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", "U8", {1}, "a"}, {"x", "U8", {1}, "b"}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"__metadata__", "U8", {1}, "a"}}).ok());
}

void ExpectBad(const std::string& bytes, const std::string& needle) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Parse(bytes, "bad.safetensors");
  ASSERT_FALSE(f.ok()) << "accepted: expected an error mentioning \"" << needle << "\"";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("bad.safetensors"), std::string::npos) << f.status();
}

TEST(Safetensors, MalformedInputs) {
  ExpectBad("", "no header length");
  ExpectBad(std::string("\x10\0\0\0\0\0\0\0{}", 10), "exceeds the file");
  ExpectBad(std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8), "exceeds the file");
  ExpectBad(WithHeader("{not json", ""), "not valid JSON");
  ExpectBad(WithHeader("[1,2]", ""), "not a JSON object");
  ExpectBad(WithHeader(R"({"x": 3})", ""), "not an object");
  ExpectBad(WithHeader(R"({"x": {"shape": [1], "data_offsets": [0, 2]}})", "ab"), "dtype");
  ExpectBad(WithHeader(R"({"x": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 2]}})", "ab"), "unknown dtype");
  ExpectBad(WithHeader(R"({"x": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}})", "ab"), "non-negative");
  ExpectBad(WithHeader(R"({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 2]}})", "ab"), "span");
  ExpectBad(WithHeader(R"({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})", "ab"), "truncated");
  ExpectBad(WithHeader(R"({"x": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}})", "ab"), "reversed");
  ExpectBad(WithHeader(R"({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0]}})", "ab"), "data_offsets");
  ExpectBad(WithHeader(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                           "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})", "abc"), "overlap");
  ExpectBad(WithHeader(R"({"x": {"dtype": "U8", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 2]}})", "ab"),
            "overflows");
  ExpectBad(WithHeader(R"({"__metadata__": {"k": 1}})", ""), "__metadata__");
  // A missing file is NOT_FOUND, not a crash.
  EXPECT_EQ(SafetensorsFile::Read("/nonexistent/x.safetensors").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace drafthead::client
