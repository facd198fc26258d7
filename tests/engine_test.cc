// The whole rank-0 data path in one process: ranks as threads over the in-process collective,
// CPU backends on random shards, the Batcher and BatchLoop, requests prepared from LogitsRequest
// protos. Checked against the float64 reference of the per-shard twin, for tp = 1..4, vocab crops,
// K = 64 and K = 256, every mode, mixed batches.
#include <gtest/gtest.h>

#include <deque>
#include <future>
#include <thread>

#include "common/status_macros.h"
#include "kernels/numeric.h"
#include "server/comm/inproc_collective.h"
#include "server/sched/batcher.h"
#include "server/engine/rank_engine.h"
#include "server/sched/batch_loop.h"
#include "server/request/request.h"
#include "server/api/response.h"
#include "reference.h"

namespace drafthead {
namespace {

using testing::InProcCollective;
using testing::InProcGroup;

struct Group {
  std::vector<std::unique_ptr<RankEngine>> engines;
  std::vector<std::thread> workers;
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<BatchLoop> loop;
  std::thread loop_thread;
  absl::Status loop_status;
  ServingLimits limits;
  ShardGeometry geo0;

  ~Group() {
    if (loop) loop->Stop();
    if (loop_thread.joinable()) loop_thread.join();
    for (auto& t : workers) t.join();
  }
};

// Wraps rank 0's collective (tests that hold the engine at a known point); identity by default.
using WrapCollective = std::function<std::unique_ptr<Collective>(std::unique_ptr<Collective>)>;

// A collective that passes every call to `inner`: the base of the wrappers below, which override
// what they watch or hold.
class ForwardingCollective : public Collective {
 public:
  explicit ForwardingCollective(std::unique_ptr<Collective> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  std::string name() const override { return inner_->name(); }
  bool AcceptsDeviceMemory() const override { return inner_->AcceptsDeviceMemory(); }
  absl::Status Broadcast(void* data, size_t bytes, MemorySpace space, std::chrono::milliseconds t) override {
    return inner_->Broadcast(data, bytes, space, t);
  }
  absl::Status Gather(const void* send, size_t bytes, void* recv, MemorySpace space,
                      std::chrono::milliseconds t) override {
    return inner_->Gather(send, bytes, recv, space, t);
  }
  absl::Status PostGather(void* recv, size_t bytes, MemorySpace space) override {
    return inner_->PostGather(recv, bytes, space);
  }

 private:
  std::unique_ptr<Collective> inner_;
};

// A device double for the engine's device paths without a GPU (a group in device memory: rows
// apart, device gathers): the CPU backend behind ComputeBackend's device contract, its "device
// memory" host memory. DeviceRows is laid out as the contract says (fp8-twin rows first, then
// bf16-exact ones, each in batch order), so rows sent in another order than a backend reads them
// give wrong answers here too.
class HostAsDeviceBackend : public ComputeBackend {
 public:
  explicit HostAsDeviceBackend(std::unique_ptr<ComputeBackend> cpu) : cpu_(std::move(cpu)) {}
  std::string name() const override { return "cpu-as-device"; }
  bool has_device_memory() const override { return true; }
  absl::StatusOr<LoadReport> Load(ShardWeights w) override {
    k_ = static_cast<size_t>(w.geo.hidden);
    shard_rows_ = w.geo.shard_rows;
    geo_ = w.geo;
    return cpu_->Load(std::move(w));
  }
  bool has_bf16() const override { return cpu_->has_bf16(); }
  void* DeviceRows(uint32_t rows) override {
    if (!launched_.empty()) return nullptr;  // a step in flight reads it
    if (drows_.size() < rows * k_) drows_.resize(rows * k_);
    return drows_.data();
  }
  absl::StatusOr<const uint16_t*> UploadRows(const BatchControl& ctl, const uint16_t* x) override {
    if (DeviceRows(ctl.rows) == nullptr) return absl::FailedPreconditionError("a batch in flight");
    const std::vector<uint32_t> at = Places(ctl);
    for (uint32_t i = 0; i < ctl.rows; ++i) std::copy_n(x + i * k_, k_, drows_.data() + at[i] * k_);
    return static_cast<const uint16_t*>(drows_.data());
  }
  absl::Status Launch(const BatchControl& ctl, const uint16_t* x, MemorySpace space) override {
    DH_RETURN_IF_ERROR(CheckDeviceRowsOut(ctl, geo_));
    const uint32_t rows = ctl.rows;
    in_.resize(rows * k_);
    if (x == drows_.data()) {
      if (!launched_.empty()) return absl::FailedPreconditionError("device rows behind a batch in flight");
      const std::vector<uint32_t> at = Places(ctl);
      for (uint32_t i = 0; i < rows; ++i)
        std::copy_n(drows_.data() + at[i] * k_, k_, in_.data() + i * k_);
    } else {
      std::copy_n(x, rows * k_, in_.data());
    }
    BatchControl host_ctl = ctl;  // the CPU backend computes; the rows out are copied here
    host_ctl.device_outs = 0;
    DH_RETURN_IF_ERROR(cpu_->Launch(host_ctl, in_.data(), MemorySpace::kHost));
    launched_.push_back({space, ctl});
    return absl::OkStatus();
  }
  // The rows out copied to their "device" destinations; a host payload handed back with their
  // blocks, and everything past HostPayloadBytes, overwritten (the contract leaves them
  // unspecified), so that an answer read from there shows.
  absl::StatusOr<const void*> Finish(const std::function<void()>& while_running) override {
    DH_ASSIGN_OR_RETURN(const void* p, cpu_->Finish(while_running));
    const auto [space, ctl] = launched_.front();
    launched_.pop_front();
    const auto* payload = static_cast<const uint8_t*>(p);
    const PayloadLayout layout = MakePayloadLayout(ctl.tasks, static_cast<int>(ctl.rows), shard_rows_);
    for (uint32_t i = 0; i < ctl.device_outs; ++i) {
      const DeviceRowsOut& o = ctl.device_out[i];
      const size_t width = static_cast<size_t>(geo_.valid_cols()) * OutDTypeBytes(ctl.tasks[o.row0].dtype);
      for (uint32_t r = 0; r < o.rows; ++r)
        std::memcpy(static_cast<uint8_t*>(o.dst) + r * o.dst_pitch, payload + layout.row_offset[o.row0 + r], width);
    }
    std::vector<uint8_t>& out = space == MemorySpace::kHost ? hpayloads_.Next() : dpayload_;
    out.assign(payload, payload + layout.bytes());
    if (space == MemorySpace::kHost) {
      std::fill(out.begin() + HostPayloadBytes(ctl, layout), out.end(), 0xA5);
      for (uint32_t i = 0; i < ctl.device_outs; ++i) {
        const DeviceRowsOut& o = ctl.device_out[i];
        std::fill(out.begin() + layout.row_offset[o.row0], out.begin() + layout.row_offset[o.row0 + o.rows], 0xA5);
      }
    }
    return static_cast<const void*>(out.data());
  }
  StageTimes stage_times() const override { return cpu_->stage_times(); }
  absl::StatusOr<void*> ScratchBuffer(size_t bytes, MemorySpace space) override {
    if (space == MemorySpace::kHost) return cpu_->ScratchBuffer(bytes, space);
    dscratch_.resize(bytes);
    return static_cast<void*>(dscratch_.data());
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, MemorySpace) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

