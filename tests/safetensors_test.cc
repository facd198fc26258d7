// The safetensors reader against files built by an independent writer (st_test_util.h), the
// checkpoint layouts, every malformed-header case, and the streaming writer.
#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "st_test_util.h"

namespace drafthead::st {
namespace {

using testutil::Bytes;
using testutil::PatternBf16;
using testutil::RawTensor;
using testutil::TempDir;

TEST(SafetensorsTest, ReadsRowsExactly) {
  TempDir dir;
  const int64_t rows = 10, k = 64;
  const std::vector<uint16_t> w = PatternBf16(rows, k);
  const std::vector<float> bias = {1.5f, -2.0f, 3.25f};
  const std::string path = dir.File("m.safetensors");
  testutil::WriteFile(path, testutil::BuildFile({{"bias", "F32", {3}, Bytes(bias)},
                                                 {"lm_head.weight", "BF16", {rows, k}, Bytes(w)}},
                                                "\"format\":\"pt\""));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  auto t = (*f)->Find("lm_head.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->dtype, DType::kBF16);
  EXPECT_EQ((*t)->shape, (std::vector<int64_t>{rows, k}));
  EXPECT_EQ((*t)->begin, 12u);  // after the 3 floats

  std::vector<uint16_t> got(4 * k, 0xffff);
  ASSERT_TRUE((*f)->ReadRows("lm_head.weight", 3, 4, got.data(), got.size() * 2).ok());
  EXPECT_EQ(got, std::vector<uint16_t>(w.begin() + 3 * k, w.begin() + 7 * k));
  std::vector<float> b(3);
  ASSERT_TRUE((*f)->ReadAll("bias", b.data(), 12).ok());
  EXPECT_EQ(b, bias);

  // Out of range, short destination, scalar rows, missing tensor.
  EXPECT_EQ((*f)->ReadRows("lm_head.weight", 8, 3, got.data(), got.size() * 2).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->ReadRows("lm_head.weight", 0, 4, got.data(), 10).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status missing = (*f)->ReadRows("nope", 0, 1, got.data(), got.size() * 2);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(path), std::string::npos);
  EXPECT_NE(missing.message().find("nope"), std::string::npos);
}

TEST(SafetensorsTest, ParsesEveryDtype) {
  const std::vector<std::pair<std::string, int>> dtypes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2},
      {"F16", 2},  {"BF16", 2}, {"U32", 4}, {"I32", 4},    {"F32", 4},     {"U64", 8}, {"I64", 8},
      {"F64", 8}};
  std::vector<RawTensor> ts;
  for (const auto& [name, size] : dtypes)
    ts.push_back({"t_" + name, name, {2, 3}, std::string(6 * size, '\x01')});
  const std::string bytes = testutil::BuildFile(ts);
  auto f = SafetensorsFile::FromMemory(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                       "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  for (const auto& [name, size] : dtypes) {
    auto t = (*f)->Find("t_" + name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(DTypeName((*t)->dtype), name);
    EXPECT_EQ(DTypeSize((*t)->dtype), size);
    EXPECT_EQ((*t)->nbytes(), 6u * size);
  }
}

TEST(SafetensorsTest, ShardedDirectoryViaIndex) {
  TempDir dir;
  const int64_t rows = 6, k = 32;
  const std::vector<uint16_t> w = PatternBf16(rows, k);
  testutil::WriteFile(dir.File("model-00001-of-00002.safetensors"),
                      testutil::BuildFile({{"embed", "BF16", {2, k}, Bytes(PatternBf16(2, k))}}));
  testutil::WriteFile(dir.File("model-00002-of-00002.safetensors"),
                      testutil::BuildFile({{"norm", "F32", {1}, std::string(4, '\0')},
                                           {"lm_head.weight", "BF16", {rows, k}, Bytes(w)}}));
  testutil::WriteFile(dir.File("model.safetensors.index.json"),
                      R"({"metadata":{"total_size":1},"weight_map":{
                           "embed":"model-00001-of-00002.safetensors",
                           "norm":"model-00002-of-00002.safetensors",
                           "lm_head.weight":"model-00002-of-00002.safetensors"}})");
  auto c = Checkpoint::Open(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  auto f = (*c)->File("lm_head.weight");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), dir.File("model-00002-of-00002.safetensors"));
  std::vector<uint16_t> got(2 * k);
  ASSERT_TRUE((*c)->ReadRows("lm_head.weight", 4, 2, got.data(), got.size() * 2).ok());
  EXPECT_EQ(got, std::vector<uint16_t>(w.begin() + 4 * k, w.end()));
  auto e = (*c)->Info("embed");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->shape[0], 2);
  absl::StatusOr<const TensorInfo*> absent = (*c)->Info("missing.weight");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("missing.weight"), std::string::npos);
}

