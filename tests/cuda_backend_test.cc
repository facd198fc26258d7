// The CUDA backend end to end (Load -> Run -> payload) against the CPU reductions and float64
// references, and the NCCL collective on one GPU. Skips (GTEST_SKIP) where no GPU is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/shard_reduce.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/numeric.h"
#include "server/backends/compute_backend.h"
#include "server/group/wire_format.h"
#include "server/comm/nccl_collective.h"
#include "server/comm/rendezvous.h"

namespace drafthead {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define DH_SKIP_WITHOUT_GPU()                                                      \
  do {                                                                             \
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA GPU on this machine (cudaGetDeviceCount failed or 0)"; \
  } while (0)

float Gauss(uint64_t seed, uint64_t i) {
  const uint64_t h1 = Mix64(seed * 0x9e3779b97f4a7c15ull + i), h2 = Mix64(h1 ^ 0x1234567ull);
  const float u = static_cast<float>(h1 & 0xffffff) + static_cast<float>(h1 >> 40) +
                  static_cast<float>(h2 & 0xffffff) + static_cast<float>(h2 >> 40);
  return (u * 5.9604644775390625e-8f - 2.0f) * 1.7320508f;
}

// Rank 3 of tp=4 over a 129280-row head cropped to 129000: a shard with 32040 valid columns.
// Built once per process (its CPU twin takes seconds; the tests run with --gtest_repeat=50).
ShardWeights BuildShard(bool with_twin) {
  ShardWeights w;
  w.geo = ShardGeometry::Make(4, 3, 5120, 129280, 129000);
  const int64_t S = w.geo.shard_rows, K = w.geo.hidden;
  w.bf16.resize(static_cast<size_t>(S) * K);
  std::vector<std::thread> ts;
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  for (int t = 0; t < nt; ++t)
    ts.emplace_back([&, t] {
      for (int64_t r = t; r < S; r += nt)
        for (int64_t c = 0; c < K; ++c)
          w.bf16[r * K + c] = FloatToBf16(0.02f * Gauss(5, static_cast<uint64_t>(r) * K + c));
    });
  for (auto& t : ts) t.join();
  if (with_twin) {
    cpu::ThreadPool pool(0);
    w.codes.resize(w.bf16.size());
    w.exps.resize(cpu::TwinExpRows(S) * (K / 32));
    cpu::MakeTwin(w.bf16.data(), S, K, w.codes.data(), w.exps.data(), pool);
  }
  return w;
}

// A payload (host memory) as its answers: a block's alignment padding is never written (it keeps
// whatever the buffer held, and the payload's readers never look at it), so it is zeroed in the copy.
std::vector<uint8_t> Answers(const std::vector<RowTask>& tasks, const void* payload, int64_t S) {
  BatchControl ctl{};
  ctl.rows = static_cast<uint32_t>(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) ctl.tasks[i] = tasks[i];
  const PayloadLayout layout = MakePayloadLayout(ctl.tasks, ctl.rows, S);
  const auto* p = static_cast<const uint8_t*>(payload);
  std::vector<uint8_t> v(p, p + layout.bytes());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const RowTask& t = tasks[i];
    const size_t answer = t.mode == RowMode::kFullLogits
                              ? static_cast<size_t>(S) * (t.dtype == OutDType::kBf16 ? 2 : 4)
                              : sizeof(SoftmaxPartial) + t.k * sizeof(Candidate);
    std::fill(v.begin() + layout.row_offset[i] + answer, v.begin() + layout.row_offset[i + 1], 0);
  }
  return v;
}

ShardWeights MakeShard(bool with_twin) {
  if (!with_twin) {
    static const ShardWeights plain = BuildShard(false);
    return plain;
  }
  static const ShardWeights twin = BuildShard(true);
  return twin;
}

RowTask Task(RowMode mode, RowHead head, uint32_t k = 1, OutDType dt = OutDType::kFp32,
             float temp = 1.f, uint64_t seed = 0, uint32_t rir = 0) {
  RowTask t{};
  t.mode = mode;
  t.head = head;
  t.dtype = dt;
  t.want_probs = mode == RowMode::kTopK;
  t.k = mode == RowMode::kFullLogits ? 0 : k;
  t.temperature = temp;
  t.row_in_request = rir;
  t.seed = seed;
  return t;
}

double Dot64(const uint16_t* x, const ShardWeights& w, int64_t n, bool twin, double* abs) {
  const int64_t K = w.geo.hidden;
  double s = 0, a = 0;
  for (int64_t c = 0; c < K; ++c) {
    double wv;
    if (twin) {
      const int e = static_cast<int>(w.exps[(n / 32) * (K / 32) + c / 32]) - 127;
      wv = std::ldexp(static_cast<double>(E4m3ToFloat(w.codes[n * K + c])), e);
    } else {
      wv = Bf16ToFloat(w.bf16[n * K + c]);
    }
    const double p = Bf16ToFloat(x[c]) * wv;
    s += p;
    a += std::fabs(p);
  }
  *abs = a;
  return s;
}

TEST(CudaBackend, PayloadMatchesCpuReductionsAndReferences) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);  // the CPU twin, for the references
  ShardWeights w = host;
  w.codes.clear();
  w.exps.clear();  // the backend builds the twin on the GPU
  BackendOptions opt;
  opt.device = 0;
  opt.keep_bf16 = true;
  auto be = MakeCudaBackend(opt, 0);
  ASSERT_TRUE(be.ok()) << be.status();
  auto rep = (*be)->Load(std::move(w));
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_GT(rep->twin_seconds, 0);
  EXPECT_TRUE((*be)->has_bf16());
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden;
  const int64_t valid = host.geo.valid_cols();
  const int32_t base = static_cast<int32_t>(host.geo.row_begin());

  BatchControl ctl{};
  std::vector<RowTask> tasks = {
      Task(RowMode::kFullLogits, RowHead::kFp8Twin),
      Task(RowMode::kFullLogits, RowHead::kFp8Twin, 0, OutDType::kBf16),
      Task(RowMode::kTopK, RowHead::kFp8Twin, 8, OutDType::kFp32, 0.7f),
      Task(RowMode::kArgmax, RowHead::kFp8Twin),
      Task(RowMode::kSample, RowHead::kFp8Twin, 1, OutDType::kFp32, 0.9f, 77, 3),
      Task(RowMode::kFullLogits, RowHead::kBf16Exact),
      Task(RowMode::kTopK, RowHead::kBf16Exact, 1024),
      Task(RowMode::kTopK, RowHead::kFp8Twin, 1000),
  };
  const int rows = static_cast<int>(tasks.size());
  ctl.rows = rows;
  for (int i = 0; i < rows; ++i) ctl.tasks[i] = tasks[i];
  // Every row carries the same hidden state, so row 0 (fp8) and row 5 (bf16) give the logits the
  // reductions must be computed from.
  std::vector<uint16_t> x(static_cast<size_t>(rows) * K);
  for (int64_t c = 0; c < K; ++c) x[c] = FloatToBf16(Gauss(9, c));
  for (int i = 1; i < rows; ++i) std::memcpy(&x[i * K], &x[0], K * 2);

  auto out = (*be)->Run(ctl, x.data(), MemorySpace::kHost);
  ASSERT_TRUE(out.ok()) << out.status();
  const PayloadLayout lay = MakePayloadLayout(ctl.tasks, rows, S);
  std::vector<uint8_t> p(lay.bytes());
  std::memcpy(p.data(), *out, p.size());

  std::vector<float> y8(S), yb(S);
  std::memcpy(y8.data(), p.data() + lay.row_offset[0], S * 4);
  std::memcpy(yb.data(), p.data() + lay.row_offset[5], S * 4);
  for (int64_t n = 0; n < S; n += 7) {
    double ab;
    const double r8 = Dot64(x.data(), host, n, true, &ab);
    ASSERT_LE(std::fabs(y8[n] - r8), 4 * std::ldexp(1.0, -23) * std::sqrt(double(K)) * ab + 1e-30) << n;
    const double rb = Dot64(x.data(), host, n, false, &ab);
    ASSERT_LE(std::fabs(yb[n] - rb), 4 * std::ldexp(1.0, -23) * std::sqrt(double(K)) * ab + 1e-30) << n;
  }
  for (int64_t n = 0; n < S; ++n) {
    uint16_t v;
    std::memcpy(&v, p.data() + lay.row_offset[1] + 2 * n, 2);
    ASSERT_EQ(v, FloatToBf16(y8[n])) << n;
  }
  auto expect_cands = [&](int row, const float* y) {
    const RowTask& t = tasks[row];
    std::vector<Candidate> want(t.k);
    SoftmaxPartial wp{0.f, 0.f};
    if (t.mode == RowMode::kTopK) cpu::ShardTopK(y, valid, base, t.k, t.temperature, want.data(), &wp);
    if (t.mode == RowMode::kArgmax) cpu::ShardArgmax(y, valid, base, want.data());
    if (t.mode == RowMode::kSample)
      cpu::ShardSample(y, valid, base, t.temperature, t.seed, t.row_in_request, want.data());
    SoftmaxPartial gp;
    std::memcpy(&gp, p.data() + lay.row_offset[row], sizeof(gp));
    EXPECT_EQ(gp.max_scaled, wp.max_scaled) << row;
    EXPECT_NEAR(gp.sum_exp, wp.sum_exp, 1e-6 * std::fabs(wp.sum_exp)) << row;
    for (uint32_t q = 0; q < t.k; ++q) {
      Candidate g;
      std::memcpy(&g, p.data() + lay.row_offset[row] + sizeof(SoftmaxPartial) + q * sizeof(Candidate),
                  sizeof(g));
      ASSERT_EQ(g.id, want[q].id) << "row " << row << " rank " << q;
      ASSERT_EQ(g.key, want[q].key) << "row " << row << " rank " << q;
      ASSERT_EQ(g.logit, want[q].logit) << "row " << row << " rank " << q;
    }
  };
  for (int row : {2, 3, 4, 7}) expect_cands(row, y8.data());
  expect_cands(6, yb.data());

  // The payload in device memory is the same bytes.
  auto dout = (*be)->Run(ctl, x.data(), MemorySpace::kDevice);
  ASSERT_TRUE(dout.ok()) << dout.status();
  std::vector<uint8_t> pd(lay.bytes());
  ASSERT_TRUE((*be)->CopyToHost(pd.data(), *dout, pd.size(), MemorySpace::kDevice).ok());
  EXPECT_EQ(Answers(tasks, pd.data(), S), Answers(tasks, p.data(), S));

  // A backend given the CPU-built twin computes the same payload for the fp8 rows.
  ShardWeights w2 = host;
  BackendOptions opt2;
  opt2.device = 0;
  auto be2 = MakeCudaBackend(opt2, 0);
  ASSERT_TRUE(be2.ok()) << be2.status();
  auto rep2 = (*be2)->Load(std::move(w2));
  ASSERT_TRUE(rep2.ok()) << rep2.status();
  EXPECT_FALSE((*be2)->has_bf16());
  BatchControl ctl8 = ctl;
  ctl8.rows = 5;
  auto out2 = (*be2)->Run(ctl8, x.data(), MemorySpace::kHost);
  ASSERT_TRUE(out2.ok()) << out2.status();
  const std::vector<RowTask> tasks8(tasks.begin(), tasks.begin() + 5);
  EXPECT_EQ(Answers(tasks8, *out2, S), Answers(tasks8, p.data(), S));

  // Refusals: the bf16 head was not kept; k past the supported maximum.
  auto bad = (*be2)->Run(ctl, x.data(), MemorySpace::kHost);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
  BatchControl big = ctl8;
  big.rows = 1;
  big.tasks[0] = Task(RowMode::kTopK, RowHead::kFp8Twin, 2000);
  auto bad2 = (*be2)->Run(big, x.data(), MemorySpace::kHost);
  EXPECT_EQ(bad2.status().code(), absl::StatusCode::kInvalidArgument) << bad2.status();

  // Scratch buffers in both spaces.
  auto sd = (*be2)->ScratchBuffer(1 << 20, MemorySpace::kDevice);
  auto sh = (*be2)->ScratchBuffer(1 << 20, MemorySpace::kHost);
  EXPECT_TRUE(sd.ok() && sh.ok());
}