 private:
  // Each row's place in the device layout.
  static std::vector<uint32_t> Places(const BatchControl& ctl) {
    std::vector<uint32_t> at(ctl.rows);
    uint32_t n = 0;
    for (RowHead head : {RowHead::kFp8Twin, RowHead::kBf16Exact})
      for (uint32_t i = 0; i < ctl.rows; ++i)
        if (ctl.tasks[i].head == head) at[i] = n++;
    return at;
  }

  std::unique_ptr<ComputeBackend> cpu_;
  size_t k_ = 0;
  int64_t shard_rows_ = 0;
  std::vector<uint16_t> drows_, in_;
  ShardGeometry geo_;
  std::vector<uint8_t> dpayload_, dscratch_;
  BufferRing<std::vector<uint8_t>, kHostPayloads> hpayloads_;
  std::deque<std::pair<MemorySpace, BatchControl>> launched_;
};

void StartLoop(Group& g) {
  g.loop_thread = std::thread([p = &g] { p->loop_status = p->loop->Run(); });
}

// start_loop false: the batcher queues, and nothing runs, until StartLoop.
std::unique_ptr<Group> StartGroup(const std::vector<uint16_t>& w, int64_t rows, int64_t k, int tp,
                                  int64_t vocab, bool keep_bf16, uint32_t max_rows = 64,
                                  BatcherOptions bopts = {}, const WrapCollective& wrap0 = nullptr,
                                  bool start_loop = true, bool device_doubles = false) {
  auto g = std::make_unique<Group>();
  auto shared = std::make_shared<InProcGroup>(tp);
  EngineOptions eo;
  eo.op_timeout = std::chrono::milliseconds(20000);
  eo.max_rows = static_cast<int>(max_rows);
  for (int r = 0; r < tp; ++r) {
    ShardGeometry geo = ShardGeometry::Make(tp, r, k, rows, vocab);
    BackendOptions bo;
    bo.threads = 1;
    bo.keep_bf16 = keep_bf16;
    std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(bo);
    if (device_doubles) backend = std::make_unique<HostAsDeviceBackend>(std::move(backend));
    ShardWeights sw;
    sw.geo = geo;
    sw.bf16.assign(static_cast<size_t>(geo.shard_rows) * k, 0);
    std::copy(w.begin() + geo.row_begin() * k, w.begin() + (geo.row_begin() + geo.rows_present()) * k,
              sw.bf16.begin());
    EXPECT_TRUE(backend->Load(std::move(sw)).ok());
    std::unique_ptr<Collective> comm = std::make_unique<InProcCollective>(shared, r, tp, device_doubles);
    if (r == 0 && wrap0) comm = wrap0(std::move(comm));
    g->engines.push_back(std::make_unique<RankEngine>(std::move(comm), std::move(backend), geo, eo));
  }
  g->geo0 = g->engines[0]->geometry();
  for (int r = 1; r < tp; ++r)
    g->workers.emplace_back([e = g->engines[r].get()] { EXPECT_TRUE(e->RunWorker().ok()); });
  bopts.max_rows = max_rows;
  g->batcher = std::make_unique<Batcher>(bopts);
  g->loop = std::make_unique<BatchLoop>(*g->engines[0], *g->batcher, nullptr, nullptr);
  if (start_loop) StartLoop(*g);
  g->limits.hidden = k;
  g->limits.vocab_size = vocab;
  g->limits.max_rows = max_rows;
  g->limits.max_top_k = 64;
  g->limits.has_bf16 = keep_bf16;
  return g;
}

struct Result {
  absl::Status status;
  v1::LogitsResponse resp;
};

std::future<Result> Submit(Group& g, const v1::LogitsRequest& req, bool may_run_inline = false,
                           std::thread::id* answered_on = nullptr) {
  auto p = std::make_shared<std::promise<Result>>();
  auto fut = p->get_future();
  auto prepared = PrepareRequest(req, g.limits);
  if (!prepared.ok()) {
    p->set_value({prepared.status(), {}});
    return fut;
  }
  BatchItem it;
  it.req = std::make_shared<const PreparedRequest>(std::move(prepared).value());
  it.enqueued = Clock::now();
  it.may_run_inline = may_run_inline;
  it.done = [p, req = it.req, answered_on](const absl::Status& s, const BatchRowsResult* r) {
    if (answered_on) *answered_on = std::this_thread::get_id();
    Result res{s, {}};
    if (r) BuildResponse(*req, *r, &res.resp);
    p->set_value(std::move(res));
  };
  g.batcher->Submit(std::move(it)).IgnoreError();
  return fut;
}

v1::LogitsRequest MakeRequest(const std::vector<uint16_t>& x, int rows, v1::Mode mode) {
  v1::LogitsRequest r;
  r.set_request_id(77);
  r.set_rows(rows);
  r.set_hidden(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 2));
  r.set_mode(mode);
  return r;
}

std::vector<float> FloatLogits(const v1::LogitsResponse& r) {
  std::vector<float> v(r.logits().size() / (r.logits_dtype() == v1::FP32 ? 4 : 2));
  if (r.logits_dtype() == v1::FP32) {
    std::memcpy(v.data(), r.logits().data(), r.logits().size());
  } else {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(r.logits().data());
    for (size_t i = 0; i < v.size(); ++i) v[i] = Bf16ToFloat(b[i]);
  }
  return v;
}

struct Case {
  int64_t rows, k;
  int tp;
  int64_t vocab;
  bool device = false;  // device doubles: in a group the rows travel apart (RankEngine)
};

class EngineTest : public ::testing::TestWithParam<Case> {};

TEST_P(EngineTest, EveryModeMatchesTheReference) {
  const Case c = GetParam();
  const auto w = ref::RandomBf16(c.rows * c.k, 1000 + c.tp, 0.05);
  auto g = StartGroup(w, c.rows, c.k, c.tp, c.vocab, /*keep_bf16=*/true, 64, {}, nullptr, true, c.device);
  for (int m : {1, 5, 17, 64}) {
    const auto x = ref::RandomBf16(static_cast<size_t>(m) * c.k, 7 * m + c.tp);
    const auto ref = ref::ReferenceLogits(w.data(), c.rows, c.k, c.tp, x.data(), m, c.vocab,
                                          ref::RefHead::kFp8Twin);
    // FULL_LOGITS fp32, within fp32 accumulation error of the float64 reference.
    auto full = MakeRequest(x, m, v1::FULL_LOGITS);
    full.set_logits_dtype(v1::FP32);
    auto f32 = Submit(*g, full);
    auto bf = Submit(*g, MakeRequest(x, m, v1::FULL_LOGITS));  // bf16, batched with the above
    Result r32 = f32.get(), rbf = bf.get();
    ASSERT_TRUE(r32.status.ok()) << r32.status;
    ASSERT_TRUE(rbf.status.ok()) << rbf.status;
    ASSERT_EQ(r32.resp.vocab_size(), c.vocab);
    ASSERT_EQ(r32.resp.logits().size(), static_cast<size_t>(m) * c.vocab * 4);
    ASSERT_EQ(rbf.resp.logits().size(), static_cast<size_t>(m) * c.vocab * 2);
    const auto y = FloatLogits(r32.resp);
    const auto ybf = FloatLogits(rbf.resp);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], ref.y[i], 1e-5 * ref.abs[i] + 1e-30) << "entry " << i << " m=" << m;
      ASSERT_EQ(ybf[i], Bf16ToFloat(FloatToBf16(y[i]))) << "bf16 logits are the rounded fp32 ones";
    }
    // Reductions equal the exact reductions of the same fp32 logits.
    v1::LogitsRequest topk = MakeRequest(x, m, v1::TOP_K);
    topk.set_top_k(std::min<int64_t>(8, c.vocab));
    topk.set_return_probs(true);
    topk.set_temperature(0.7f);
    v1::LogitsRequest arg = MakeRequest(x, m, v1::ARGMAX);
    v1::LogitsRequest smp = MakeRequest(x, m, v1::SAMPLE);
    smp.set_temperature(1.3f);
    smp.set_seed(12345);
    auto ft = Submit(*g, topk), fa = Submit(*g, arg), fs = Submit(*g, smp);
    Result rt = ft.get(), ra = fa.get(), rs = fs.get();
    ASSERT_TRUE(rt.status.ok() && ra.status.ok() && rs.status.ok()) << rt.status << ra.status << rs.status;
    const uint32_t k = topk.top_k();
    ASSERT_EQ(rt.resp.token_ids_size(), m * static_cast<int>(k));
    ASSERT_EQ(rt.resp.probs_size(), m * static_cast<int>(k));
    for (int i = 0; i < m; ++i) {
      std::vector<float> row(y.begin() + i * c.vocab, y.begin() + (i + 1) * c.vocab);
      const auto best = ref::RefTopK(row.data(), c.vocab, static_cast<int>(k));
      double zmax = -1e300, z = 0;
      for (float v : row) zmax = std::max(zmax, static_cast<double>(v / 0.7f));
      for (float v : row) z += std::exp(static_cast<double>(v / 0.7f) - zmax);
      for (uint32_t j = 0; j < k; ++j) {
        EXPECT_EQ(rt.resp.token_ids(i * k + j), best[j]) << "row " << i << " rank " << j;
        EXPECT_EQ(rt.resp.values(i * k + j), row[best[j]]);
        const double p = std::exp(static_cast<double>(row[best[j]] / 0.7f) - zmax) / z;
        EXPECT_NEAR(rt.resp.probs(i * k + j), p, 1e-5 * p + 1e-12);
      }
      EXPECT_EQ(ra.resp.token_ids(i), best[0]);
      const int32_t s = ref::RefSample(row.data(), c.vocab, 1.3f, 12345, static_cast<uint32_t>(i));
      EXPECT_EQ(rs.resp.token_ids(i), s) << "row " << i;
      EXPECT_EQ(rs.resp.values(i), row[s]);
    }
    // The bf16 head against its float64 reference.
    auto bfh = MakeRequest(x, m, v1::FULL_LOGITS);
    bfh.set_logits_dtype(v1::FP32);
    bfh.set_head(v1::BF16_EXACT);
    Result rb = Submit(*g, bfh).get();
    ASSERT_TRUE(rb.status.ok()) << rb.status;
    const auto refb = ref::ReferenceLogits(w.data(), c.rows, c.k, c.tp, x.data(), m, c.vocab,
                                           ref::RefHead::kBf16Exact);
    const auto yb = FloatLogits(rb.resp);
    for (size_t i = 0; i < yb.size(); ++i) ASSERT_NEAR(yb[i], refb.y[i], 1e-5 * refb.abs[i] + 1e-30);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, EngineTest,
                         ::testing::Values(Case{300, 64, 1, 300}, Case{300, 64, 2, 300},
                                           Case{300, 64, 3, 250}, Case{301, 256, 4, 301},
                                           Case{256, 64, 4, 200}, Case{128, 256, 4, 33},
                                           Case{300, 64, 2, 300, true}, Case{301, 256, 4, 250, true}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "rows" + std::to_string(c.rows) + "_k" + std::to_string(c.k) + "_tp" +
                                  std::to_string(c.tp) + "_vocab" + std::to_string(c.vocab) +
                                  (c.device ? "_device" : "");
                         });

