// The same-host lane end to end: drafthead-server with --lanes as a real process, callers through
// the C++ client library (ClientOptions::lane) and through raw rings (client/lane/lane_ring.h).
// Answers over a lane equal gRPC's bit for bit in every mode; bad descriptors are answered
// INVALID_ARGUMENT naming the field in their slot and the lane goes on; a killed caller's lane is
// freed within 1 s and leaves no descriptor, mapping or object behind; a dead or stopped server is
// UNAVAILABLE / DEADLINE_EXCEEDED to a waiting caller, never a hang; a caller that does not read
// fills only its own lane. Small shapes (K = 256, 4000 of 4100 rows) keep it to seconds.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <random>

#include "client/drafthead_client.h"
#include "client/lane/lane_ring.h"
#include "common/lane/doorbell.h"
#include "e2e_util.h"

namespace drafthead {
namespace {

using client::DraftHeadClient;
using client::LaneMode;
using testing::ServerProcess;
using testing::WaitServing;

constexpr int kK = 256, kPadded = 4100, kVocab = 4000, kMaxRows = 8;

std::vector<std::string> ServerArgs(int port, const std::string& lanes) {
  return {"--synthetic=7", "--hidden-size=" + std::to_string(kK), "--padded-vocab=" + std::to_string(kPadded),
          "--vocab-size=" + std::to_string(kVocab), "--tp=1", "--backend=cpu", "--comm=gloo", "--threads=1",
          "--listen=127.0.0.1:" + std::to_string(port), "--shared-memory=system", "--lanes=" + lanes,
          "--max-rows=" + std::to_string(kMaxRows)};
}

struct Server {
  explicit Server(const std::string& lanes = "4", const std::string& tag = "lane")
      : port(testing::FreePort()),
        proc(ServerArgs(port, lanes), ::testing::TempDir() + "/" + tag + "_server.log") {
    target = "127.0.0.1:" + std::to_string(port);
    ok = WaitServing(proc, target, std::chrono::seconds(60));
  }
  std::unique_ptr<DraftHeadClient> Client(LaneMode mode, uint32_t depth = 4) {
    client::ClientOptions o;
    o.lane = mode;
    o.lane_options.depth = depth;
    o.retry.max_attempts = 1;
    auto c = DraftHeadClient::Connect(target, o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }
  int port;
  ServerProcess proc;
  std::string target;
  bool ok = false;
};

std::string RandomRows(uint32_t rows, uint64_t seed, bool fp32) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::string out;
  for (uint32_t i = 0; i < rows * kK; ++i) {
    float v = g(rng);
    if (fp32) {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint16_t b = static_cast<uint16_t>(u >> 16);
      out.append(reinterpret_cast<const char*>(&b), 2);
    }
  }
  return out;
}

v1::LogitsRequest Request(v1::Mode mode, uint32_t rows, uint64_t seed) {
  v1::LogitsRequest r;
  r.set_request_id(seed);
  r.set_rows(rows);
  const bool fp32 = seed % 2 == 1;
  r.set_hidden_dtype(fp32 ? v1::FP32 : v1::BF16);
  r.set_hidden(RandomRows(rows, seed, fp32));
  r.set_mode(mode);
  r.set_logits_dtype(seed % 3 == 0 ? v1::FP32 : v1::BF16);
  r.set_top_k(mode == v1::TOP_K ? 1 + seed % 40 : 0);
  r.set_return_probs(mode == v1::TOP_K && seed % 2 == 0);
  r.set_temperature(mode == v1::SAMPLE ? 0.7f : (mode == v1::TOP_K ? 1.3f : 0.f));
  r.set_seed(seed * 31);
  return r;
}

TEST(LaneE2E, EveryModeEqualsGrpcBitForBit) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  auto lane = s.Client(LaneMode::kRequired);
  auto grpc = s.Client(LaneMode::kOff);
  uint64_t seed = 1;
  for (v1::Mode mode : {v1::FULL_LOGITS, v1::TOP_K, v1::ARGMAX, v1::SAMPLE}) {
    for (uint32_t rows : {1u, 5u, 8u}) {
      for (int rep = 0; rep < 2; ++rep, ++seed) {
        const v1::LogitsRequest req = Request(mode, rows, seed);
        auto a = lane->Compute(req);
        auto b = grpc->Compute(req);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        SCOPED_TRACE(req.ShortDebugString().substr(0, 120));
        EXPECT_EQ(a->request_id(), b->request_id());
        EXPECT_EQ(a->rows(), b->rows());
        EXPECT_EQ(a->vocab_size(), b->vocab_size());
        EXPECT_EQ(a->logits_dtype(), b->logits_dtype());
        EXPECT_EQ(a->logits(), b->logits());
        ASSERT_EQ(a->token_ids_size(), b->token_ids_size());
        for (int i = 0; i < a->token_ids_size(); ++i) {
          EXPECT_EQ(a->token_ids(i), b->token_ids(i));
          EXPECT_EQ(std::bit_cast<uint32_t>(a->values(i)), std::bit_cast<uint32_t>(b->values(i)));
        }
        ASSERT_EQ(a->probs_size(), b->probs_size());
        for (int i = 0; i < a->probs_size(); ++i)
          EXPECT_EQ(std::bit_cast<uint32_t>(a->probs(i)), std::bit_cast<uint32_t>(b->probs(i)));
        if (mode == v1::FULL_LOGITS) {
          EXPECT_FALSE(a->logits().empty());
        }
      }
    }
  }
  // The lane carried them (its waits are counted), and a bad request is refused as gRPC refuses it.
  auto l = lane->Lane();
  ASSERT_TRUE(l.ok() && *l != nullptr);
  EXPECT_GE((*l)->ring().spin_waits() + (*l)->ring().sleep_waits(), 24u);
  v1::LogitsRequest bad = Request(v1::TOP_K, 2, 99);
  bad.set_top_k(100000);
  auto a = lane->Compute(bad);
  auto b = grpc->Compute(bad);
  EXPECT_EQ(a.status(), b.status());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("top_k"), std::string::npos) << a.status();
}

