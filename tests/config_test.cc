// server/app/config.h's rules: the one device rule (ChooseDevice) that the CUDA backend, NCCL and
// CUDA regions all take their GPU from (the visible count injected, so no GPU is needed), and the
// forms --listen accepts (CheckListenAddress), --queue-policy reaching the batcher's options,
// --unary-api and --sync-max-pollers the front's, and --isa reaching the CPU backend's.
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "server/app/config.h"

ABSL_DECLARE_FLAG(int, tp);
ABSL_DECLARE_FLAG(std::optional<uint64_t>, synthetic);
ABSL_DECLARE_FLAG(std::string, queue_policy);
ABSL_DECLARE_FLAG(std::string, isa);
ABSL_DECLARE_FLAG(std::string, unary_api);
ABSL_DECLARE_FLAG(uint32_t, sync_max_pollers);
ABSL_DECLARE_FLAG(uint32_t, cuda_stage_events_every);

namespace drafthead {
namespace {

TEST(ChooseDeviceTest, LocalRankRoundRobinOverVisibleDevices) {
  // --tp=4 on one host: one GPU each with 4 visible, shared round robin with fewer.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(*ChooseDevice(-1, r, 4), r);
  EXPECT_EQ(*ChooseDevice(-1, 0, 1), 0);
  EXPECT_EQ(*ChooseDevice(-1, 3, 1), 0);
  EXPECT_EQ(*ChooseDevice(-1, 3, 2), 1);
  // The local rank, not the global one: rank 5 on a second host is local rank 1 there.
  EXPECT_EQ(*ChooseDevice(-1, 1, 8), 1);
}

TEST(ChooseDeviceTest, RequestedDeviceWinsWhenVisible) {
  EXPECT_EQ(*ChooseDevice(2, 0, 4), 2);
  EXPECT_EQ(*ChooseDevice(0, 3, 4), 0);
}

TEST(ChooseDeviceTest, RefusesWhatIsNotThere) {
  auto none = ChooseDevice(-1, 0, 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  auto missing = ChooseDevice(4, 1, 4);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("device 4"), std::string::npos) << missing.status();
}

TEST(CheckListenAddressTest, HostPortAndUnixSockets) {
  EXPECT_TRUE(CheckListenAddress("127.0.0.1:50051").ok());
  EXPECT_TRUE(CheckListenAddress("0.0.0.0:0").ok());
  EXPECT_TRUE(CheckListenAddress("[::1]:7").ok());
  EXPECT_TRUE(CheckListenAddress("unix:/tmp/dh.sock").ok());
  EXPECT_TRUE(CheckListenAddress("unix:///tmp/dh.sock").ok());
  EXPECT_TRUE(CheckListenAddress("unix:relative.sock").ok());
  EXPECT_TRUE(CheckListenAddress("unix:/" + std::string(106, 'a')).ok());  // 107 bytes: fits
}

TEST(CheckListenAddressTest, RefusesWhatCannotListen) {
  EXPECT_FALSE(CheckListenAddress("").ok());
  EXPECT_FALSE(CheckListenAddress("50051").ok());
  EXPECT_FALSE(CheckListenAddress("host:99999").ok());
  EXPECT_FALSE(CheckListenAddress("unix:").ok());
  EXPECT_FALSE(CheckListenAddress("unix://").ok());
  auto long_path = CheckListenAddress("unix:/" + std::string(107, 'a'));
  ASSERT_FALSE(long_path.ok());
  EXPECT_NE(long_path.message().find("at most 107"), std::string::npos) << long_path;
}

// --queue-policy: fair by default, fifo on request (the queue before fair queueing), anything else
// refused naming the flag.
TEST(ServerConfigTest, QueuePolicyReachesTheBatcher) {
  absl::SetFlag(&FLAGS_tp, 1);
  absl::SetFlag(&FLAGS_synthetic, std::optional<uint64_t>(1));
  auto fair = ServerConfigFromFlags();
  ASSERT_TRUE(fair.ok()) << fair.status();
  EXPECT_EQ(fair->batcher.policy, QueuePolicy::kFair);
  absl::SetFlag(&FLAGS_queue_policy, "fifo");
  auto fifo = ServerConfigFromFlags();
  ASSERT_TRUE(fifo.ok()) << fifo.status();
  EXPECT_EQ(fifo->batcher.policy, QueuePolicy::kFifo);
  absl::SetFlag(&FLAGS_queue_policy, "lifo");
  auto bad = ServerConfigFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--queue-policy"), std::string::npos) << bad.status();
  absl::SetFlag(&FLAGS_queue_policy, "fair");
}

// --unary-api: callback by default, sync on request, anything else refused naming the flag;
// --sync-max-pollers within 1..1024.
TEST(ServerConfigTest, UnaryApiAndPollersReachTheFront) {
  absl::SetFlag(&FLAGS_tp, 1);
  absl::SetFlag(&FLAGS_synthetic, std::optional<uint64_t>(1));
  auto dflt = ServerConfigFromFlags();
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->unary_api, UnaryApi::kCallback);
  EXPECT_EQ(dflt->sync_max_pollers, 256u);
  absl::SetFlag(&FLAGS_unary_api, "sync");
  absl::SetFlag(&FLAGS_sync_max_pollers, 8u);
  auto sync = ServerConfigFromFlags();
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(sync->unary_api, UnaryApi::kSync);
  EXPECT_EQ(sync->sync_max_pollers, 8u);
  absl::SetFlag(&FLAGS_sync_max_pollers, 0u);
  auto no_pollers = ServerConfigFromFlags();
  ASSERT_FALSE(no_pollers.ok());
  EXPECT_NE(no_pollers.status().message().find("--sync-max-pollers"), std::string::npos) << no_pollers.status();
  absl::SetFlag(&FLAGS_sync_max_pollers, 256u);
  absl::SetFlag(&FLAGS_unary_api, "async");
  auto bad = ServerConfigFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--unary-api"), std::string::npos) << bad.status();
  absl::SetFlag(&FLAGS_unary_api, "callback");
}

// --cuda-stage-events-every: one batch in 16 timed by default, reaching the backend's options; 0
// refused naming the flag (--cuda-stage-events=false is how none are timed).
TEST(ServerConfigTest, StageEventSamplingReachesTheBackend) {
  absl::SetFlag(&FLAGS_tp, 1);
  absl::SetFlag(&FLAGS_synthetic, std::optional<uint64_t>(1));
  auto dflt = ServerConfigFromFlags();
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->backend_options.cuda_stage_events_every, 16u);
  absl::SetFlag(&FLAGS_cuda_stage_events_every, 1u);
  auto each = ServerConfigFromFlags();
  ASSERT_TRUE(each.ok()) << each.status();
  EXPECT_EQ(each->backend_options.cuda_stage_events_every, 1u);
  absl::SetFlag(&FLAGS_cuda_stage_events_every, 0u);
  auto bad = ServerConfigFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--cuda-stage-events-every"), std::string::npos) << bad.status();
  absl::SetFlag(&FLAGS_cuda_stage_events_every, 16u);
}

// --isa: auto by default (the widest GEMV this CPU has), an explicit path passed through as it is
// (scalar runs on every CPU), unknown names refused naming the flag.
TEST(ServerConfigTest, IsaReachesTheCpuBackend) {
  absl::SetFlag(&FLAGS_tp, 1);
  absl::SetFlag(&FLAGS_synthetic, std::optional<uint64_t>(1));
  auto dflt = ServerConfigFromFlags();
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->backend_options.cpu_isa, cpu::GemvIsa::kAuto);
  absl::SetFlag(&FLAGS_isa, "scalar");
  auto scalar = ServerConfigFromFlags();
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->backend_options.cpu_isa, cpu::GemvIsa::kScalar);
  absl::SetFlag(&FLAGS_isa, "avx1024");
  auto bad = ServerConfigFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--isa"), std::string::npos) << bad.status();
  absl::SetFlag(&FLAGS_isa, "auto");
}

}  // namespace
}  // namespace drafthead