TEST(EngineTest, SampleDoesNotDependOnTpOrBatchMates) {
  const int64_t rows = 512, k = 64;
  const auto w = ref::RandomBf16(rows * k, 5, 0.05);
  const auto x = ref::RandomBf16(5 * k, 6);
  std::vector<int32_t> first;
  for (int tp : {1, 2, 4}) {
    auto g = StartGroup(w, rows, k, tp, rows, false);
    auto smp = MakeRequest(x, 5, v1::SAMPLE);
    smp.set_temperature(1.0f);
    smp.set_seed(99);
    auto other = Submit(*g, MakeRequest(ref::RandomBf16(3 * k, tp), 3, v1::SAMPLE));
    Result r = Submit(*g, smp).get();
    other.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    std::vector<int32_t> ids(r.resp.token_ids().begin(), r.resp.token_ids().end());
    if (first.empty()) first = ids;
    EXPECT_EQ(ids, first) << "tp=" << tp;
  }
}

TEST(EngineTest, BatchedRequestsEqualTheSameRequestsAlone) {
  const int64_t rows = 400, k = 64;
  const auto w = ref::RandomBf16(rows * k, 9, 0.05);
  auto g = StartGroup(w, rows, k, 2, rows, false);
  std::vector<v1::LogitsRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    const int m = 1 + i % 5;
    auto r = MakeRequest(ref::RandomBf16(m * k, 100 + i), m,
                         static_cast<v1::Mode>(i % 4));
    r.set_top_k(3);
    r.set_temperature(0.9f);
    r.set_seed(i);
    reqs.push_back(r);
  }
  std::vector<Result> alone;
  for (const auto& r : reqs) alone.push_back(Submit(*g, r).get());
  // The same requests queued together before a second group's loop starts: batched whatever the
  // host's scheduling (submitted to a running loop, they might each run alone).
  auto together = StartGroup(w, rows, k, 2, rows, false, 64, {}, nullptr, /*start_loop=*/false);
  std::vector<std::future<Result>> futs;
  for (const auto& r : reqs) futs.push_back(Submit(*together, r));
  StartLoop(*together);
  uint32_t max_batch = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Result b = futs[i].get();
    ASSERT_TRUE(b.status.ok()) << b.status;
    max_batch = std::max(max_batch, b.resp.timing().batch_rows());
    EXPECT_EQ(b.resp.logits(), alone[i].resp.logits()) << i;
    EXPECT_EQ(std::vector<int32_t>(b.resp.token_ids().begin(), b.resp.token_ids().end()),
              std::vector<int32_t>(alone[i].resp.token_ids().begin(), alone[i].resp.token_ids().end())) << i;
    EXPECT_EQ(b.resp.rows(), reqs[i].rows());
  }
  EXPECT_GT(max_batch, 5u) << "concurrent requests should have been batched together";
}