TEST(CudaBackend, ManyRowsInOneBatch) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);
  auto be = MakeCudaBackend(BackendOptions{0, 0, false}, 0);
  ASSERT_TRUE(be.ok()) << be.status();
  ShardWeights w = host;
  ASSERT_TRUE((*be)->Load(std::move(w)).ok());
  const int rows = 100;  // more than one 64-row GEMV pass
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden;
  BatchControl ctl{};
  ctl.rows = rows;
  std::vector<uint16_t> x(static_cast<size_t>(rows) * K);
  for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(Gauss(4, i));
  for (int i = 0; i < rows; ++i) ctl.tasks[i] = Task(RowMode::kFullLogits, RowHead::kFp8Twin);
  auto out = (*be)->Run(ctl, x.data(), MemorySpace::kHost);
  ASSERT_TRUE(out.ok()) << out.status();
  const float* y = static_cast<const float*>(*out);
  for (int r : {0, 63, 64, 99}) {
    for (int64_t n : {int64_t{0}, int64_t{12345}, S - 1}) {
      double ab;
      const double ref = Dot64(&x[r * K], host, n, true, &ab);
      EXPECT_LE(std::fabs(y[r * S + n] - ref), 4 * std::ldexp(1.0, -23) * std::sqrt(double(K)) * ab)
          << r << " " << n;
    }
  }
}

