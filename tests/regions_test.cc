// The region registry (server/regions): POSIX regions registered, looked up, accessed within
// bounds and unregistered; every bad input refused with its code and field; an unregister waits
// for an access in progress and nothing reaches the memory after it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "server/regions/region_registry.h"
#include "shm_test_util.h"

namespace drafthead::regions {
namespace {

using testutil::ScopedShm;

RegistryOptions SystemOn() {
  RegistryOptions o;
  o.system = true;
  return o;
}

RegionSpec Spec(const std::string& name, const ScopedShm& shm, uint64_t offset, uint64_t size) {
  RegionSpec s;
  s.name = name;
  s.kind = RegionKind::kSystem;
  s.shm_key = shm.key();
  s.offset = offset;
  s.byte_size = size;
  return s;
}

void ExpectCode(const absl::Status& s, absl::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s;
}

TEST(RegionsTest, ParsesTheFlag) {
  auto both = ParseSharedMemoryKinds("cuda,system");
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(both->system && both->cuda);
  auto none = ParseSharedMemoryKinds("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->system || none->cuda);
  ExpectCode(ParseSharedMemoryKinds("system,gpu").status(), absl::StatusCode::kInvalidArgument,
             "--shared-memory: 'gpu'");
}

TEST(RegionsTest, ReadsAndWritesInsideARegionAtAnOffset) {
  ScopedShm shm(3 * 4096);
  for (size_t i = 0; i < shm.size(); ++i) shm.data()[i] = static_cast<uint8_t>(i * 7);
  RegionRegistry reg(SystemOn());
  // An offset that is not page-aligned: the mapping starts at its page.
  ASSERT_TRUE(reg.Register(Spec("r", shm, 5000, 2000)).ok());
  auto ref = reg.Find("r", "hidden_region");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto acc = ref->Access(100, 50, "hidden_region");
  ASSERT_TRUE(acc.ok()) << acc.status();
  ASSERT_NE(acc->host_data(), nullptr);
  EXPECT_EQ(acc->host_data()[0], shm.data()[5100]);
  uint8_t buf[50];
  ASSERT_TRUE(acc->Read(0, buf, 50).ok());
  EXPECT_EQ(std::memcmp(buf, shm.data() + 5100, 50), 0);
  std::memset(buf, 0xab, sizeof(buf));
  ASSERT_TRUE(acc->Write(10, buf, 40).ok());
  EXPECT_EQ(shm.data()[5110], 0xab);
  EXPECT_EQ(shm.data()[5109], static_cast<uint8_t>(5109 * 7));
  ExpectCode(acc->Write(11, buf, 40), absl::StatusCode::kInvalidArgument, "outside");
  auto list = reg.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].spec.shm_key, shm.key());
  EXPECT_EQ((*list)[0].spec.byte_size, 2000u);
  EXPECT_EQ((*list)[0].accesses, 1u);
}

TEST(RegionsTest, WritesStridedRowsInsideTheSliceOnly) {
  // What a FULL_LOGITS answer into a device region does (one strided copy a rank); here through a
  // POSIX region, whose mapping writes row by row: the bytes between rows are left alone.
  ScopedShm shm(4096);
  std::memset(shm.data(), 0, shm.size());
  RegionRegistry reg(SystemOn());
  ASSERT_TRUE(reg.Register(Spec("r", shm, 0, 4096)).ok());
  auto ref = reg.Find("r", "logits_region");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto acc = ref->Access(1000, 100, "logits_region");
  ASSERT_TRUE(acc.ok()) << acc.status();
  uint8_t src[3 * 16];
  for (size_t i = 0; i < sizeof(src); ++i) src[i] = static_cast<uint8_t>(i + 1);
  // 3 rows of 10 bytes, 16 apart in the source, 30 apart from 20: [1020, 1030), [1050, ...), [1080, 1090).
  ASSERT_TRUE(acc->WriteRows(20, 30, src, 16, 10, 3).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(std::memcmp(shm.data() + 1020 + 30 * r, src + 16 * r, 10), 0) << "row " << r;
    EXPECT_EQ(shm.data()[1030 + 30 * r], 0) << "after row " << r;
  }
  EXPECT_EQ(shm.data()[1019], 0);
  // The last row's end exactly at the slice's end fits; one byte further, or rows wider than their
  // pitch, or a pitch so large that the arithmetic would wrap, is refused before anything is written.
  EXPECT_TRUE(acc->WriteRows(30, 30, src, 16, 10, 3).ok());
  ExpectCode(acc->WriteRows(31, 30, src, 16, 10, 3), absl::StatusCode::kInvalidArgument, "outside");
  ExpectCode(acc->WriteRows(0, 8, src, 16, 10, 2), absl::StatusCode::kInvalidArgument, "outside");
  ExpectCode(acc->WriteRows(0, UINT64_MAX / 2, src, 16, 10, 3), absl::StatusCode::kInvalidArgument, "outside");
  EXPECT_TRUE(acc->WriteRows(0, 30, src, 16, 10, 0).ok());  // nothing to write
  EXPECT_EQ(shm.data()[1000], 0);
}

TEST(RegionsTest, RefusesBadInputWithItsCode) {
  ScopedShm shm(4096);
  RegionRegistry off(RegistryOptions{});
  ExpectCode(off.Register(Spec("r", shm, 0, 16)), absl::StatusCode::kFailedPrecondition,
             "--shared-memory=system");
  ExpectCode(off.CheckAnyEnabled(), absl::StatusCode::kFailedPrecondition, "--shared-memory");
  RegionRegistry reg(SystemOn());
  RegionSpec cuda = Spec("c", shm, 0, 16);
  cuda.kind = RegionKind::kCudaIpc;
  ExpectCode(reg.Register(cuda), absl::StatusCode::kFailedPrecondition, "--shared-memory=cuda");

  for (const char* key : {"", "name", "/", "/a/b", "/..", "/a..b", "//x"}) {
    RegionSpec s = Spec("k", shm, 0, 16);
    s.shm_key = key;
    ExpectCode(reg.Register(s), absl::StatusCode::kInvalidArgument, "shm_key:");
  }
  RegionSpec missing = Spec("m", shm, 0, 16);
  missing.shm_key = "/dh_test_no_such_object";
  ExpectCode(reg.Register(missing), absl::StatusCode::kInvalidArgument, "cannot open");
  ExpectCode(reg.Register(Spec("big", shm, 4000, 97)), absl::StatusCode::kInvalidArgument,
             "byte_size:");
  ExpectCode(reg.Register(Spec("zero", shm, 0, 0)), absl::StatusCode::kInvalidArgument,
             "byte_size:");
  ExpectCode(reg.Register(Spec("wrap", shm, UINT64_MAX - 3, 16)),
             absl::StatusCode::kInvalidArgument, "overflows");
  ExpectCode(reg.Register(Spec("", shm, 0, 16)), absl::StatusCode::kInvalidArgument, "name:");

  ASSERT_TRUE(reg.Register(Spec("r", shm, 0, 4096)).ok());
  ExpectCode(reg.Register(Spec("r", shm, 0, 16)), absl::StatusCode::kAlreadyExists, "'r'");
  ExpectCode(reg.Find("nope", "logits_region").status(), absl::StatusCode::kNotFound,
             "logits_region:");
  ExpectCode(reg.Unregister("nope"), absl::StatusCode::kNotFound, "'nope'");
  ExpectCode(reg.Unregister("r", RegionKind::kCudaIpc), absl::StatusCode::kNotFound, "'r'");
  ExpectCode(reg.List("nope").status(), absl::StatusCode::kNotFound, "'nope'");

  auto ref = reg.Find("r", "hidden_region");
  ASSERT_TRUE(ref.ok());
  ExpectCode(ref->Access(4000, 97, "hidden_region").status(), absl::StatusCode::kInvalidArgument,
             "hidden_region: offset 4000 + byte_size 97");
  ExpectCode(ref->Access(UINT64_MAX, 2, "hidden_region").status(),
             absl::StatusCode::kInvalidArgument, "outside region");
  ExpectCode(ref->Access(0, 0, "hidden_region").status(), absl::StatusCode::kInvalidArgument,
             "byte_size is 0");
  // The object shrunk under the registry: refused, not a SIGBUS.
  shm.Resize(1024);
  ExpectCode(ref->Access(0, 16, "hidden_region").status(), absl::StatusCode::kInvalidArgument,
             "shrank");
  shm.Resize(4096);
  EXPECT_TRUE(ref->Access(0, 16, "hidden_region").ok());
}

TEST(RegionsTest, UnregisterWaitsForAnAccessAndNothingFollowsIt) {
  ScopedShm shm(4096);
  RegionRegistry reg(SystemOn());
  ASSERT_TRUE(reg.Register(Spec("r", shm, 0, 4096)).ok());
  auto ref = reg.Find("r", "logits_region");  // a queued request's pin
  ASSERT_TRUE(ref.ok());
  auto acc = ref->Access(0, 8, "logits_region");
  ASSERT_TRUE(acc.ok());
  std::atomic<bool> unregistered{false};
  std::thread t([&] {
    EXPECT_TRUE(reg.Unregister("r").ok());
    unregistered = true;
  });
  // The unregister waits while the access lives (no sleep decides the outcome: the flag is read
  // before the access ends, and must still be false then).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(unregistered.load());
  const uint8_t v = 42;
  EXPECT_TRUE(acc->Write(0, &v, 1).ok());
  { auto end = std::move(acc).value(); }
  t.join();
  EXPECT_TRUE(unregistered.load());
  EXPECT_EQ(shm.data()[0], 42);
  // The queued request's pin outlives the region: its access answers NOT_FOUND.
  ExpectCode(ref->Access(0, 8, "logits_region").status(), absl::StatusCode::kNotFound,
             "logits_region: region 'r' was unregistered");
  ExpectCode(reg.Find("r", "logits_region").status(), absl::StatusCode::kNotFound, "'r'");
  // The name is free again.
  EXPECT_TRUE(reg.Register(Spec("r", shm, 0, 16)).ok());
}

TEST(RegionsTest, UnregisterWithNoNameTakesEveryRegion) {
  ScopedShm shm(4096);
  RegionRegistry reg(SystemOn());
  ASSERT_TRUE(reg.Register(Spec("a", shm, 0, 16)).ok());
  ASSERT_TRUE(reg.Register(Spec("b", shm, 16, 16)).ok());
  ASSERT_EQ(reg.List()->size(), 2u);
  EXPECT_TRUE(reg.Unregister("", RegionKind::kCudaIpc).ok());  // none of that kind
  EXPECT_EQ(reg.List()->size(), 2u);
  EXPECT_TRUE(reg.Unregister("").ok());
  EXPECT_TRUE(reg.List()->empty());
}

}  // namespace
}  // namespace drafthead::regions