// The engine's overlap: alone (tp = 1), while a batch computes the loop takes the next ready batch
// and writes its rows (BatchLoop's ahead). A backlog queued before the loop starts makes batches
// of at most 8 rows, each taken ahead of its predecessor's end; every answer equals the same
// request alone. In a group (tp = 2) nothing is taken ahead (the rows would go into the broadcast
// buffer) and the answers are the same.
// Also launched ahead (--launch-ahead: the engine has the next batch launched behind the one it
// finishes; alone only, so at tp = 2 nothing is launched ahead).
TEST(EngineTest, BatchesTakenAheadAnswerAsAlone) {
  const int64_t rows = 300, k = 64;
  const auto w = ref::RandomBf16(rows * k, 31, 0.05);
  for (auto [tp, launch] : {std::pair{1, false}, std::pair{1, true}, std::pair{2, true}}) {
    auto g = StartGroup(w, rows, k, tp, rows, false, 8, {}, nullptr, /*start_loop=*/false);
    g->loop = std::make_unique<BatchLoop>(*g->engines[0], *g->batcher, nullptr, nullptr, true, launch);
    std::vector<v1::LogitsRequest> reqs;
    for (int i = 0; i < 24; ++i) {
      const int m = 1 + i % 4;
      auto r = MakeRequest(ref::RandomBf16(m * k, 500 + i), m, static_cast<v1::Mode>(i % 4));
      r.set_top_k(3);
      r.set_temperature(0.8f);
      r.set_seed(i);
      reqs.push_back(r);
    }
    std::vector<std::future<Result>> futs;
    for (const auto& r : reqs) futs.push_back(Submit(*g, r));
    StartLoop(*g);
    std::vector<Result> batched;
    for (auto& f : futs) batched.push_back(f.get());
    const uint64_t ahead = g->loop->batches_taken_ahead(), launched = g->loop->batches_launched_ahead();
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Result alone = Submit(*g, reqs[i]).get();
      ASSERT_TRUE(batched[i].status.ok()) << batched[i].status;
      ASSERT_TRUE(alone.status.ok()) << alone.status;
      EXPECT_EQ(batched[i].resp.logits(), alone.resp.logits()) << "tp " << tp << ", request " << i;
      EXPECT_EQ(std::vector<int32_t>(batched[i].resp.token_ids().begin(), batched[i].resp.token_ids().end()),
                std::vector<int32_t>(alone.resp.token_ids().begin(), alone.resp.token_ids().end()))
          << "tp " << tp << ", request " << i;
      EXPECT_EQ(std::vector<float>(batched[i].resp.values().begin(), batched[i].resp.values().end()),
                std::vector<float>(alone.resp.values().begin(), alone.resp.values().end()))
          << "tp " << tp << ", request " << i;
      EXPECT_EQ(std::vector<float>(batched[i].resp.probs().begin(), batched[i].resp.probs().end()),
                std::vector<float>(alone.resp.probs().begin(), alone.resp.probs().end()))
          << "tp " << tp << ", request " << i;
    }
    if (tp == 1) {
      // 60 rows in batches of <= 8, queued at once: the next batch was full (ready) while most ran.
      EXPECT_GE(ahead, 5u);
      EXPECT_EQ(launched, launch ? ahead : 0u) << "every batch taken ahead is launched ahead";
    } else {
      EXPECT_EQ(ahead, 0u);
      EXPECT_EQ(launched, 0u);
    }
  }
}