// The modes a row can ask for, each a row of its own in the batch-invariance test.
std::vector<RowTask> EveryMode() {
  return {
      Task(RowMode::kFullLogits, RowHead::kFp8Twin),
      Task(RowMode::kFullLogits, RowHead::kFp8Twin, 0, OutDType::kBf16),
      Task(RowMode::kTopK, RowHead::kFp8Twin, 8, OutDType::kFp32, 0.7f),
      Task(RowMode::kTopK, RowHead::kFp8Twin, 64),
      Task(RowMode::kTopK, RowHead::kFp8Twin, 100, OutDType::kFp32, 1.3f),
      Task(RowMode::kArgmax, RowHead::kFp8Twin),
      Task(RowMode::kSample, RowHead::kFp8Twin, 1, OutDType::kFp32, 0.9f, 77, 2),
  };
}

// One Run's payload bytes, copied out (the backend reuses its buffer).
std::vector<uint8_t> RunPayload(ComputeBackend& be, const std::vector<RowTask>& tasks,
                                const std::vector<uint16_t>& x, int64_t S) {
  BatchControl ctl{};
  ctl.rows = static_cast<uint32_t>(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) ctl.tasks[i] = tasks[i];
  auto out = be.Run(ctl, x.data(), MemorySpace::kHost);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  return Answers(tasks, *out, S);
}

// A row's answer does not depend on its batch mates: every mode, alone and first or last in
// batches of 2..64 rows of mixed modes, gives the same answer bytes (the GEMV and every
// epilogue kernel: a split chunk chosen from the batch's rows once changed the softmax sums). And
// the captured CUDA graphs give the eager launches' bytes, also when a graph is replayed for a
// later batch of the same shape with other rows and other modes.
// The default step (graphs, the upload by a kernel, timing events off the chain, small host
// payloads written by the epilogue) against eager launches with the copy engine both ways, and
// against graphs of the copy-engine step with the events in the chain.
TEST(CudaBackend, EveryModeIsBatchInvariantAndGraphsMatchEagerLaunches) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden;
  BackendOptions graphs;
  graphs.device = 0;
  BackendOptions eager = graphs;
  eager.cuda_graphs = false;
  eager.cuda_upload_by_kernel = false;
  eager.cuda_direct_payload_max = 0;
  BackendOptions copy_graphs = eager;
  copy_graphs.cuda_graphs = true;
  copy_graphs.cuda_timing_off_path = false;
  auto gb = MakeCudaBackend(graphs, 0);
  auto eb = MakeCudaBackend(eager, 0);
  auto cb = MakeCudaBackend(copy_graphs, 0);
  ASSERT_TRUE(gb.ok() && eb.ok() && cb.ok());
  ShardWeights w1 = host, w2 = host, w3 = host;
  ASSERT_TRUE((*gb)->Load(std::move(w1)).ok());
  ASSERT_TRUE((*eb)->Load(std::move(w2)).ok());
  ASSERT_TRUE((*cb)->Load(std::move(w3)).ok());
  const std::vector<RowTask> modes = EveryMode();
  auto hidden = [&](uint64_t seed) {
    std::vector<uint16_t> r(K);
    for (int64_t c = 0; c < K; ++c) r[c] = FloatToBf16(Gauss(seed, c));
    return r;
  };
  const std::vector<uint16_t> subject = hidden(100);
  for (size_t m = 0; m < modes.size(); ++m) {
    const std::vector<uint8_t> alone = RunPayload(**gb, {modes[m]}, subject, S);
    ASSERT_EQ(alone, RunPayload(**eb, {modes[m]}, subject, S)) << "mode " << m << " alone";
    ASSERT_EQ(alone, RunPayload(**cb, {modes[m]}, subject, S)) << "mode " << m << " alone, copy";
    for (int n : {2, 5, 17, 64}) {
      for (int pos : {0, n - 1}) {
        std::vector<RowTask> tasks;
        std::vector<uint16_t> x;
        for (int i = 0; i < n; ++i) {
          // Mates of every mode (and a second copy of this one), each with its own hidden row.
          tasks.push_back(i == pos ? modes[m] : modes[(m + i * 3 + n) % modes.size()]);
          const std::vector<uint16_t> r = i == pos ? subject : hidden(1000 + 97 * n + i + pos);
          x.insert(x.end(), r.begin(), r.end());
        }
        const std::vector<uint8_t> got = RunPayload(**gb, tasks, x, S);
        ASSERT_EQ(got, RunPayload(**eb, tasks, x, S)) << "graph vs eager: mode " << m << ", " << n
                                                      << " rows, position " << pos;
        ASSERT_EQ(got, RunPayload(**cb, tasks, x, S)) << "default vs copy-engine graphs: mode " << m
                                                      << ", " << n << " rows, position " << pos;
        BatchControl ctl{};
        ctl.rows = static_cast<uint32_t>(n);
        for (int i = 0; i < n; ++i) ctl.tasks[i] = tasks[i];
        const PayloadLayout layout = MakePayloadLayout(ctl.tasks, ctl.rows, S);
        // The row's answer, without the block's alignment padding (never written: it keeps
        // whatever the buffer held, as the payload's readers never look at it).
        const RowTask& t = modes[m];
        const size_t answer = t.mode == RowMode::kFullLogits
                                  ? static_cast<size_t>(S) * (t.dtype == OutDType::kBf16 ? 2 : 4)
                                  : sizeof(SoftmaxPartial) + t.k * sizeof(Candidate);
        ASSERT_LE(answer, alone.size());
        const auto row = got.begin() + layout.row_offset[pos];
        ASSERT_TRUE(std::equal(row, row + answer, alone.begin()))
            << "mode " << m << " in a batch of " << n << " at position " << pos;
      }
    }
  }
}

