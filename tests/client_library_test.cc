// drafthead_client against drafthead-fake-server (a child process on loopback): results, status
// conversion, in-band errors, bounded retries on UNAVAILABLE, async callbacks and futures, streams,
// health polling.
#include <atomic>
#include <cmath>
#include <future>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "client/drafthead_client.h"
#include "client/testing/fake_server_process.h"
#include "kernels/numeric.h"

namespace drafthead::client {
namespace {

using testing::FakeServerProcess;

constexpr uint32_t K = 32, V = 200;

std::vector<uint16_t> Hidden(uint32_t rows, uint32_t seed) {
  std::vector<uint16_t> h(rows * K);
  for (size_t i = 0; i < h.size(); ++i) {
    h[i] = FloatToBf16(std::sin(0.37f * static_cast<float>(i + 1) + static_cast<float>(seed)) * 3.0f);
  }
  return h;
}
float Toy(const std::vector<uint16_t>& h, uint32_t m, uint32_t n) {
  return Bf16ToFloat(h[m * K + n % K]) * (1.0f + static_cast<float>(n / K) * 0.25f);
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<FakeServerProcess>(std::vector<std::string>{"--hidden-size=32", "--vocab-size=200", "--max-rows=8"});
    ASSERT_NE(server_->port(), 0) << "fake server did not start";
    auto c = DraftHeadClient::Connect(server_->target(), {});
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  std::unique_ptr<FakeServerProcess> server_;
  std::unique_ptr<DraftHeadClient> client_;
};

TEST_F(ClientTest, InfoAndHealth) {
  auto info = client_->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->hidden_size(), K);
  EXPECT_EQ(info->vocab_size(), V);
  EXPECT_EQ(info->max_rows(), 8u);
  EXPECT_TRUE(client_->CheckHealth().ok());
}

TEST_F(ClientTest, LogitsBf16AndFp32) {
  const auto h = Hidden(3, 1);
  auto r = client_->Logits(HiddenRows::Bf16(h, 3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rows, 3u);
  EXPECT_EQ(r->vocab_size, V);
  EXPECT_EQ(r->dtype, v1::BF16);
  for (uint32_t m = 0; m < 3; ++m) {
    for (uint32_t n = 0; n < V; ++n) ASSERT_EQ(r->At(m, n), Bf16ToFloat(FloatToBf16(Toy(h, m, n)))) << m << "," << n;
  }
  RequestOptions o;
  o.logits_dtype = v1::FP32;
  auto f = client_->Logits(HiddenRows::Bf16(h, 3), o);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->dtype, v1::FP32);
  const std::vector<float> all = f->ToFloat();
  ASSERT_EQ(all.size(), 3u * V);
  EXPECT_EQ(all[V + 77], Toy(h, 1, 77));
  // fp32 hidden rows are accepted and rounded to bf16 by the server.
  std::vector<float> hf(h.size());
  for (size_t i = 0; i < h.size(); ++i) hf[i] = Bf16ToFloat(h[i]);
  auto g = client_->Logits(HiddenRows::Fp32(hf, 3), o);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->data, f->data);
}

TEST_F(ClientTest, Reductions) {
  const auto h = Hidden(4, 2);
  RequestOptions o;
  o.k = 5;
  o.probs = true;
  auto t = client_->TopK(HiddenRows::Bf16(h, 4), o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->token_ids.size(), 20u);
  ASSERT_EQ(t->probs.size(), 20u);
  auto a = client_->Argmax(HiddenRows::Bf16(h, 4));
  ASSERT_TRUE(a.ok()) << a.status();
  for (uint32_t m = 0; m < 4; ++m) {
    // argmax by brute force, ties to the smaller id
    uint32_t best = 0;
    for (uint32_t n = 1; n < V; ++n) {
      if (Toy(h, m, n) > Toy(h, m, best)) best = n;
    }
    EXPECT_EQ(a->token_ids[m], static_cast<int32_t>(best));
    EXPECT_EQ(t->token_ids[m * 5], static_cast<int32_t>(best));
    EXPECT_EQ(a->values[m], Toy(h, m, best));
    for (int i = 1; i < 5; ++i) EXPECT_GE(t->values[m * 5 + i - 1], t->values[m * 5 + i]);
    double sum = 0;
    for (uint32_t n = 0; n < V; ++n) sum += std::exp(static_cast<double>(Toy(h, m, n)) - Toy(h, m, best));
    EXPECT_NEAR(t->probs[m * 5], 1.0 / sum, 1e-6);
  }
  RequestOptions s;
  s.temperature = 0.7f;
  s.seed = 99;
  auto s1 = client_->Sample(HiddenRows::Bf16(h, 4), s);
  auto s2 = client_->Sample(HiddenRows::Bf16(h, 4), s);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s1->token_ids, s2->token_ids);  // a function of (seed, row, token) only
}