// FULL_LOGITS into device memory (BatchItem::device_logits, as a CUDA logits_region gives): alone
// on a device backend the backend copies the rows there itself, batched with other requests and
// launched ahead or not, and the answer's builder writes nothing (the double poisons those rows of
// the host payload); in a group the engine leaves them to the builder. Either way the bytes equal
// the logits the same request gets in its response.
TEST(EngineTest, LogitsIntoDeviceMemoryAreWrittenByTheBackendAlone) {
  const int64_t rows = 300, k = 64, vocab = 290;
  const auto w = ref::RandomBf16(rows * k, 41, 0.05);
  for (auto [tp, launch] : {std::pair{1, false}, std::pair{1, true}, std::pair{2, false}}) {
    auto g = StartGroup(w, rows, k, tp, vocab, false, 16, {}, nullptr, /*start_loop=*/false,
                        /*device_doubles=*/true);
    g->loop = std::make_unique<BatchLoop>(*g->engines[0], *g->batcher, nullptr, nullptr, true, launch);
    struct Sent {
      v1::LogitsRequest req;
      std::vector<uint8_t> device;  // the destination, when the request names one
      bool on_device = false;
      std::future<Result> answer;
    };
    std::vector<Sent> sent(20);
    for (int i = 0; i < 20; ++i) {
      const int m = 1 + i % 3;
      Sent& s = sent[i];
      s.req = MakeRequest(ref::RandomBf16(m * k, 900 + i), m, i % 4 == 3 ? v1::TOP_K : v1::FULL_LOGITS);
      s.req.set_top_k(3);
      s.req.set_logits_dtype(i % 2 ? v1::FP32 : v1::BF16);
      auto prepared = PrepareRequest(s.req, g->limits);
      ASSERT_TRUE(prepared.ok()) << prepared.status();
      auto p = std::make_shared<std::promise<Result>>();
      s.answer = p->get_future();
      BatchItem it;
      it.req = std::make_shared<const PreparedRequest>(std::move(prepared).value());
      it.enqueued = Clock::now();
      if (i % 4 == 0 || i % 4 == 1) {  // the others: logits in the response
        const size_t row_bytes = static_cast<size_t>(vocab) * (i % 2 ? 4 : 2);
        s.device.assign(m * row_bytes, 0x5A);
        it.device_logits = s.device.data();
        it.device_logits_pitch = row_bytes;
      }
      it.done = [p, req = it.req, on = &s.on_device](const absl::Status& st, const BatchRowsResult* r) {
        Result res{st, {}};
        if (r) {
          *on = r->logits_on_device;
          BuildResponse(*req, *r, &res.resp);
        }
        p->set_value(std::move(res));
      };
      g->batcher->Submit(std::move(it)).IgnoreError();
    }
    StartLoop(*g);
    for (size_t i = 0; i < sent.size(); ++i) {
      Sent& s = sent[i];
      const Result batched = s.answer.get();
      ASSERT_TRUE(batched.status.ok()) << batched.status;
      const Result alone = Submit(*g, s.req).get();
      ASSERT_TRUE(alone.status.ok()) << alone.status;
      EXPECT_EQ(s.on_device, tp == 1 && !s.device.empty()) << "tp " << tp << ", request " << i;
      if (s.on_device) {
        EXPECT_EQ(std::string(s.device.begin(), s.device.end()), alone.resp.logits())
            << "tp " << tp << ", request " << i;
      } else {
        EXPECT_EQ(batched.resp.logits(), alone.resp.logits()) << "tp " << tp << ", request " << i;
        EXPECT_EQ(std::vector<int32_t>(batched.resp.token_ids().begin(), batched.resp.token_ids().end()),
                  std::vector<int32_t>(alone.resp.token_ids().begin(), alone.resp.token_ids().end()))
            << "tp " << tp << ", request " << i;
      }
    }
    if (tp == 1) {
      EXPECT_GE(g->loop->batches_taken_ahead(), 1u);
    }
  }
}

// The broadcast frame is agreed a step ahead (wire_format.h): batches that grow past it (a
// second broadcast), shrink, and a heartbeat between (after the 100 ms idle beat) must all
// reach the worker intact. Checked against the same requests at tp = 1 (nothing broadcast).
TEST(EngineTest, BatchesOfChangingSizeCrossTheGroupIntact) {
  const int64_t rows = 300, k = 64;
  const auto w = ref::RandomBf16(rows * k, 21, 0.05);
  auto solo = StartGroup(w, rows, k, 1, rows, false);
  auto pair = StartGroup(w, rows, k, 2, rows, false);
  int seed = 300;
  for (int m : {1, 64, 2, 64, 3, 1}) {
    if (m == 2) std::this_thread::sleep_for(std::chrono::milliseconds(150));  // a heartbeat
    auto r = MakeRequest(ref::RandomBf16(m * k, ++seed), m, v1::TOP_K);
    r.set_top_k(4);
    Result a = Submit(*solo, r).get(), b = Submit(*pair, r).get();
    ASSERT_TRUE(a.status.ok()) << a.status;
    ASSERT_TRUE(b.status.ok()) << m << " rows: " << b.status;
    EXPECT_EQ(std::vector<int32_t>(b.resp.token_ids().begin(), b.resp.token_ids().end()),
              std::vector<int32_t>(a.resp.token_ids().begin(), a.resp.token_ids().end())) << m;
    EXPECT_EQ(b.resp.timing().batch_rows(), static_cast<uint32_t>(m));
  }
}