TEST(LaneE2E, ManyThreadsShareOneLane) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  auto lane = s.Client(LaneMode::kRequired, /*depth=*/4);
  auto grpc = s.Client(LaneMode::kOff);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0}, failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const v1::LogitsRequest req = Request(v1::TOP_K, 1 + (t + i) % kMaxRows, 1000 + t * 100 + i);
        auto a = lane->Compute(req);
        auto b = grpc->Compute(req);
        if (!a.ok() || !b.ok()) { ++failures; continue; }
        if (a->SerializeAsString().size() == 0 ||
            !std::equal(a->token_ids().begin(), a->token_ids().end(), b->token_ids().begin(), b->token_ids().end()))
          ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

// A raw ring opened by hand, for descriptors no library would write.
struct RawLane {
  explicit RawLane(const std::string& target, uint32_t depth = 4) {
    lane::LaneRingConfig c;
    c.depth = depth;
    c.inline_bytes = 4096;
    c.hidden_slot_bytes = kMaxRows * kK * 4;
    c.output_slot_bytes = kMaxRows * kVocab * 4;
    c.spin_ns = 0;
    lane::LaneError e;
    ring = lane::LaneRing::Create(c, &e);
    EXPECT_NE(ring, nullptr) << e.message;
    stub = v1::DraftHead::NewStub(testing::Channel(target));
    const v1::OpenLaneRequest req =
        client::OpenLaneRequestFor(*ring, "raw-arena-" + std::to_string(ring->nonce()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    status = stub->OpenLane(&ctx, req, &resp);
    ring->Unlink();
    if (status.ok()) {
      EXPECT_TRUE(ring->Attach(resp.server_pid()).ok());
    }
  }
  // A valid TOP_K descriptor for slot `slot` (rows written there).
  lane::LaneRequest Good(uint32_t slot, uint32_t rows = 2) {
    const std::string x = RandomRows(rows, 5 + slot, false);
    std::memcpy(ring->hidden_area(slot), x.data(), x.size());
    lane::LaneRequest d{};
    d.request_id = 77;
    d.rows = rows;
    d.mode = v1::TOP_K;
    d.top_k = 4;
    d.hidden = {0, 0, ring->hidden_area_offset(slot), x.size()};
    d.output = {lane::kNoRegion, 0, 0, 0};
    return d;
  }
  const lane::LaneCompletion* Call(const lane::LaneRequest& d, lane::LaneError* err, uint64_t* seq_out = nullptr,
                                   int64_t timeout_ns = 10'000'000'000) {
    uint64_t seq;
    *err = ring->Reserve(lane::MonotonicNanos() + timeout_ns, &seq);
    if (!err->ok()) return nullptr;
    ring->Publish(seq, d);
    const lane::LaneCompletion* c = nullptr;
    *err = ring->Wait(seq, lane::MonotonicNanos() + timeout_ns, &c);
    if (seq_out) *seq_out = seq;
    return c;
  }
  ~RawLane() {
    if (!status.ok()) return;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CloseLaneRequest req;
    req.set_lane_id(resp.lane_id());
    v1::CloseLaneResponse r;
    EXPECT_TRUE(stub->CloseLane(&ctx, req, &r).ok());
  }
  std::unique_ptr<lane::LaneRing> ring;
  std::unique_ptr<v1::DraftHead::Stub> stub;
  grpc::Status status;
  v1::OpenLaneResponse resp;
};

// The killed caller of KilledCallerFreesItsLane: opens a lane, leaves requests in flight, says so
// on its pipe, and waits to be killed.
int RunLaneChildIfAsked() {
  const char* target = std::getenv("DRAFTHEAD_LANE_CHILD");
  if (target == nullptr) return 0;
  const int fd = std::atoi(std::getenv("DRAFTHEAD_LANE_CHILD_FD"));
  RawLane raw(target);
  if (!raw.status.ok()) _exit(3);
  for (uint32_t k = 0; k < raw.ring->depth(); ++k) {
    uint64_t seq;
    if (!raw.ring->Reserve(lane::MonotonicNanos() + 1'000'000'000, &seq).ok()) break;
    raw.ring->Publish(seq, raw.Good(static_cast<uint32_t>(seq % raw.ring->depth()), 8));
  }
  const char c = 1;
  if (write(fd, &c, 1) != 1) _exit(4);
  for (;;) pause();
}
const int kLaneChild = RunLaneChildIfAsked();

std::string Message(const lane::LaneCompletion* c) { return std::string(c->message, c->message_len); }

TEST(LaneE2E, BadDescriptorsAreAnsweredInTheirSlot) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  RawLane raw(s.target);
  ASSERT_TRUE(raw.status.ok()) << raw.status.error_message();
  struct Bad {
    const char* field;
    std::function<void(lane::LaneRequest&)> spoil;
  };
  const std::vector<Bad> bads = {
      {"hidden", [](lane::LaneRequest& d) { d.hidden.region = 5; }},
      {"hidden", [](lane::LaneRequest& d) { d.hidden.region = lane::kNoRegion; }},
      {"hidden_region", [](lane::LaneRequest& d) { d.hidden.offset = 1ull << 40; }},
      {"hidden_region", [](lane::LaneRequest& d) { d.hidden.byte_size += 2; }},
      {"rows", [](lane::LaneRequest& d) { d.rows = 0; }},
      {"rows", [](lane::LaneRequest& d) { d.rows = 1000; }},
      {"mode", [](lane::LaneRequest& d) { d.mode = 9; }},
      {"top_k", [](lane::LaneRequest& d) { d.top_k = 0; }},
      {"hidden_dtype", [](lane::LaneRequest& d) { d.hidden_dtype = 7; }},
      {"head", [](lane::LaneRequest& d) { d.head = 3; }},
      {"flags", [](lane::LaneRequest& d) { d.flags = 0x80; }},
      {"temperature", [](lane::LaneRequest& d) { d.temperature = std::nanf(""); }},
      {"output", [](lane::LaneRequest& d) { d.mode = v1::FULL_LOGITS; }},
      {"output", [](lane::LaneRequest& d) { d.output = {0, 0, 1ull << 40, 64}; }},
      {"output", [](lane::LaneRequest& d) { d.output = {0, 0, 0, 8}; }},
      {"output", [](lane::LaneRequest& d) {  // 2 x 200 x 12 > 4096 inline bytes
         d.top_k = 200;
         d.flags = lane::kFlagReturnProbs;
       }},
      {"output", [](lane::LaneRequest& d) {  // 2 x 150 x 16 > 4096 inline bytes (x 12 would fit)
         d.top_k = 150;
         d.flags = lane::kFlagReturnProbs | lane::kFlagIds64;
       }},
      {"output", [](lane::LaneRequest& d) {  // 2 x 4 x 12 = 96 > 80 bytes (int32 ids would fit)
         d.output = {0, 0, 0, 80};
         d.flags = lane::kFlagIds64;
       }},
  };
  for (size_t i = 0; i < bads.size(); ++i) {
    lane::LaneRequest d = raw.Good(i % raw.ring->depth());
    bads[i].spoil(d);
    lane::LaneError err;
    const lane::LaneCompletion* c = raw.Call(d, &err);
    ASSERT_TRUE(err.ok()) << err.message;
    EXPECT_EQ(c->code, static_cast<int>(absl::StatusCode::kInvalidArgument)) << i << ": " << Message(c);
    EXPECT_NE(Message(c).find(bads[i].field), std::string::npos) << i << ": " << Message(c);
    EXPECT_EQ(c->request_id, 77u);
    raw.ring->Release(c->done_seq.load() - 1);
  }
  // The lane goes on, and its answer is right.
  lane::LaneError err;
  uint64_t seq;
  const lane::LaneCompletion* c = raw.Call(raw.Good(1), &err, &seq);
  ASSERT_TRUE(err.ok()) << err.message;
  EXPECT_EQ(c->code, 0) << Message(c);
  EXPECT_EQ(c->rows, 2u);
  EXPECT_EQ(c->k, 4u);
  raw.ring->Release(seq);
}

// kFlagIds64 (what the Python client asks for with torch output tensors): the same answer with
// int64 ids, inline and in an output slice, TOP_K with and without probs, ARGMAX and SAMPLE.
TEST(LaneE2E, Int64IdsAreTheSameAnswerWidened) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  RawLane raw(s.target);
  ASSERT_TRUE(raw.status.ok()) << raw.status.error_message();
  struct Answer {
    uint32_t flags = 0, k = 0;
    std::vector<int64_t> ids;
    std::vector<float> values, probs;
  };
  auto Bits = [](const std::vector<float>& v) {  // bit patterns: NaN-proof equality
    std::vector<uint32_t> u(v.size());
    for (size_t i = 0; i < v.size(); ++i) std::memcpy(&u[i], &v[i], 4);
    return u;
  };
  auto call = [&](lane::LaneRequest d, bool ids64, bool in_output) {
    const uint32_t slot = 1;
    if (ids64) d.flags |= lane::kFlagIds64;
    if (in_output) d.output = {0, 0, raw.ring->output_area_offset(slot), 1 << 16};
    lane::LaneError err;
    uint64_t seq = 0;
    const lane::LaneCompletion* c = raw.Call(d, &err, &seq);
    Answer a;
    EXPECT_TRUE(err.ok()) << err.message;
    if (c == nullptr) return a;
    EXPECT_EQ(c->code, 0) << Message(c);
    a.flags = c->flags;
    a.k = c->k;
    const size_t n = size_t{c->rows} * c->k;
    const uint8_t* src = (c->flags & lane::kDoneInOutput) ? raw.ring->output_area(slot)
                                                         : reinterpret_cast<const uint8_t*>(c) + lane::kCompletionHeaderBytes;
    const size_t idb = ids64 ? 8 : 4;
    for (size_t i = 0; i < n; ++i) {
      int64_t id = 0;
      if (ids64) {
        std::memcpy(&id, src + i * 8, 8);
      } else {
        int32_t v;
        std::memcpy(&v, src + i * 4, 4);
        id = v;
      }
      a.ids.push_back(id);
    }
    a.values.resize(n);
    for (size_t i = 0; i < n; ++i) std::memcpy(&a.values[i], src + n * idb + i * 4, 4);
    if (c->flags & lane::kDoneProbs) {
      a.probs.resize(n);
      for (size_t i = 0; i < n; ++i) std::memcpy(&a.probs[i], src + n * (idb + 4) + i * 4, 4);
    }
    raw.ring->Release(seq);
    return a;
  };
  std::vector<lane::LaneRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    lane::LaneRequest d = raw.Good(1, 3);
    if (i == 1) d.flags = lane::kFlagReturnProbs;
    if (i == 2) d.mode = v1::ARGMAX;
    if (i == 3) {
      d.mode = v1::SAMPLE;
      d.temperature = 0.7f;
      d.seed = 11;
    }
    reqs.push_back(d);
  }
  for (const lane::LaneRequest& d : reqs)
    for (bool in_output : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "mode " << int{d.mode} << " flags " << d.flags << " in output " << in_output);
      const Answer a = call(d, false, in_output), b = call(d, true, in_output);
      EXPECT_EQ(a.flags & lane::kDoneIds64, 0u);
      EXPECT_EQ(b.flags, a.flags | lane::kDoneIds64);
      EXPECT_EQ(b.k, a.k);
      EXPECT_FALSE(a.ids.empty());
      EXPECT_EQ(a.ids, b.ids);
      EXPECT_EQ(Bits(a.values), Bits(b.values));
      EXPECT_EQ(Bits(a.probs), Bits(b.probs));
    }
}