TEST(SafetensorsTest, IndexRejectsNamesOutsideTheDirectory) {
  for (const std::string bad : {"../model.safetensors", "/etc/passwd", "sub/x.safetensors", ".."}) {
    TempDir dir;
    testutil::WriteFile(dir.File("model.safetensors.index.json"),
                        R"({"weight_map":{"lm_head.weight":")" + bad + R"("}})");
    auto c = Checkpoint::Open(dir.path());
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("lm_head.weight"), std::string::npos) << c.status();
  }
  TempDir dir;
  testutil::WriteFile(dir.File("model.safetensors.index.json"), "{not json");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, DirectoryWithoutIndexNeedsExactlyOneFile) {
  TempDir dir;
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kNotFound);
  const std::vector<uint16_t> w = PatternBf16(2, 32);
  testutil::WriteFile(dir.File("a.safetensors"),
                      testutil::BuildFile({{"lm_head.weight", "BF16", {2, 32}, Bytes(w)}}));
  auto one = Checkpoint::Open(dir.path());
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE((*one)->Info("lm_head.weight").ok());
  testutil::WriteFile(dir.File("b.safetensors"),
                      testutil::BuildFile({{"x", "U8", {1}, "a"}}));
  auto two = Checkpoint::Open(dir.path());
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("b.safetensors"), std::string::npos);
  EXPECT_EQ(Checkpoint::Open(dir.File("nothing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, OverlappingAndOutOfOrderOffsetsWithinBoundsAreRead) {
  // Two tensors sharing bytes, the second listed before the first: allowed while in bounds.
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
      R"("a":{"dtype":"U8","shape":[3],"data_offsets":[1,4]}})";
  const std::string bytes = testutil::Pack(header, "wxyz");
  auto f = SafetensorsFile::FromMemory(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                       "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  std::string a(3, '\0'), b(2, '\0');
  ASSERT_TRUE((*f)->ReadAll("a", a.data(), 3).ok());
  ASSERT_TRUE((*f)->ReadAll("b", b.data(), 2).ok());
  EXPECT_EQ(a, "xyz");
  EXPECT_EQ(b, "yz");
}

// Every malformed header: a non-OK status naming the file (and the tensor where there is one).
struct BadCase {
  std::string what;
  std::string bytes;
  absl::StatusCode code;
};

std::vector<BadCase> BadCases() {
  const std::string ok_data(64 * 2, '\0');
  auto one = [](const std::string& entry) { return "{\"lm_head.weight\":" + entry + "}"; };
  std::vector<BadCase> v;
  v.push_back({"shorter than 8 bytes", "abc", absl::StatusCode::kDataLoss});
  {
    std::string b = testutil::Pack("{}", "");
    b[0] = 100;  // header length 100 > file
    v.push_back({"header length past EOF", b, absl::StatusCode::kDataLoss});
  }
  {
    std::string b = testutil::Pack("{}", "");
    b[5] = 1;  // 2^40
    v.push_back({"huge header length", b, absl::StatusCode::kInvalidArgument});
  }
  v.push_back({"bad JSON", testutil::Pack("{\"lm_head.weight\": {", ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"JSON not an object", testutil::Pack("[1, 2, 3]", ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"unknown dtype",
               testutil::Pack(one(R"({"dtype":"Q4","shape":[2,32],"data_offsets":[0,128]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"negative shape",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[-2,32],"data_offsets":[0,128]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"fractional shape",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[2.5,32],"data_offsets":[0,128]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"shape overflow",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[4611686018427387904,)"
                                  R"(4611686018427387904],"data_offsets":[0,128]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"byte size overflow",
               testutil::Pack(one(R"({"dtype":"F64","shape":[4611686018427387904],)"
                                  R"("data_offsets":[0,0]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"offsets past EOF",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[2,32],"data_offsets":[128,256]})"),
                              ok_data),
               absl::StatusCode::kDataLoss});
  v.push_back({"offsets not matching shape",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[2,32],"data_offsets":[0,100]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"offsets reversed",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[0],"data_offsets":[8,0]})"),
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"offsets missing",
               testutil::Pack(one(R"({"dtype":"BF16","shape":[2,32]})"), ok_data),
               absl::StatusCode::kInvalidArgument});
  v.push_back({"metadata not strings",
               testutil::Pack(R"({"__metadata__":{"a":1},"lm_head.weight":)"
                              R"({"dtype":"BF16","shape":[2,32],"data_offsets":[0,128]}})",
                              ok_data),
               absl::StatusCode::kInvalidArgument});
  {
    std::string b = testutil::Pack(
        one(R"({"dtype":"BF16","shape":[2,32],"data_offsets":[0,128]})"), ok_data);
    b.resize(b.size() - 1);
    v.push_back({"truncated data", b, absl::StatusCode::kDataLoss});
  }
  return v;
}

TEST(SafetensorsTest, MalformedFilesGiveErrorsNamingFileAndTensor) {
  TempDir dir;
  for (const BadCase& c : BadCases()) {
    const std::string path = dir.File("bad.safetensors");
    testutil::WriteFile(path, c.bytes);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_EQ(f.status().code(), c.code) << c.what << ": " << f.status();
    EXPECT_NE(f.status().message().find(path), std::string::npos) << c.what << ": " << f.status();
    // Through the checkpoint the tensor being looked for is named too.
    auto ck = Checkpoint::Open(path);
    ASSERT_TRUE(ck.ok());
    auto info = (*ck)->Info("lm_head.weight");
    ASSERT_FALSE(info.ok()) << c.what;
    EXPECT_NE(info.status().message().find(path), std::string::npos) << info.status();
    EXPECT_NE(info.status().message().find("lm_head.weight"), std::string::npos) << info.status();
    // The in-memory parser agrees.
    auto h = ParseHeader(reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size(),
                         c.bytes.size(), "mem");
    EXPECT_EQ(h.status().code(), c.code) << c.what;
  }
}

TEST(SafetensorsTest, WriterOutputIsAlignedAndReadableIndependently) {
  TempDir dir;
  const std::vector<uint16_t> w = PatternBf16(5, 32);
  const std::vector<uint8_t> e = {1, 2, 3};
  const std::string path = dir.File("out.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{{"w", DType::kBF16, {5, 32}}, w.data(), w.size() * 2},
                                {{"e", DType::kU8, {3}}, e.data(), e.size()}},
                               {{"tp", "4"}})
                  .ok());
  const std::string bytes = testutil::ReadFile(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(hlen % 8, 0u);  // data section 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + hlen + w.size() * 2 + e.size());
  // Data streamed in order, verbatim.
  EXPECT_EQ(bytes.substr(8 + hlen), Bytes(w) + Bytes(e));
  const std::string header = bytes.substr(8, hlen);
  EXPECT_NE(header.find(R"("w":{"data_offsets":[0,320],"dtype":"BF16","shape":[5,32]})"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("__metadata__":{"tp":"4"})"), std::string::npos) << header;
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("tp"), "4");
  // No temp file left behind.
  int files = 0;
  for (const auto& ent : std::filesystem::directory_iterator(dir.path())) files += ent.exists();
  EXPECT_EQ(files, 1);
}

TEST(SafetensorsTest, WriterReportsErrors) {
  TempDir dir;
  const std::vector<uint8_t> e = {1, 2, 3};
  // Wrong byte count for the shape.
  EXPECT_FALSE(WriteSafetensors(dir.File("a"), {{{"e", DType::kU8, {4}}, e.data(), 3}}).ok());
  // Unwritable destination.
  absl::Status s =
      WriteSafetensors(dir.File("no/such/dir/x"), {{{"e", DType::kU8, {3}}, e.data(), 3}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos) << s;
  // Duplicate names, and too few bytes at Finish (then no file appears).
  EXPECT_FALSE(WriteSafetensors(dir.File("b"), {{{"e", DType::kU8, {3}}, e.data(), 3},
                                                {{"e", DType::kU8, {3}}, e.data(), 3}})
                   .ok());
  {
    auto w = SafetensorsWriter::Create(dir.File("c"), {{"e", DType::kU8, {3}}}, {});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(e.data(), 2).ok());
    EXPECT_FALSE((*w)->Append(e.data(), 2).ok());  // past the end
    EXPECT_FALSE((*w)->Finish().ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("c")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// The client's use (drafthead-client logits): small BF16 / I32 / F32 (scalar too) tensors with
// metadata written and read back; a mistyped tensor name answered with the names present.
TEST(SafetensorsTest, ClientRoundTripOfLogitsDtypes) {
  TempDir dir;
  std::string bf16(2 * 3 * 4, '\0');
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<char>(i * 7);
  const std::string i32(4 * 3 * 2, '\x01');
  const std::string scalar = "abcd";
  const std::string path = dir.File("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{{"hidden", DType::kBF16, {3, 4}}, bf16.data(), bf16.size()},
                                {{"ids", DType::kI32, {3, 2}}, i32.data(), i32.size()},
                                {{"scalar", DType::kF32, {}}, scalar.data(), scalar.size()}},
                               {{"who", "test"}})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->header().tensors.size(), 3u);
  EXPECT_EQ((*f)->metadata().at("who"), "test");
  auto h = (*f)->Find("hidden");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->dtype, DType::kBF16);
  EXPECT_EQ((*h)->shape, (std::vector<int64_t>{3, 4}));
  auto bytes = [&](const char* name) {
    auto b = (*f)->Bytes(name);
    return b.ok() ? std::string(reinterpret_cast<const char*>(b->first), b->second) : "";
  };
  EXPECT_EQ(bytes("hidden"), bf16);
  EXPECT_EQ(bytes("ids"), i32);
  EXPECT_EQ(bytes("scalar"), scalar);
  EXPECT_EQ((*(*f)->Find("scalar"))->numel, 1);
  auto missing = (*f)->Find("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("hidden"), std::string::npos) << missing.status();

  // A reserved name, an unknown dtype name, a missing file.
  EXPECT_FALSE(WriteSafetensors(dir.File("m"), {{{"__metadata__", DType::kU8, {1}}, "a", 1}}).ok());
  EXPECT_FALSE(ParseDType("Q7").has_value());
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent/x.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace drafthead::st