// Rank 0's collective, counting the device broadcasts (rows apart) and their bytes, and holding
// the engine to PostGather's contract (the next call must be that Gather).
class CountingCollective : public ForwardingCollective {
 public:
  using ForwardingCollective::ForwardingCollective;
  absl::Status Broadcast(void* data, size_t bytes, MemorySpace space, std::chrono::milliseconds t) override {
    EXPECT_FALSE(posted_) << "a broadcast between PostGather and its Gather";
    if (space == MemorySpace::kDevice) {
      ++device_broadcasts;
      device_bytes += bytes;
    }
    return ForwardingCollective::Broadcast(data, bytes, space, t);
  }
  absl::Status Gather(const void* send, size_t bytes, void* recv, MemorySpace space,
                      std::chrono::milliseconds t) override {
    posted_ = false;
    return ForwardingCollective::Gather(send, bytes, recv, space, t);
  }
  absl::Status PostGather(void* recv, size_t bytes, MemorySpace space) override {
    posted_ = true;
    return ForwardingCollective::PostGather(recv, bytes, space);
  }
  std::atomic<int> device_broadcasts{0};
  std::atomic<size_t> device_bytes{0};

 private:
  bool posted_ = false;  // rank 0's engine thread only
};

// A group in device memory (NCCL with CUDA backends; here their doubles) sends each batch's rows
// apart, from rank 0's device buffer into the workers' (the rows never cross host memory): every
// mode and both heads, in batches of changing size with a heartbeat between, answer bit for bit as
// the same group with the rows in its message, and each batch's rows went in one device broadcast.
TEST(EngineTest, RowsApartAnswerAsRowsInTheMessage) {
  const int64_t rows = 300, k = 64;
  const auto w = ref::RandomBf16(rows * k, 23, 0.05);
  CountingCollective* counter = nullptr;
  auto apart = StartGroup(w, rows, k, 3, rows, /*keep_bf16=*/true, 64, {},
                          [&](std::unique_ptr<Collective> c) {
                            auto wrapped = std::make_unique<CountingCollective>(std::move(c));
                            counter = wrapped.get();
                            return std::unique_ptr<Collective>(std::move(wrapped));
                          },
                          true, /*device_doubles=*/true);
  auto plain = StartGroup(w, rows, k, 3, rows, /*keep_bf16=*/true);
  ASSERT_NE(counter, nullptr);
  int seed = 700;
  size_t want_bytes = 0;
  for (int m : {1, 7, 64, 2}) {
    if (m == 2) std::this_thread::sleep_for(std::chrono::milliseconds(150));  // a heartbeat
    // Requests of every mode and both heads, submitted together so that they batch.
    std::vector<v1::LogitsRequest> reqs;
    for (int i = 0; i < 5; ++i) {
      const int rows_i = std::max(1, m / (i + 1));
      auto r = MakeRequest(ref::RandomBf16(rows_i * k, ++seed), rows_i, static_cast<v1::Mode>(i % 4));
      r.set_top_k(5);
      r.set_return_probs(true);
      r.set_temperature(0.9f);
      r.set_seed(i);
      r.set_logits_dtype(v1::FP32);
      if (i % 2 == 1) r.set_head(v1::BF16_EXACT);
      reqs.push_back(r);
    }
    std::vector<Result> apart_answers;
    for (auto* g : {apart.get(), plain.get()}) {
      std::vector<std::future<Result>> futs;
      for (const auto& r : reqs) futs.push_back(Submit(*g, r));
      std::vector<Result> got;
      for (auto& f : futs) got.push_back(f.get());
      if (g == apart.get()) {
        for (const Result& r : got) want_bytes += static_cast<size_t>(r.resp.rows()) * k * 2;
        apart_answers.swap(got);
        continue;
      }
      for (size_t i = 0; i < reqs.size(); ++i) {
        const Result& a = apart_answers[i];
        ASSERT_TRUE(a.status.ok()) << a.status;
        ASSERT_TRUE(got[i].status.ok()) << got[i].status;
        EXPECT_EQ(a.resp.logits(), got[i].resp.logits()) << "m " << m << ", request " << i;
        EXPECT_EQ(std::vector<int32_t>(a.resp.token_ids().begin(), a.resp.token_ids().end()),
                  std::vector<int32_t>(got[i].resp.token_ids().begin(), got[i].resp.token_ids().end()))
            << "m " << m << ", request " << i;
        EXPECT_EQ(std::vector<float>(a.resp.values().begin(), a.resp.values().end()),
                  std::vector<float>(got[i].resp.values().begin(), got[i].resp.values().end()));
        EXPECT_EQ(std::vector<float>(a.resp.probs().begin(), a.resp.probs().end()),
                  std::vector<float>(got[i].resp.probs().begin(), got[i].resp.probs().end()));
      }
    }
  }
  EXPECT_GT(counter->device_broadcasts.load(), 0);
  EXPECT_EQ(counter->device_bytes.load(), want_bytes) << "every batch's rows, once, in device broadcasts";
}

// A batch of n fp8 rows of one mode, fp32 out, as the batch loop fills BatchControl (k: 4 for
// TOP_K, 1 for ARGMAX / SAMPLE, 0 for full logits).
BatchControl Control(uint32_t n, RowMode mode) {
  BatchControl c;
  c.rows = n;
  const uint32_t k = mode == RowMode::kTopK ? 4u : mode == RowMode::kFullLogits ? 0u : 1u;
  for (uint32_t i = 0; i < n; ++i) c.tasks[i] = RowTask{mode, RowHead::kFp8Twin, OutDType::kFp32, 0, k, 1.f, i, 0};
  return c;
}