// LaneRing::Submit (what dh_lane_call and LaneClient use): slot-relative slices land in the same
// places as absolute ones, around the ring more than once; a slice larger than a slot is refused
// before anything is reserved; a reserved seq that is Cancel()ed is refused by the server in its
// slot and the ring goes on.
TEST(LaneE2E, SlotRelativeSubmitAndCancel) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  RawLane raw(s.target);
  ASSERT_TRUE(raw.status.ok()) << raw.status.error_message();
  lane::LaneRing& ring = *raw.ring;
  const uint64_t logits_bytes = 2 * kVocab * 2;
  auto full = [&](lane::LaneSlice output) {
    lane::LaneRequest d{};
    d.rows = 2;
    d.mode = v1::FULL_LOGITS;
    d.output = output;
    return d;
  };
  for (uint32_t i = 0; i < ring.depth() + 2; ++i) {
    const std::string x = RandomRows(2, 40 + i, false);
    // Absolute: the caller places the rows and names the slot's areas itself.
    uint64_t seq;
    ASSERT_TRUE(ring.Reserve(lane::MonotonicNanos() + 10'000'000'000, &seq).ok());
    const uint32_t slot = static_cast<uint32_t>(seq % ring.depth());
    std::memcpy(ring.hidden_area(slot), x.data(), x.size());
    lane::LaneRequest d = full({0, 0, ring.output_area_offset(slot), logits_bytes});
    d.hidden = {0, 0, ring.hidden_area_offset(slot), x.size()};
    ring.Publish(seq, d);
    const lane::LaneCompletion* c = nullptr;
    ASSERT_TRUE(ring.Wait(seq, lane::MonotonicNanos() + 10'000'000'000, &c).ok());
    ASSERT_EQ(c->code, 0) << Message(c);
    const std::string want(reinterpret_cast<const char*>(ring.output_area(slot)), logits_bytes);
    ring.Release(seq);
    // Slot-relative, through Submit: the next slot, the same answer.
    ASSERT_TRUE(ring.Submit(full({0, 0, 0, logits_bytes}), x.data(), x.size(), lane::MonotonicNanos() + 10'000'000'000,
                            &seq).ok());
    ASSERT_TRUE(ring.Wait(seq, lane::MonotonicNanos() + 10'000'000'000, &c).ok());
    ASSERT_EQ(c->code, 0) << Message(c);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(ring.output_area(seq % ring.depth())), logits_bytes), want)
        << "seq " << seq;
    ring.Release(seq);
  }
  const std::string x = RandomRows(2, 1, false);
  uint64_t seq = 0;
  const std::string big(ring.config().hidden_slot_bytes + 1, '\0');
  lane::LaneError e = ring.Submit(full({0, 0, 0, logits_bytes}), big.data(), big.size(), lane::MonotonicNanos(), &seq);
  EXPECT_EQ(e.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(e.message.find("hidden"), std::string::npos) << e.message;
  e = ring.Submit(full({0, 0, 8, ring.config().output_slot_bytes}), x.data(), x.size(), lane::MonotonicNanos(),
                  &seq);
  EXPECT_EQ(e.code, static_cast<int>(absl::StatusCode::kInvalidArgument));  // 8 + a slot's worth
  EXPECT_NE(e.message.find("output"), std::string::npos) << e.message;
  // Nothing was reserved by the refusals; a cancelled seq is answered (refused) in its slot.
  uint64_t cancelled = 0;
  ASSERT_TRUE(ring.Reserve(lane::MonotonicNanos() + 10'000'000'000, &cancelled).ok());
  ring.Cancel(cancelled);
  ASSERT_TRUE(ring.Submit(full({0, 0, 0, logits_bytes}), x.data(), x.size(), lane::MonotonicNanos() + 10'000'000'000,
                          &seq).ok());
  EXPECT_EQ(seq, cancelled + 1);
  const lane::LaneCompletion* c = nullptr;
  ASSERT_TRUE(ring.Wait(seq, lane::MonotonicNanos() + 10'000'000'000, &c).ok());
  EXPECT_EQ(c->code, 0) << Message(c);
  ring.Release(seq);
  ASSERT_TRUE(ring.Done(cancelled));
  EXPECT_EQ(ring.completion(cancelled)->code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(Message(ring.completion(cancelled)).find("hidden"), std::string::npos) << Message(ring.completion(cancelled));
  // The cancelled slot is reclaimed by itself: a whole ring's worth of calls still goes through.
  for (uint32_t i = 0; i < ring.depth(); ++i) {
    ASSERT_TRUE(ring.Submit(full({0, 0, 0, logits_bytes}), x.data(), x.size(), lane::MonotonicNanos() + 10'000'000'000,
                            &seq).ok()) << i;
    ASSERT_TRUE(ring.Wait(seq, lane::MonotonicNanos() + 10'000'000'000, &c).ok());
    ring.Release(seq);
  }
}

TEST(LaneE2E, OpenIsRefusedClearly) {
  Server s("1", "lane_open");
  ASSERT_TRUE(s.ok) << s.proc.Log();
  {
    RawLane first(s.target);
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    RawLane second(s.target);  // --lanes=1
    EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.status.error_message();
    auto required = s.Client(LaneMode::kRequired);
    auto r = required->Compute(Request(v1::ARGMAX, 1, 3));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    auto autolane = s.Client(LaneMode::kAuto);  // falls back to gRPC
    EXPECT_TRUE(autolane->Compute(Request(v1::ARGMAX, 1, 3)).ok());
  }
  // A wrong nonce, a missing object, an object another mode than 0600.
  auto stub = v1::DraftHead::NewStub(testing::Channel(s.target));
  lane::LaneRingConfig c;
  lane::LaneError e;
  auto ring = lane::LaneRing::Create(c, &e);
  ASSERT_NE(ring, nullptr);
  auto open = [&](std::function<void(v1::OpenLaneRequest&)> spoil) {
    v1::OpenLaneRequest req = client::OpenLaneRequestFor(*ring, "");  // no arena: c has none
    spoil(req);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::OpenLaneResponse resp;
    return stub->OpenLane(&ctx, req, &resp);
  };
  auto expect = [](const grpc::Status& st, const std::string& needle) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(needle), std::string::npos) << st.error_message();
  };
  expect(open([](v1::OpenLaneRequest& r) { r.set_nonce(r.nonce() + 1); }), "nonce");
  expect(open([](v1::OpenLaneRequest& r) { r.set_shm_key("/drafthead-no-such-lane"); }), "shm_key");
  expect(open([](v1::OpenLaneRequest& r) { r.set_byte_size(r.byte_size() + 4096); }), "byte_size");
  expect(open([](v1::OpenLaneRequest& r) { r.set_layout_version(99); }), "layout_version");
  expect(open([](v1::OpenLaneRequest& r) { r.set_pid(1); }), "pid");
  ASSERT_EQ(chmod(("/dev/shm" + ring->key()).c_str(), 0644), 0);
  expect(open([](v1::OpenLaneRequest&) {}), "0600");
  ring->Unlink();

  Server off("0", "lane_off");
  ASSERT_TRUE(off.ok) << off.proc.Log();
  auto required = off.Client(LaneMode::kRequired);
  auto r = required->Compute(Request(v1::ARGMAX, 1, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("lanes"), std::string::npos) << r.status();
  EXPECT_TRUE(off.Client(LaneMode::kAuto)->Compute(Request(v1::ARGMAX, 1, 3)).ok());
}

size_t CountFds(pid_t pid) {
  size_t n = 0;
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}
size_t CountLaneMappings(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) n += line.find("/dev/shm/drafthead-") != std::string::npos;
  return n;
}
size_t CountShmObjects(pid_t pid) {
  size_t n = 0;
  const std::string mine = "drafthead-lane-" + std::to_string(pid) + "-";
  const std::string arena = "drafthead-arena-" + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      n += name.rfind(mine, 0) == 0 || name.rfind(arena, 0) == 0;
    }
    closedir(d);
  }
  return n;
}

// A caller killed -9 with requests in flight: its lane is free again within 1 s (--lanes=1, so the
// next open succeeds only then), over many cycles without a descriptor, mapping or object left.
TEST(LaneE2E, KilledCallerFreesItsLane) {
  Server s("1", "lane_kill");
  ASSERT_TRUE(s.ok) << s.proc.Log();
  const pid_t server = s.proc.pid();
  { RawLane warm(s.target); ASSERT_TRUE(warm.status.ok()); }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const size_t fds0 = CountFds(server);
  // DRAFTHEAD_LANE_KILL_CYCLES=1000 for the long run (docs/lane.md).
  const int kCycles = std::getenv("DRAFTHEAD_LANE_KILL_CYCLES") ? std::atoi(std::getenv("DRAFTHEAD_LANE_KILL_CYCLES")) : 40;
  std::vector<pid_t> children;
  double worst_s = 0;
  for (int i = 0; i < kCycles; ++i) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    // A fresh process (this binary re-executed), not a fork of one running gRPC threads.
    const pid_t child = fork();
    if (child == 0) {
      close(ready[0]);
      setenv("DRAFTHEAD_LANE_CHILD", s.target.c_str(), 1);
      setenv("DRAFTHEAD_LANE_CHILD_FD", std::to_string(ready[1]).c_str(), 1);
      execl("/proc/self/exe", "lane_e2e_test", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(ready[1]);
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1) << "child " << i << " could not open its lane";
    close(ready[0]);
    kill(child, SIGKILL);
    int st;
    waitpid(child, &st, 0);
    children.push_back(child);
    const auto t0 = std::chrono::steady_clock::now();
    bool opened = false;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
      RawLane next(s.target);
      if (next.status.ok()) { opened = true; break; }
      ASSERT_EQ(next.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << next.status.error_message();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(opened) << "cycle " << i;
    worst_s = std::max(worst_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  EXPECT_LT(worst_s, 1.0) << "a killed caller's lane took " << worst_s << " s to free";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(CountFds(server), fds0 + 2);
  EXPECT_EQ(CountLaneMappings(server), 0u);
  const size_t rss_kib = [&] {
    std::ifstream f("/proc/" + std::to_string(server) + "/status");
    std::string k;
    size_t v = 0;
    while (f >> k) if (k == "VmRSS:") { f >> v; break; }
    return v;
  }();
  std::printf("lane kill cycles: %d, worst free %.3f s, server fds %zu (start %zu), RSS %zu KiB\n", kCycles,
              worst_s, CountFds(server), fds0, rss_kib);
  for (pid_t c : children) EXPECT_EQ(CountShmObjects(c), 0u);
  EXPECT_TRUE(s.proc.Running());
  auto grpc = s.Client(LaneMode::kOff);
  EXPECT_TRUE(grpc->Compute(Request(v1::ARGMAX, 1, 3)).ok());
}

// The server stopped, then killed, under a waiting caller: DEADLINE_EXCEEDED by its deadline,
// then UNAVAILABLE; never a hang.
TEST(LaneE2E, DeadOrStoppedServerNeverHangsTheCaller) {
  Server s("2", "lane_dead");
  ASSERT_TRUE(s.ok) << s.proc.Log();
  auto lane = s.Client(LaneMode::kRequired);
  ASSERT_TRUE(lane->Compute(Request(v1::ARGMAX, 1, 3)).ok());
  std::vector<pid_t> group = testing::ChildPids(s.proc.pid());
  group.push_back(s.proc.pid());
  for (pid_t p : group) kill(p, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a stop is not instant
  auto t0 = std::chrono::steady_clock::now();
  auto r = lane->Compute(Request(v1::ARGMAX, 1, 4), absl::Milliseconds(300));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(waited, 1.5);
  for (pid_t p : group) kill(p, SIGKILL);
  t0 = std::chrono::steady_clock::now();
  r = lane->Compute(Request(v1::ARGMAX, 1, 5), absl::Seconds(20));
  waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(waited, 2.0);
  for (pid_t p : group) kill(p, SIGCONT);
}

// A caller that publishes more descriptors than its ring holds breaks the protocol: its lane is
// closed (server_state 2, waiters UNAVAILABLE), and the server goes on.
TEST(LaneE2E, ProtocolViolationClosesOnlyThatLane) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  RawLane bad(s.target);
  ASSERT_TRUE(bad.status.ok());
  auto* h = reinterpret_cast<lane::LaneHeader*>(bad.ring->base());
  h->sq_tail.store(12345, std::memory_order_release);
  lane::FutexWake(&h->sq_tail, 1);
  const auto t0 = std::chrono::steady_clock::now();
  while (h->server_state.load() != lane::kServerClosed &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h->server_state.load(), lane::kServerClosed);
  EXPECT_FALSE(bad.ring->CheckServer().ok());
  bad.status = grpc::Status::CANCELLED;  // already closed: no CloseLane
  auto polite = s.Client(LaneMode::kRequired);
  EXPECT_TRUE(polite->Compute(Request(v1::ARGMAX, 1, 9)).ok());
}

// A caller that never reads its completions fills only its own lane; another lane's calls go on.
TEST(LaneE2E, NonReadingCallerFillsOnlyItsLane) {
  Server s;
  ASSERT_TRUE(s.ok) << s.proc.Log();
  RawLane greedy(s.target, /*depth=*/4);
  ASSERT_TRUE(greedy.status.ok());
  for (int i = 0; i < 4; ++i) {
    uint64_t seq;
    ASSERT_TRUE(greedy.ring->Reserve(lane::MonotonicNanos() + 1'000'000'000, &seq).ok());
    greedy.ring->Publish(seq, greedy.Good(static_cast<uint32_t>(seq)));
  }
  uint64_t seq;
  const lane::LaneError full = greedy.ring->Reserve(lane::MonotonicNanos() + 100'000'000, &seq);
  EXPECT_EQ(full.code, static_cast<int>(absl::StatusCode::kResourceExhausted)) << full.message;
  auto polite = s.Client(LaneMode::kRequired);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(polite->Compute(Request(v1::TOP_K, 2, 50 + i)).ok());
}

}  // namespace
}  // namespace drafthead