// Rows written straight into the backend's upload buffer (InputRows, what the engine does at
// tp = 1) give the answer rows passed from elsewhere give: fp8-only batches are used in place,
// mixed-head ones regrouped from a copy.
TEST(CudaBackend, RowsWrittenIntoTheUploadBufferGiveTheSameAnswer) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden;
  BackendOptions opt;
  opt.device = 0;
  opt.keep_bf16 = true;
  auto be = MakeCudaBackend(opt, 0);
  ASSERT_TRUE(be.ok()) << be.status();
  ShardWeights w = host;
  ASSERT_TRUE((*be)->Load(std::move(w)).ok());
  const std::vector<std::vector<RowTask>> batches = {
      {Task(RowMode::kTopK, RowHead::kFp8Twin, 8), Task(RowMode::kArgmax, RowHead::kFp8Twin),
       Task(RowMode::kFullLogits, RowHead::kFp8Twin)},
      {Task(RowMode::kTopK, RowHead::kBf16Exact, 8), Task(RowMode::kTopK, RowHead::kFp8Twin, 8),
       Task(RowMode::kFullLogits, RowHead::kBf16Exact), Task(RowMode::kArgmax, RowHead::kFp8Twin)},
  };
  for (const auto& tasks : batches) {
    std::vector<uint16_t> x(tasks.size() * K);
    for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(Gauss(9, i));
    const std::vector<uint8_t> from_outside = RunPayload(**be, tasks, x, S);
    uint16_t* in = (*be)->InputRows(static_cast<uint32_t>(tasks.size()));
    ASSERT_NE(in, nullptr);
    std::memcpy(in, x.data(), x.size() * 2);
    BatchControl ctl{};
    ctl.rows = static_cast<uint32_t>(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) ctl.tasks[i] = tasks[i];
    auto out = (*be)->Run(ctl, in, MemorySpace::kHost);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Answers(tasks, *out, S), from_outside) << tasks.size() << "-row batch";
  }
}