// ComputeBackend's two-call form (the CPU backend, the reference for the CUDA one): two batches
// launched finish in launch order with the payloads they have alone, a third launch waits for a
// finish, and a payload stays intact until kHostPayloads more batches were launched.
TEST(EngineTest, LaunchedBatchesFinishInOrderAndPayloadsTakeTurns) {
  const int64_t rows = 300, k = 64;
  const auto w = ref::RandomBf16(rows * k, 21, 0.05);
  BackendOptions bo;
  bo.threads = 1;
  auto be = MakeCpuBackend(bo);
  ShardWeights sw;
  sw.geo = ShardGeometry::Make(1, 0, k, rows, rows);
  sw.bf16 = w;
  ASSERT_TRUE(be->Load(std::move(sw)).ok());
  const BatchControl ctl[3] = {Control(3, RowMode::kFullLogits), Control(5, RowMode::kTopK),
                               Control(2, RowMode::kArgmax)};
  std::vector<uint16_t> x[3];
  std::vector<uint8_t> alone[3];
  for (int b = 0; b < 3; ++b) {
    x[b] = ref::RandomBf16(ctl[b].rows * k, 40 + b);
    auto p = be->Run(ctl[b], x[b].data(), MemorySpace::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    const size_t bytes = MakePayloadLayout(ctl[b].tasks, ctl[b].rows, rows).bytes();
    alone[b].assign(static_cast<const uint8_t*>(*p), static_cast<const uint8_t*>(*p) + bytes);
  }
  auto same = [&](const void* p, int b) {
    const auto* q = static_cast<const uint8_t*>(p);
    return std::vector<uint8_t>(q, q + alone[b].size()) == alone[b];
  };
  ASSERT_TRUE(be->Launch(ctl[0], x[0].data(), MemorySpace::kHost).ok());
  ASSERT_TRUE(be->Launch(ctl[1], x[1].data(), MemorySpace::kHost).ok());
  EXPECT_EQ(be->Launch(ctl[2], x[2].data(), MemorySpace::kHost).code(), absl::StatusCode::kFailedPrecondition);
  int calls = 0;
  auto p0 = be->Finish([&] { ++calls; });
  ASSERT_TRUE(p0.ok()) << p0.status();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(same(*p0, 0));
  // Launched from the finishing batch's while_running, as the batch loop does.
  auto p1 = be->Finish([&] { ASSERT_TRUE(be->Launch(ctl[2], x[2].data(), MemorySpace::kHost).ok()); });
  ASSERT_TRUE(p1.ok()) << p1.status();
  auto p2 = be->Finish(nullptr);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_TRUE(same(*p1, 1));
  EXPECT_TRUE(same(*p2, 2));
  EXPECT_TRUE(same(*p0, 0)) << "the first payload was reused before kHostPayloads launches";
  EXPECT_EQ(be->Finish(nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
}

// RunBatch's payload (and layout) of one batch stays as it was while the next batch runs: the
// completer answers from it meanwhile, without a copy (alone: the backend's two host payloads; in a
// group: the two gather buffers).
TEST(EngineTest, APayloadStaysIntactWhileTheNextBatchRuns) {
  const int64_t rows = 300, k = 64;
  const auto w = ref::RandomBf16(rows * k, 21, 0.05);
  for (int tp : {1, 2}) {
    auto g = StartGroup(w, rows, k, tp, rows, false, 64, {}, nullptr, /*start_loop=*/false);
    RankEngine& e = *g->engines[0];
    const BatchControl a = Control(3, RowMode::kFullLogits), b = Control(5, RowMode::kTopK);
    const auto xa = ref::RandomBf16(3 * k, 31), xb = ref::RandomBf16(5 * k, 32);
    auto ga = e.RunBatch(a, xa.data());
    ASSERT_TRUE(ga.ok()) << ga.status();
    const size_t bytes = ga->per_rank_bytes * tp;
    const std::vector<uint8_t> kept(ga->data, ga->data + bytes);
    const std::vector<size_t> kept_offsets = ga->layout->row_offset;
    auto gb = e.RunBatch(b, xb.data());
    ASSERT_TRUE(gb.ok()) << gb.status();
    EXPECT_NE(gb->data, ga->data) << "tp " << tp;
    EXPECT_EQ(std::vector<uint8_t>(ga->data, ga->data + bytes), kept) << "tp " << tp << ": batch a's payload moved";
    EXPECT_EQ(ga->layout->row_offset, kept_offsets) << "tp " << tp << ": batch a's layout changed";
    // And the next batch may reuse a's buffers again.
    auto gc = e.RunBatch(a, xa.data());
    ASSERT_TRUE(gc.ok()) << gc.status();
    EXPECT_EQ(std::vector<uint8_t>(gc->data, gc->data + bytes), kept) << "tp " << tp;
    ASSERT_TRUE(e.Shutdown().ok());
  }
}

// Rank 0's collective with a gate: once armed, the next Broadcast (a batch or the idle heartbeat,
// both on the thread that holds the engine) waits until the gate opens, so a test knows the engine
// is held.
class GatedCollective : public ForwardingCollective {
 public:
  using ForwardingCollective::ForwardingCollective;
  void Arm() {
    absl::MutexLock l(&mu_);
    armed_ = true;
  }
  void WaitEntered() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&entered_));
  }
  void Open() {
    absl::MutexLock l(&mu_);
    open_ = true;
  }
  absl::Status Broadcast(void* data, size_t bytes, MemorySpace space, std::chrono::milliseconds t) override {
    {
      absl::MutexLock l(&mu_);
      if (armed_) {
        armed_ = false;
        entered_ = true;
        mu_.Await(absl::Condition(&open_));
      }
    }
    return ForwardingCollective::Broadcast(data, bytes, space, t);
  }

 private:
  absl::Mutex mu_;
  bool armed_ = false, entered_ = false, open_ = false;
};