TEST_F(ClientTest, SpanOverloadsInferRows) {
  const auto h = Hidden(3, 8);
  auto a = client_->Argmax(std::span<const uint16_t>(h));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rows, 3u);
  auto b = client_->Argmax(HiddenRows::Bf16(h, 3));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_EQ(*client_->HiddenSize(), K);
  auto bad = client_->Logits(std::span<const uint16_t>(h).first(K + 3));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, BadRequestIsInvalidArgumentNamingTheField) {
  const auto h = Hidden(2, 3);
  RequestOptions o;
  o.k = 1000;
  auto t = client_->TopK(HiddenRows::Bf16(h, 2), o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("top_k"), std::string::npos) << t.status();
  auto w = client_->Logits(HiddenRows::Bf16(std::span<const uint16_t>(h).first(K + 1), 1));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  RequestOptions s;
  s.temperature = 0;
  EXPECT_EQ(client_->Sample(HiddenRows::Bf16(h, 2), s).status().code(), absl::StatusCode::kInvalidArgument);
  // The fake validates with the server's code: a negative TOP_K temperature is refused, probs or not.
  RequestOptions neg;
  neg.k = 3;
  neg.temperature = -1.0f;
  auto n = client_->TopK(HiddenRows::Bf16(h, 2), neg);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("temperature"), std::string::npos) << n.status();
}

TEST_F(ClientTest, AsyncCallbackAndFuture) {
  const auto h = Hidden(2, 4);
  absl::Notification done;
  absl::StatusOr<LogitsResult> got = absl::UnknownError("not called");
  client_->LogitsAsync(HiddenRows::Bf16(h, 2), {}, [&](absl::StatusOr<LogitsResult> r) {
    got = std::move(r);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->rows, 2u);
  std::vector<std::future<absl::StatusOr<TokensResult>>> fs;
  for (int i = 0; i < 32; ++i) fs.push_back(client_->TokensFuture(v1::ARGMAX, HiddenRows::Bf16(h, 2), {}));
  for (auto& f : fs) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->token_ids.size(), 2u);
  }
  RequestOptions bad;
  bad.k = 0;
  auto bf = client_->TokensFuture(v1::TOP_K, HiddenRows::Bf16(h, 2), bad).get();
  EXPECT_EQ(bf.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, StreamAnswersInOrderAndInBandErrorsGoOn) {
  auto s = client_->OpenStream(absl::Seconds(20));
  ASSERT_TRUE(s.ok()) << s.status();
  const auto h = Hidden(2, 5);
  for (uint64_t i = 0; i < 10; ++i) {
    RequestOptions o;
    o.request_id = i;
    o.k = (i == 4) ? 100000 : 3;  // request 4 is bad: answered in-band
    ASSERT_TRUE((*s)->Send(BuildRequest(v1::TOP_K, HiddenRows::Bf16(h, 2), o)).ok());
  }
  ASSERT_TRUE((*s)->CloseSend().ok());
  for (uint64_t i = 0; i < 10; ++i) {
    auto r = (*s)->Receive();
    if (i == 4) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
      continue;
    }
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_EQ(r->request_id(), i);
  }
  auto end = (*s)->Receive();
  EXPECT_EQ(end.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE((*s)->Finish().ok());
}

TEST(ClientRetry, UnavailableIsRetriedBoundedly) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=200", "--fail-first=2"});
  ASSERT_NE(server.port(), 0);
  const auto h = Hidden(1, 6);
  {
    ClientOptions o;
    o.retry.max_attempts = 1;  // no retries: the first failure is returned
    auto c = DraftHeadClient::Connect(server.target(), o);
    ASSERT_TRUE(c.ok());
    auto r = (*c)->Argmax(HiddenRows::Bf16(h, 1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  ClientOptions o;
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = absl::Milliseconds(5);
  auto c = DraftHeadClient::Connect(server.target(), o);
  ASSERT_TRUE(c.ok());
  // One failure left on the server: the second attempt succeeds.
  auto r = (*c)->Argmax(HiddenRows::Bf16(h, 1));
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(ClientRetry, AsyncRetriesToo) {
  FakeServerProcess server({"--hidden-size=32", "--vocab-size=200", "--fail-first=2"});
  ASSERT_NE(server.port(), 0);
  ClientOptions o;
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = absl::Milliseconds(5);
  auto c = DraftHeadClient::Connect(server.target(), o);
  ASSERT_TRUE(c.ok());
  const auto h = Hidden(1, 7);
  auto r = (*c)->TokensFuture(v1::ARGMAX, HiddenRows::Bf16(h, 1), {}).get();
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(ClientRetry, NothingListeningFailsWithinTheDeadline) {
  ClientOptions o;
  o.retry.max_attempts = 4;
  o.retry.initial_backoff = absl::Milliseconds(10);
  auto c = DraftHeadClient::Connect("127.0.0.1:1", o);  // port 1: nothing there
  ASSERT_TRUE(c.ok());
  const absl::Time t0 = absl::Now();
  auto info = (*c)->Info(absl::Seconds(3));
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(4));
}

TEST(ClientHealth, WaitUntilServingPolls) {
  // Long enough not to be over before the first checks on a loaded machine.
  FakeServerProcess server({"--health-delay-ms=5000"});
  ASSERT_NE(server.port(), 0);
  auto c = DraftHeadClient::Connect(server.target(), {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->CheckHealth().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*c)->WaitUntilServing(absl::Milliseconds(150)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE((*c)->WaitUntilServing(absl::Seconds(30), absl::Milliseconds(50)).ok());
}

TEST(ClientConnect, RejectsBadOptions) {
  ClientOptions o;
  o.channels = 0;
  EXPECT_EQ(DraftHeadClient::Connect("127.0.0.1:5", o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftHeadClient::Connect("", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(TlsOptions::FromFiles("", "cert.pem", "", "").ok());
  EXPECT_EQ(TlsOptions::FromFiles("/nonexistent/ca.pem", "", "", "").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace drafthead::client