// A group's rows apart (RankEngine with NCCL): rank 0's backend uploads a batch's host rows into
// its device buffer (UploadRows), laid out by head as DeviceRows says; another rank's backend given
// those bytes in its own DeviceRows (only the descriptors uploaded) computes the payload the same
// batch has from host rows, bit for bit, in host and device space, graphs on and off, replayed.
// Two backends stand for two ranks; cudaMemcpy for the broadcast. Device rows are refused while a
// batch is in flight (its step reads that buffer).
TEST(CudaBackend, RowsGivenOnTheDeviceGiveTheSameAnswer) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden;
  const std::vector<std::vector<RowTask>> batches = {
      {Task(RowMode::kTopK, RowHead::kFp8Twin, 8), Task(RowMode::kArgmax, RowHead::kFp8Twin),
       Task(RowMode::kFullLogits, RowHead::kFp8Twin)},
      {Task(RowMode::kTopK, RowHead::kBf16Exact, 8), Task(RowMode::kTopK, RowHead::kFp8Twin, 8),
       Task(RowMode::kFullLogits, RowHead::kBf16Exact), Task(RowMode::kArgmax, RowHead::kFp8Twin),
       Task(RowMode::kSample, RowHead::kFp8Twin, 1, OutDType::kFp32, 0.8f, 5)},
  };
  for (bool graphs : {true, false}) {
    BackendOptions opt;
    opt.device = 0;
    opt.keep_bf16 = true;
    opt.cuda_graphs = graphs;
    auto root = MakeCudaBackend(opt, 0), worker = MakeCudaBackend(opt, 1);
    ASSERT_TRUE(root.ok() && worker.ok()) << root.status() << worker.status();
    for (auto* be : {&*root, &*worker}) {
      ShardWeights w = host;
      ASSERT_TRUE((*be)->Load(std::move(w)).ok());
    }
    for (int b = 0; b < 3; ++b) {  // the first batch again: its graphs replayed
      const std::vector<RowTask>& tasks = batches[b % 2];
      BatchControl ctl{};
      ctl.rows = static_cast<uint32_t>(tasks.size());
      for (size_t i = 0; i < tasks.size(); ++i) ctl.tasks[i] = tasks[i];
      std::vector<uint16_t> x(tasks.size() * K);
      for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(Gauss(40 + b, i));
      const size_t bytes = MakePayloadLayout(ctl.tasks, ctl.rows, S).bytes();
      const std::vector<uint8_t> payload = RunPayload(**root, tasks, x, S);  // from host rows
      // Rank 0: the rows uploaded where the engine sends them from, in the documented layout.
      auto up = (*root)->UploadRows(ctl, x.data());
      ASSERT_TRUE(up.ok()) << up.status();
      std::vector<uint16_t> on_device(x.size());
      ASSERT_EQ(cudaMemcpy(on_device.data(), *up, x.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<uint16_t> grouped;  // fp8-twin rows, then bf16-exact ones
      for (RowHead head : {RowHead::kFp8Twin, RowHead::kBf16Exact})
        for (size_t i = 0; i < tasks.size(); ++i)
          if (tasks[i].head == head) grouped.insert(grouped.end(), x.begin() + i * K, x.begin() + (i + 1) * K);
      ASSERT_EQ(on_device, grouped) << "batch " << b;
      auto own = (*root)->Run(ctl, *up, MemorySpace::kHost);
      ASSERT_TRUE(own.ok()) << own.status();
      EXPECT_EQ(Answers(tasks, *own, S), payload) << "batch " << b << ", rank 0 from its device rows";
      // The other rank: the same bytes in its device buffer, as the broadcast leaves them.
      for (MemorySpace space : {MemorySpace::kHost, MemorySpace::kDevice}) {
        void* d = (*worker)->DeviceRows(ctl.rows);
        ASSERT_NE(d, nullptr);
        ASSERT_EQ(cudaMemcpy(d, on_device.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // a pageable copy may return before it lands
        auto got = (*worker)->Run(ctl, static_cast<const uint16_t*>(d), space);
        ASSERT_TRUE(got.ok()) << got.status();
        std::vector<uint8_t> back(bytes);
        ASSERT_TRUE((*worker)->CopyToHost(back.data(), *got, bytes, space).ok());
        EXPECT_EQ(Answers(tasks, back.data(), S), payload) << "batch " << b << (space == MemorySpace::kHost ? ", host" : ", device")
                                 << " payload, graphs " << graphs;
      }
      const void* d = (*worker)->DeviceRows(ctl.rows);
      ASSERT_TRUE((*worker)->Launch(ctl, x.data(), MemorySpace::kHost).ok());
      EXPECT_EQ((*worker)->DeviceRows(ctl.rows), nullptr) << "a batch in flight reads it";
      EXPECT_EQ((*worker)->UploadRows(ctl, x.data()).status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ((*worker)->Launch(ctl, static_cast<const uint16_t*>(d), MemorySpace::kHost).code(),
                absl::StatusCode::kFailedPrecondition);
      ASSERT_TRUE((*worker)->Finish(nullptr).ok());
    }
  }
}

// The engine's overlap (BatchLoop's ahead): while a batch is on the device, its while_running
// writes the next batch's rows into the upload buffer. Every batch of a chain so written must
// equal the same batch run alone: the rows are written only after the step's H2D read them (a
// race would mix two batches' rows), graphs on (the H2D inside the graph) and off; and the last
// batch's host payload, which the completer answers from meanwhile, must stay as it was. With
// launch_ahead the next batch is also launched there, behind the running one (--launch-ahead), its
// rows uploaded aside (the other device buffer, a second stream) or, with aside off, in its step;
// with the stage events off (only the events Finish waits on), every stage time is 0 and the step
// untimed; with them one step in `every` is timed (its own graph), the rest untimed with zeros;
// with overlap_steps the step behind runs on a second stream, at the same time as the other's
// epilogue.
TEST(CudaBackend, RowsWrittenForTheNextBatchWhileOneRunsLeaveItIntact) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden;
  struct Way {
    bool graphs, launch_ahead, aside, events = true, overlap = false;
    uint32_t every = 1;
  };
  for (auto [graphs, launch_ahead, aside, events, overlap, every] :
       {Way{true, false, true}, Way{false, false, true}, Way{true, true, true}, Way{false, true, true},
        Way{true, true, false}, Way{false, true, false}, Way{true, true, true, false},
        Way{true, true, false, false}, Way{false, true, true, false}, Way{true, true, true, true, true},
        Way{false, true, true, true, true}, Way{true, true, false, true, true},
        Way{true, true, true, false, true}, Way{true, true, true, true, false, 3},
        Way{true, false, true, true, false, 4}, Way{false, true, true, true, false, 3},
        Way{true, true, true, true, true, 2}}) {
    BackendOptions opt;
    opt.device = 0;
    opt.cuda_graphs = graphs;
    opt.cuda_upload_aside = aside;
    opt.cuda_stage_events = events;
    opt.cuda_stage_events_every = every;
    opt.cuda_overlap_steps = overlap;
    opt.max_rows = 64;
    auto be = MakeCudaBackend(opt, 0);
    ASSERT_TRUE(be.ok()) << be.status();
    ShardWeights w = host;
    ASSERT_TRUE((*be)->Load(std::move(w)).ok());
    const std::vector<RowTask> shapes = {Task(RowMode::kTopK, RowHead::kFp8Twin, 8),
                                         Task(RowMode::kArgmax, RowHead::kFp8Twin),
                                         Task(RowMode::kFullLogits, RowHead::kFp8Twin)};
    struct B {
      std::vector<RowTask> tasks;
      std::vector<uint16_t> x;
      std::vector<uint8_t> alone;
    };
    std::vector<B> chain;
    for (int b = 0; b < 12; ++b) {
      B c;
      const int rows = 1 + (b * 7) % 9;  // 1..9 rows, the shapes (and graphs) changing
      for (int i = 0; i < rows; ++i) c.tasks.push_back(shapes[(b + i) % shapes.size()]);
      c.x.resize(static_cast<size_t>(rows) * K);
      for (size_t i = 0; i < c.x.size(); ++i) c.x[i] = FloatToBf16(Gauss(100 + b, i));
      c.alone = RunPayload(**be, c.tasks, c.x, S);
      chain.push_back(std::move(c));
    }
    auto ctl_of = [](const B& c) {
      BatchControl ctl{};
      ctl.rows = static_cast<uint32_t>(c.tasks.size());
      for (size_t i = 0; i < c.tasks.size(); ++i) ctl.tasks[i] = c.tasks[i];
      return ctl;
    };
    uint16_t* in = (*be)->InputRows(static_cast<uint32_t>(chain[0].tasks.size()));
    ASSERT_NE(in, nullptr);
    std::memcpy(in, chain[0].x.data(), chain[0].x.size() * 2);
    const uint8_t* last_payload = nullptr;
    bool launched = false;  // batch b was launched during b - 1
    size_t timed = 0;
    for (size_t b = 0; b < chain.size(); ++b) {
      const BatchControl ctl = ctl_of(chain[b]);
      int calls = 0;
      uint16_t* next_in = nullptr;
      if (!launched) {
        ASSERT_TRUE((*be)->Launch(ctl, in, MemorySpace::kHost).ok());
      }
      launched = false;
      auto out = (*be)->Finish([&] {
        ++calls;
        if (b + 1 == chain.size()) return;
        next_in = (*be)->InputRows(static_cast<uint32_t>(chain[b + 1].tasks.size()));
        ASSERT_NE(next_in, nullptr);
        std::memcpy(next_in, chain[b + 1].x.data(), chain[b + 1].x.size() * 2);
        if (launch_ahead) {
          ASSERT_TRUE((*be)->Launch(ctl_of(chain[b + 1]), next_in, MemorySpace::kHost).ok());
          launched = true;
        }
      });
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(calls, 1);
      const StageTimes st = (*be)->stage_times();
      if (st.step_untimed) {
        EXPECT_EQ(st.h2d_us + st.gemv_us + st.epilogue_us + st.d2h_us, 0u) << "batch " << b;
      } else {
        EXPECT_GT(st.gemv_us, 0u) << "batch " << b << ", every " << every;
        ++timed;
      }
      EXPECT_EQ(st.graph, graphs) << "batch " << b << ", launch ahead " << launch_ahead << ", aside "
                                  << aside << ", stage events " << events << ", overlap "
                                  << overlap;  // captured, not run eagerly
      // Each row's answer bytes (not the blocks' alignment padding, which no kernel writes).
      auto check = [&](const uint8_t* p, size_t of, const char* what) {
        const BatchControl c = ctl_of(chain[of]);
        const PayloadLayout layout = MakePayloadLayout(c.tasks, c.rows, S);
        for (uint32_t i = 0; i < c.rows; ++i) {
          const RowTask& t = c.tasks[i];
          const size_t answer = t.mode == RowMode::kFullLogits
                                    ? static_cast<size_t>(S) * 4
                                    : sizeof(SoftmaxPartial) + t.k * sizeof(Candidate);
          const size_t off = layout.row_offset[i];
          ASSERT_LE(off + answer, chain[of].alone.size());
          EXPECT_TRUE(std::equal(p + off, p + off + answer, chain[of].alone.begin() + off))
              << what << " batch " << of << " row " << i << ", graphs " << graphs << ", launch ahead "
              << launch_ahead << ", aside " << aside << ", stage events " << events << ", overlap " << overlap;
        }
      };
      const auto* p = static_cast<const uint8_t*>(*out);
      check(p, b, "this");
      // The batch before is still being answered from: this Run left its host payload alone.
      if (b > 0) {
        EXPECT_NE(p, last_payload);
        check(last_payload, b - 1, "the last");
      }
      last_payload = p;
      in = next_in;
    }
    // Twelve steps in a row hold 12 / every timed ones (every divides 12), wherever the count began.
    EXPECT_EQ(timed, events ? chain.size() / every : 0u) << "every " << every << ", graphs " << graphs;
  }
}

// FULL_LOGITS rows copied from the device payload straight into device memory
// (BatchControl::device_out, as a CUDA logits_region is served at tp = 1): each destination row
// holds the row's valid columns as the host payload has them, and nothing past them in its pitch;
// the host payload keeps every other row's answer. Graphs and eager launches, alone and launched
// ahead, blocks of bf16 and fp32 rows among reductions, the last rows on the host or not. A bad
// entry is refused with nothing launched.
TEST(CudaBackend, RowsCopiedToDeviceMemoryMatchThePayload) {
  DH_SKIP_WITHOUT_GPU();
  ShardWeights host = MakeShard(true);
  const int64_t S = host.geo.shard_rows, K = host.geo.hidden, V = host.geo.valid_cols();
  constexpr int kBatches = 8;
  const size_t per_batch = 3 * V * 2 + 4 * (V * 4 + 64) + 256;  // each batch's own destination
  const size_t dst_bytes = kBatches * per_batch;
  uint8_t* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, dst_bytes), cudaSuccess);
  std::vector<uint8_t> back(dst_bytes);
  for (auto [graphs, launch_ahead] : {std::pair{true, false}, std::pair{false, false},
                                      std::pair{true, true}, std::pair{false, true}}) {
    BackendOptions opt;
    opt.device = 0;
    opt.cuda_graphs = graphs;
    opt.max_rows = 64;
    auto be = MakeCudaBackend(opt, 0);
    ASSERT_TRUE(be.ok()) << be.status();
    ShardWeights w = host;
    ASSERT_TRUE((*be)->Load(std::move(w)).ok());
    struct B {
      BatchControl ctl{};
      std::vector<uint16_t> x;
      std::vector<uint8_t> alone;  // the same rows without device_out
    };
    std::vector<B> chain;
    for (int b = 0; b < kBatches; ++b) {
      B c;
      // [full bf16 x n1][top-k][full fp32 x n2], + [argmax] on odd b: blocks inside and at the end.
      const uint32_t n1 = 1 + b % 3, n2 = 1 + (b * 5) % 4;
      std::vector<RowTask> tasks;
      for (uint32_t i = 0; i < n1; ++i)
        tasks.push_back(Task(RowMode::kFullLogits, RowHead::kFp8Twin, 0, OutDType::kBf16, 1.f, 0, i));
      tasks.push_back(Task(RowMode::kTopK, RowHead::kFp8Twin, 8));
      for (uint32_t i = 0; i < n2; ++i)
        tasks.push_back(Task(RowMode::kFullLogits, RowHead::kFp8Twin, 0, OutDType::kFp32, 1.f, 0, i));
      if (b % 2) tasks.push_back(Task(RowMode::kArgmax, RowHead::kFp8Twin));
      c.ctl.rows = static_cast<uint32_t>(tasks.size());
      for (size_t i = 0; i < tasks.size(); ++i) c.ctl.tasks[i] = tasks[i];
      c.x.resize(static_cast<size_t>(c.ctl.rows) * K);
      for (size_t i = 0; i < c.x.size(); ++i) c.x[i] = FloatToBf16(Gauss(300 + b, i));
      c.alone = RunPayload(**be, tasks, c.x, S);
      // bf16 rows packed (pitch = width), then fp32 rows with 64 bytes between them.
      uint8_t* mine = dst + b * per_batch;
      c.ctl.device_outs = 2;
      c.ctl.device_out[0] = DeviceRowsOut{0, n1, static_cast<uint64_t>(V) * 2, mine};
      c.ctl.device_out[1] = DeviceRowsOut{n1 + 1, n2, static_cast<uint64_t>(V) * 4 + 64, mine + n1 * V * 2};
      chain.push_back(std::move(c));
    }
    ASSERT_EQ(cudaMemset(dst, 0xA5, dst_bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::vector<uint8_t>> host_payloads;
    bool launched = false;
    for (size_t b = 0; b < chain.size(); ++b) {
      if (!launched) {
        ASSERT_TRUE((*be)->Launch(chain[b].ctl, chain[b].x.data(), MemorySpace::kHost).ok());
      }
      launched = false;
      auto out = (*be)->Finish([&] {
        // Behind this one on the stream, its epilogue writing the device payload this batch's
        // copies read: they must read this batch's rows.
        if (launch_ahead && b + 1 < chain.size()) {
          ASSERT_TRUE((*be)->Launch(chain[b + 1].ctl, chain[b + 1].x.data(), MemorySpace::kHost).ok());
          launched = true;
        }
      });
      ASSERT_TRUE(out.ok()) << out.status();
      const auto* p = static_cast<const uint8_t*>(*out);
      const PayloadLayout layout = MakePayloadLayout(chain[b].ctl.tasks, chain[b].ctl.rows, S);
      host_payloads.emplace_back(p, p + layout.bytes());
    }
    ASSERT_EQ(cudaMemcpy(back.data(), dst, dst_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t b = 0; b < chain.size(); ++b) {
      const B& c = chain[b];
      const std::string where = absl::StrCat("batch ", b, ", graphs ", graphs, ", launch ahead ", launch_ahead);
      const PayloadLayout layout = MakePayloadLayout(c.ctl.tasks, c.ctl.rows, S);
      size_t used = b * per_batch;
      for (uint32_t e = 0; e < c.ctl.device_outs; ++e) {
        const DeviceRowsOut& o = c.ctl.device_out[e];
        const size_t width = static_cast<size_t>(V) * OutDTypeBytes(c.ctl.tasks[o.row0].dtype);
        const size_t at = static_cast<uint8_t*>(o.dst) - dst;
        for (uint32_t r = 0; r < o.rows; ++r) {
          const uint8_t* got = back.data() + at + r * o.dst_pitch;
          const uint8_t* want = c.alone.data() + layout.row_offset[o.row0 + r];
          EXPECT_TRUE(std::equal(got, got + width, want)) << where << ", row " << o.row0 + r;
          EXPECT_TRUE(std::all_of(got + width, got + o.dst_pitch, [](uint8_t v) { return v == 0xA5; }))
              << where << ", row " << o.row0 + r << ": written past its width";
        }
        used = at + o.rows * o.dst_pitch;
      }
      EXPECT_TRUE(std::all_of(back.begin() + used, back.begin() + (b + 1) * per_batch,
                              [](uint8_t v) { return v == 0xA5; })) << where << ": written past its rows";
      // The reductions' answers in the host payload (the rows copied out are unspecified there).
      const std::vector<uint8_t>& p = host_payloads[b];
      const size_t topk = layout.row_offset[c.ctl.device_out[0].rows];
      const size_t answer = sizeof(SoftmaxPartial) + 8 * sizeof(Candidate);
      ASSERT_GE(p.size(), topk + answer) << where;
      EXPECT_TRUE(std::equal(p.begin() + topk, p.begin() + topk + answer, c.alone.begin() + topk)) << where;
      if (b % 2) {
        const size_t last = layout.row_offset[c.ctl.rows - 1];
        EXPECT_TRUE(std::equal(p.begin() + last, p.begin() + last + sizeof(SoftmaxPartial) + sizeof(Candidate),
                               c.alone.begin() + last)) << where;
      }
    }
    // A bad entry: refused, nothing launched.
    BatchControl bad = chain[0].ctl;
    bad.device_out[0].dst_pitch = 16;
    EXPECT_EQ((*be)->Launch(bad, chain[0].x.data(), MemorySpace::kHost).code(), absl::StatusCode::kInvalidArgument);
    bad = chain[0].ctl;
    bad.device_out[1].row0 -= 1;  // names the TOP_K row
    EXPECT_EQ((*be)->Launch(bad, chain[0].x.data(), MemorySpace::kHost).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*be)->Finish(nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  }
  cudaFree(dst);
}

TEST(CudaBackend, RefusesAMissingDevice) {
  DH_SKIP_WITHOUT_GPU();
  BackendOptions opt;
  opt.device = 999;
  auto be = MakeCudaBackend(opt, 0);
  EXPECT_EQ(be.status().code(), absl::StatusCode::kFailedPrecondition) << be.status();
}

TEST(NcclCollective, OneRankBroadcastAndGather) {
  DH_SKIP_WITHOUT_GPU();
  auto kv = KvServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto cl = KvClient::Connect("127.0.0.1:" + std::to_string((*kv)->port()), std::chrono::seconds(5));
  ASSERT_TRUE(cl.ok()) << cl.status();
  auto c = MakeNcclCollective(0, 1, 0, **cl, std::chrono::seconds(60));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->name(), "nccl");
  EXPECT_TRUE((*c)->AcceptsDeviceMemory());
  std::vector<uint8_t> a(1 << 20), b(1 << 20);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 31);
  ASSERT_TRUE((*c)->Broadcast(a.data(), a.size(), MemorySpace::kHost, std::chrono::seconds(10)).ok());
  ASSERT_TRUE((*c)->Gather(a.data(), a.size(), b.data(), MemorySpace::kHost, std::chrono::seconds(10)).ok());
  EXPECT_EQ(a, b);
  void *da, *db;
  ASSERT_EQ(cudaMalloc(&da, a.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, a.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice), cudaSuccess);
  // cudaMemcpy from pageable memory may return before the DMA into da lands, and the collective's
  // stream is not ordered after the legacy stream (collective.h): wait for the copy. Without this
  // the gather's device-to-device copy could read da early (the flaky failure on the H200).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE((*c)->Broadcast(da, a.size(), MemorySpace::kDevice, std::chrono::seconds(10)).ok());
  ASSERT_TRUE((*c)->Gather(da, a.size(), db, MemorySpace::kDevice, std::chrono::seconds(10)).ok());
  std::vector<uint8_t> back(a.size());
  ASSERT_EQ(cudaMemcpy(back.data(), db, a.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, a);
  cudaFree(da);
  cudaFree(db);
}

TEST(NcclCollective, AMissingPeerTimesOutInsteadOfHanging) {
  DH_SKIP_WITHOUT_GPU();
  auto kv = KvServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto cl = KvClient::Connect("127.0.0.1:" + std::to_string((*kv)->port()), std::chrono::seconds(5));
  ASSERT_TRUE(cl.ok()) << cl.status();
  const auto t0 = std::chrono::steady_clock::now();
  auto c = MakeNcclCollective(1, 2, 0, **cl, std::chrono::milliseconds(500));  // rank 0 never comes
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// A broken group is UNAVAILABLE in every collective (collective.h), here as under Gloo and the
// in-process one (collective_test.cc): two ranks on two GPUs, one of which never calls; then
// every later call is UNAVAILABLE too. Needs 2 GPUs.
TEST(NcclCollective, APeerThatNeverCallsIsUnavailableInEveryCall) {
  DH_SKIP_WITHOUT_GPU();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto kv = KvServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::string addr = "127.0.0.1:" + std::to_string((*kv)->port());
  std::unique_ptr<Collective> ranks[2];
  std::unique_ptr<KvClient> clients[2];
  std::thread joins[2];
  for (int r = 0; r < 2; ++r) {
    auto cl = KvClient::Connect(addr, std::chrono::seconds(5));
    ASSERT_TRUE(cl.ok()) << cl.status();
    clients[r] = std::move(*cl);
    joins[r] = std::thread([&, r] {
      auto c = MakeNcclCollective(r, 2, r, *clients[r], std::chrono::seconds(60));
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) ranks[r] = std::move(*c);
    });
  }
  for (auto& t : joins) t.join();
  ASSERT_TRUE(ranks[0] && ranks[1]);
  std::vector<uint8_t> buf(4096), all(8192);
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 waits for a broadcast rank 0 never sends, then for a gather rank 0 never takes.
  absl::Status b = ranks[1]->Broadcast(buf.data(), buf.size(), MemorySpace::kHost, std::chrono::milliseconds(500));
  EXPECT_EQ(b.code(), absl::StatusCode::kUnavailable) << b;
  absl::Status g = ranks[1]->Gather(buf.data(), buf.size(), all.data(), MemorySpace::kHost, std::chrono::milliseconds(500));
  EXPECT_EQ(g.code(), absl::StatusCode::kUnavailable) << g;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  // Rank 0 gathers from a rank 1 that has aborted: its call fails the same way.
  absl::Status g0 = ranks[0]->Gather(buf.data(), buf.size(), all.data(), MemorySpace::kHost, std::chrono::milliseconds(500));
  EXPECT_EQ(g0.code(), absl::StatusCode::kUnavailable) << g0;
}

}  // namespace
}  // namespace drafthead