// A request that may run inline runs on the submitting thread when the engine is idle (Submit
// returns answered); one submitted while the engine is held queues and is answered by the loop;
// every answer equals the request's answer through the queue.
TEST(EngineTest, InlineRunsUseAnIdleEngineAndQueueBehindABusyOne) {
  const int64_t rows = 300, k = 64;
  const auto w = ref::RandomBf16(rows * k, 21, 0.05);
  GatedCollective* gate = nullptr;
  auto g = StartGroup(w, rows, k, 2, rows, false, 64, {}, [&](std::unique_ptr<Collective> c) {
    auto gc = std::make_unique<GatedCollective>(std::move(c));
    gate = gc.get();
    return gc;
  });
  auto req = MakeRequest(ref::RandomBf16(3 * k, 5), 3, v1::TOP_K);
  req.set_top_k(4);
  const Result queued = Submit(*g, req).get();
  ASSERT_TRUE(queued.status.ok()) << queued.status;
  const std::vector<int32_t> expect(queued.resp.token_ids().begin(), queued.resp.token_ids().end());
  ASSERT_EQ(expect.size(), 12u);
  auto ids = [](const Result& r) { return std::vector<int32_t>(r.resp.token_ids().begin(), r.resp.token_ids().end()); };

  // Idle engine: answered before Submit returns, on this thread. The loop answers a queued batch
  // while it still holds the engine, and on a loaded machine the woken caller can submit before
  // the loop lets go (CI's ASan stage saw 20 tries in a row queue that way); the idle heartbeat may
  // hold it too. So each try first gives the loop time to let go.
  int inline_runs = 0;
  for (int attempt = 0; attempt < 20 && inline_runs == 0; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * (attempt + 1)));
    std::thread::id on;
    auto f = Submit(*g, req, true, &on);
    const bool ready_at_once = f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    const Result r = f.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(ids(r), expect);
    if (ready_at_once && on == std::this_thread::get_id()) ++inline_runs;
  }
  EXPECT_EQ(inline_runs, 1) << "no request ran on the submitting thread";

  // The loop holds the engine (trapped in its next broadcast): this request queues behind it.
  gate->Arm();
  gate->WaitEntered();
  std::thread::id on;
  auto f = Submit(*g, req, true, &on);
  EXPECT_NE(f.wait_for(std::chrono::milliseconds(50)), std::future_status::ready) << "ran past a busy engine";
  gate->Open();
  const Result r = f.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_NE(on, std::this_thread::get_id()) << "answered by the loop, not the submitting thread";
  EXPECT_EQ(ids(r), expect);
}

// Rank 0 of a two-rank group (K = 64, 64 rows) whose rank 1 never takes part: every collective
// call times out after 300 ms.
std::unique_ptr<RankEngine> StalledRank0() {
  auto shared = std::make_shared<InProcGroup>(2);
  EngineOptions eo;
  eo.op_timeout = std::chrono::milliseconds(300);
  BackendOptions bo;
  bo.threads = 1;
  auto backend = MakeCpuBackend(bo);
  ShardGeometry geo = ShardGeometry::Make(2, 0, 64, 64, 64);
  ShardWeights sw;
  sw.geo = geo;
  sw.bf16.assign(32 * 64, 0);
  EXPECT_TRUE(backend->Load(std::move(sw)).ok());
  return std::make_unique<RankEngine>(std::make_unique<InProcCollective>(shared, 0, 2), std::move(backend), geo, eo);
}

TEST(EngineTest, AStalledWorkerFailsTheBatchWithinTheTimeout) {
  // Rank 1 never joins the collective: rank 0's first broadcast must time out, not hang.
  auto engine = StalledRank0();
  RankEngine& e = *engine;
  Batcher b(BatcherOptions{});
  absl::Status failure;
  BatchLoop loop(e, b, nullptr, [&](const absl::Status& s) { failure = s; });
  const auto t0 = Clock::now();
  absl::Status s = loop.Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  // The batcher is closed: a new request fails at once with UNAVAILABLE.
  BatchItem it;
  auto p = std::make_shared<PreparedRequest>();
  p->rows = 1;
  it.req = p;
  absl::Status got;
  it.done = [&](const absl::Status& st, const BatchRowsResult*) { got = st; };
  b.Submit(std::move(it)).IgnoreError();
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
}

// A group that fails under inline runs and queued ones alike is reported once: every request is
// answered UNAVAILABLE, on_failure runs once, Run returns the failure, later requests are refused.
TEST(EngineTest, AGroupFailingUnderInlineRunsFailsOnce) {
  auto engine = StalledRank0();
  RankEngine& e = *engine;
  Batcher b(BatcherOptions{});
  std::atomic<int> failures{0};
  BatchLoop loop(e, b, nullptr, [&](const absl::Status&) { ++failures; });
  absl::Status run;
  std::thread loop_thread([&] { run = loop.Run(); });
  ServingLimits limits;
  limits.hidden = 64;
  limits.vocab_size = 64;
  limits.max_rows = 64;
  limits.max_top_k = 8;
  auto req = MakeRequest(ref::RandomBf16(64, 3), 1, v1::ARGMAX);
  std::vector<std::thread> callers;
  std::vector<absl::Status> got(4);
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&, i] {
      auto prepared = PrepareRequest(req, limits);
      ASSERT_TRUE(prepared.ok()) << prepared.status();
      BatchItem it;
      it.req = std::make_shared<const PreparedRequest>(std::move(prepared).value());
      it.enqueued = Clock::now();
      it.may_run_inline = true;
      std::promise<absl::Status> done;
      it.done = [&done](const absl::Status& s, const BatchRowsResult*) { done.set_value(s); };
      b.Submit(std::move(it)).IgnoreError();
      got[i] = done.get_future().get();
    });
  }
  for (auto& t : callers) t.join();
  loop_thread.join();
  for (const absl::Status& s : got) EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(run.code(), absl::StatusCode::kUnavailable) << run;
  EXPECT_NE(run.message().find("the rank group failed"), absl::string_view::npos) << run;
  EXPECT_EQ(run.message().find("failed: the rank group failed"), absl::string_view::npos) << "worded twice: " << run;
}

}  // namespace
}  // namespace drafthead
