// KServe v2 <-> native translation (server/api/kserve_translate.h): the request becomes the native
// request field for field, the native answer the protocol's tensors, bad input is refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "server/api/kserve_translate.h"

namespace drafthead::kserve {
namespace {

ModelDescription Model() {
  ModelDescription m;
  m.name = "head";
  m.hidden_size = 8;
  m.vocab_size = 100;
  m.max_rows = 4;
  m.max_top_k = 16;
  return m;
}

inference::ModelInferRequest Request(int rows = 2, const char* datatype = "BF16") {
  inference::ModelInferRequest r;
  r.set_model_name("head");
  r.set_id("req-1");
  auto* in = r.add_inputs();
  in->set_name("hidden");
  in->set_datatype(datatype);
  in->add_shape(rows);
  in->add_shape(8);
  r.add_raw_input_contents(std::string(rows * 8 * (std::strcmp(datatype, "FP32") == 0 ? 4 : 2), '\x01'));
  return r;
}

void ExpectBad(const inference::ModelInferRequest& r, const std::string& prefix,
               absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  auto t = TranslateRequest(r, Model());
  ASSERT_FALSE(t.ok()) << "accepted; want " << prefix;
  EXPECT_EQ(t.status().code(), code) << t.status();
  EXPECT_EQ(t.status().message().substr(0, prefix.size()), prefix) << t.status();
}

TEST(KServeTranslateTest, RequestBecomesTheNativeRequest) {
  auto r = Request(3, "FP32");
  auto& p = *r.mutable_parameters();
  p["mode"].set_string_param("top_k");
  p["top_k"].set_uint64_param(7);
  p["return_probs"].set_bool_param(true);
  p["temperature"].set_double_param(0.25);
  p["seed"].set_int64_param(9);
  p["head"].set_string_param("bf16_exact");
  p["logits_dtype"].set_string_param("FP32");
  r.add_outputs()->set_name("probs");
  auto t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  const v1::LogitsRequest& n = t->native;
  EXPECT_EQ(n.rows(), 3u);
  EXPECT_EQ(n.hidden_dtype(), v1::FP32);
  EXPECT_EQ(n.hidden(), r.raw_input_contents(0));
  EXPECT_EQ(n.mode(), v1::TOP_K);
  EXPECT_EQ(n.top_k(), 7u);
  EXPECT_TRUE(n.return_probs());
  EXPECT_EQ(n.temperature(), 0.25f);
  EXPECT_EQ(n.seed(), 9u);
  EXPECT_EQ(n.head(), v1::BF16_EXACT);
  EXPECT_EQ(n.logits_dtype(), v1::FP32);
  EXPECT_EQ(t->id, "req-1");
  EXPECT_EQ(t->outputs, std::vector<std::string>{"probs"});
}

TEST(KServeTranslateTest, DefaultsAreTheNativeDefaults) {
  auto t = TranslateRequest(Request(), Model());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->native.mode(), v1::FULL_LOGITS);
  EXPECT_EQ(t->native.head(), v1::FP8_TWIN);
  EXPECT_EQ(t->native.logits_dtype(), v1::BF16);
  EXPECT_EQ(t->native.hidden_dtype(), v1::BF16);
}

// tritonclient's infer(priority=, timeout=) send Triton's reserved request parameters: accepted,
// the timeout kept as the request's deadline, the priority checked and otherwise ignored.
TEST(KServeTranslateTest, TritonReservedPriorityAndTimeout) {
  auto r = Request();
  EXPECT_EQ(TranslateRequest(r, Model())->timeout_us, 0u);
  (*r.mutable_parameters())["priority"].set_uint64_param(2);
  (*r.mutable_parameters())["timeout"].set_int64_param(1500);
  auto t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->timeout_us, 1500u);
  (*r.mutable_parameters())["timeout"].set_int64_param(-1);
  ExpectBad(r, "timeout: -1 is negative");
  (*r.mutable_parameters())["timeout"].set_string_param("1s");
  ExpectBad(r, "timeout: ");
  (*r.mutable_parameters())["timeout"].set_uint64_param(0);
  (*r.mutable_parameters())["priority"].set_double_param(1.5);
  ExpectBad(r, "priority: ");
}

TEST(KServeTranslateTest, RefusesByName) {
  auto r = Request();
  r.set_model_name("other");
  ExpectBad(r, "unknown model 'other'", absl::StatusCode::kNotFound);
  r = Request();
  r.set_model_version("2");
  ExpectBad(r, "model 'head' has no version '2'", absl::StatusCode::kNotFound);
  r = Request();
  r.mutable_inputs(0)->set_datatype("INT8");
  ExpectBad(r, "hidden: datatype 'INT8'");
  r = Request(5);  // rows past max_rows
  ExpectBad(r, "hidden: shape [5, 8]");
  r = Request();
  r.mutable_inputs(0)->add_shape(1);
  ExpectBad(r, "hidden: shape [2, 8, 1]");
  r = Request();
  r.mutable_raw_input_contents(0)->pop_back();
  ExpectBad(r, "hidden: raw_input_contents[0] holds 31 bytes");
  r = Request();
  (*r.mutable_inputs(0)->mutable_parameters())["colour"].set_int64_param(32);
  ExpectBad(r, "hidden: unknown tensor parameter 'colour'");
  r = Request();
  r.add_inputs()->set_name("mask");
  ExpectBad(r, "inputs: want exactly one input tensor");
  r = Request();
  (*r.mutable_parameters())["top_k"].set_int64_param(int64_t{1} << 40);
  ExpectBad(r, "top_k: 1099511627776 is outside 1..16");
  r = Request();
  (*r.mutable_parameters())["temperature"].set_string_param("hot");
  ExpectBad(r, "temperature: want a double_param");
  r = Request();
  r.add_outputs()->set_name("token_ids");
  r.add_outputs()->set_name("token_ids");
  ExpectBad(r, "outputs: 'token_ids' is requested twice");
  // Of two bad parameters the first by name is reported, whatever the map's order.
  r = Request();
  (*r.mutable_parameters())["zz"].set_bool_param(true);
  (*r.mutable_parameters())["mode"].set_string_param("beam");
  ExpectBad(r, "mode: unknown value 'beam' (one of full_logits, top_k, argmax, sample)");
}

// What perf_analyzer (Triton's C++ client: triton_enable_empty_final_response on every request,
// sequence_* when asked) and tritonclient send: Triton's reserved names with Triton's types are
// accepted; a wrong type, another triton_* name or an unknown name is refused, naming it.
TEST(KServeTranslateTest, TritonReservedParameters) {
  auto r = Request();
  auto& p = *r.mutable_parameters();
  p["triton_enable_empty_final_response"].set_bool_param(true);
  p["sequence_id"].set_int64_param(7);
  p["sequence_start"].set_bool_param(true);
  p["sequence_end"].set_bool_param(false);
  p["headers"].set_string_param("x-trace: 1");
  p["binary_data_output"].set_bool_param(true);
  p["priority"].set_int64_param(0);
  p["mode"].set_string_param("argmax");
  auto t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->native.mode(), v1::ARGMAX);
  EXPECT_TRUE(WantsFinalResponseFlag(r));
  p["sequence_id"].set_string_param("corr-1");
  EXPECT_TRUE(TranslateRequest(r, Model()).ok());
  p["triton_enable_empty_final_response"].set_bool_param(false);
  EXPECT_FALSE(WantsFinalResponseFlag(r));
  EXPECT_TRUE(TranslateRequest(r, Model()).ok());

  p["triton_enable_empty_final_response"].set_int64_param(1);
  ExpectBad(r, "triton_enable_empty_final_response: want a bool_param, got int64_param");
  EXPECT_FALSE(WantsFinalResponseFlag(r));
  p["triton_enable_empty_final_response"].set_bool_param(true);
  p["sequence_start"].set_string_param("yes");
  ExpectBad(r, "sequence_start: want a bool_param");
  p["sequence_start"].set_bool_param(true);
  p["sequence_id"].set_double_param(1);
  ExpectBad(r, "sequence_id: want an int64_param or string_param");
  p["sequence_id"].set_int64_param(1);
  p["triton_other"].set_bool_param(true);
  ExpectBad(r, "parameters: 'triton_other': names starting with 'triton_' are reserved");
  p.erase("triton_other");
  p["topk"].set_int64_param(3);  // a typo is not ignored
  ExpectBad(r, "parameters: unknown parameter 'topk'");
  p.erase("topk");
  p["mode"].set_bool_param(true);  // drafthead's own names keep their types
  ExpectBad(r, "mode: want a string_param, got bool_param");
}

// The KServe SDK's set_data_from_numpy sends binary_data_size beside the raw bytes; requested
// outputs may carry binary_data. Taken as Triton's gRPC endpoint takes them: no effect.
TEST(KServeTranslateTest, BinaryDataTensorParameters) {
  auto r = Request(2);
  (*r.mutable_inputs(0)->mutable_parameters())["binary_data_size"].set_int64_param(32);
  auto* o = r.add_outputs();
  o->set_name("logits");
  (*o->mutable_parameters())["binary_data"].set_bool_param(true);
  auto t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->native.hidden(), r.raw_input_contents(0));
  EXPECT_FALSE(t->native.has_hidden_region());
  EXPECT_FALSE(t->native.has_logits_region());
  (*r.mutable_inputs(0)->mutable_parameters())["binary_data_size"].set_string_param("32");
  ExpectBad(r, "hidden: binary_data_size: want an int64_param or uint64_param");
  r = Request(2);
  o = r.add_outputs();
  o->set_name("logits");
  (*o->mutable_parameters())["binary_data"].set_int64_param(1);
  ExpectBad(r, "logits: binary_data: want a bool_param");
  r = Request(2);
  (*r.mutable_inputs(0)->mutable_parameters())["shared_memory_offset"].set_int64_param(0);
  ExpectBad(r, "hidden: shared memory needs both");
}

// Typed contents (the KServe SDK's list path): FP32 values in fp32_contents are read as the same
// values' raw bytes would be; two sources for one input are refused, as Triton refuses them.
TEST(KServeTranslateTest, TypedContents) {
  auto raw = Request(2, "FP32");
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = 0.25f * i - 1.5f;
  raw.set_raw_input_contents(0, std::string(reinterpret_cast<const char*>(x.data()), x.size() * 4));
  auto typed = raw;
  typed.clear_raw_input_contents();
  for (float v : x) typed.mutable_inputs(0)->mutable_contents()->add_fp32_contents(v);
  auto a = TranslateRequest(raw, Model());
  auto b = TranslateRequest(typed, Model());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->native.SerializeAsString(), b->native.SerializeAsString());

  auto both = typed;
  both.add_raw_input_contents(raw.raw_input_contents(0));
  ExpectBad(both, "hidden: its values come from more than one of shared memory (unset), contents (set)");
  auto short_typed = typed;
  short_typed.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->RemoveLast();
  ExpectBad(short_typed, "hidden: contents.fp32_contents holds 15 values; shape [2, 8] is 16");
  auto ints = typed;
  ints.mutable_inputs(0)->mutable_contents()->add_int_contents(1);
  ExpectBad(ints, "hidden: contents.int_contents is set");
  auto bf16 = Request(2, "BF16");
  bf16.clear_raw_input_contents();
  bf16.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.f);
  ExpectBad(bf16, "hidden: BF16 has no typed contents field");
  auto shm = typed;
  (*shm.mutable_inputs(0)->mutable_parameters())["shared_memory_region"].set_string_param("in");
  (*shm.mutable_inputs(0)->mutable_parameters())["shared_memory_byte_size"].set_int64_param(64);
  ExpectBad(shm, "hidden: its values come from more than one of shared memory (set), contents (set)");
}

TEST(KServeTranslateTest, Statistics) {
  InferenceStats s;
  s.last_inference_ms = 1234;
  s.inference_count = 3;
  s.execution_count = 2;
  s.success = {3, 3000};
  s.fail = {1, 10};
  s.queue = {3, 300};
  s.compute.input = {3, 30};
  s.compute.infer = {3, 2000};
  s.compute.output = {3, 40};
  s.batches[2].infer = {1, 900};
  s.batches[1].infer = {1, 500};
  const auto m = ModelStatistics(Model(), s);
  EXPECT_EQ(m.name(), "head");
  EXPECT_EQ(m.version(), "1");
  EXPECT_EQ(m.last_inference(), 1234u);
  EXPECT_EQ(m.inference_count(), 3u);
  EXPECT_EQ(m.execution_count(), 2u);
  EXPECT_EQ(m.inference_stats().success().ns(), 3000u);
  EXPECT_EQ(m.inference_stats().fail().count(), 1u);
  EXPECT_EQ(m.inference_stats().queue().ns(), 300u);
  EXPECT_EQ(m.inference_stats().compute_infer().ns(), 2000u);
  ASSERT_EQ(m.batch_stats_size(), 2);
  EXPECT_EQ(m.batch_stats(0).batch_size(), 1u);
  EXPECT_EQ(m.batch_stats(1).compute_infer().ns(), 900u);
  const auto index = RepositoryIndex(Model(), /*serving=*/false, /*ready_only=*/false);
  ASSERT_EQ(index.models_size(), 1);
  EXPECT_EQ(index.models(0).state(), "LOADING");
  EXPECT_EQ(RepositoryIndex(Model(), false, true).models_size(), 0);
  EXPECT_EQ(RepositoryIndex(Model(), true, true).models(0).state(), "READY");
}

void Place(google::protobuf::Map<std::string, inference::InferParameter>* p, const std::string& region,
           int64_t offset, int64_t byte_size) {
  (*p)["shared_memory_region"].set_string_param(region);
  (*p)["shared_memory_byte_size"].set_int64_param(byte_size);
  (*p)["shared_memory_offset"].set_uint64_param(offset);
}

TEST(KServeTranslateTest, SharedMemoryBecomesNativeRegionsOrKServeWrites) {
  auto r = Request(2);
  r.clear_raw_input_contents();
  Place(r.mutable_inputs(0)->mutable_parameters(), "in", 8, 32);
  r.add_outputs()->set_name("logits");
  Place(r.mutable_outputs(0)->mutable_parameters(), "out", 64, 1000);  // more than the 400 needed
  auto t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->native.hidden().empty());
  EXPECT_EQ(t->native.hidden_region().region(), "in");
  EXPECT_EQ(t->native.hidden_region().offset(), 8u);
  EXPECT_EQ(t->native.hidden_region().byte_size(), 32u);
  EXPECT_EQ(t->native.logits_region().region(), "out");
  EXPECT_EQ(t->native.logits_region().byte_size(), 2u * 100 * 2);  // the slice's start
  EXPECT_TRUE(t->output_shm.empty());

  // Reductions' outputs are not native regions: the KServe layer writes them.
  r = Request(2);
  (*r.mutable_parameters())["mode"].set_string_param("argmax");
  r.add_outputs()->set_name("values");
  Place(r.mutable_outputs(0)->mutable_parameters(), "out", 0, 8);
  t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->native.has_logits_region());
  ASSERT_EQ(t->output_shm.count("values"), 1u);
  EXPECT_EQ(t->output_shm.at("values").byte_size, 8u);

  r = Request(2);
  Place(r.mutable_inputs(0)->mutable_parameters(), "in", 0, 32);
  ExpectBad(r, "hidden: its values come from more than one of shared memory (set), contents (unset) and "
               "raw_input_contents (1 entries)");
  r = Request(2);
  r.clear_raw_input_contents();
  Place(r.mutable_inputs(0)->mutable_parameters(), "in", 0, 30);
  ExpectBad(r, "hidden: shared_memory_byte_size 30; shape [2, 8] of BF16 is 32 bytes");
  r = Request(2);
  (*r.mutable_inputs(0)->mutable_parameters())["shared_memory_region"].set_string_param("in");
  ExpectBad(r, "hidden: shared memory needs both");
  r = Request(2);
  r.clear_raw_input_contents();
  Place(r.mutable_inputs(0)->mutable_parameters(), "in", 0, 32);
  (*r.mutable_inputs(0)->mutable_parameters())["shared_memory_offset"].set_int64_param(-1);
  ExpectBad(r, "hidden: shared_memory_offset: -1 is negative");
  r = Request(2);
  (*r.mutable_parameters())["mode"].set_string_param("top_k");
  (*r.mutable_parameters())["top_k"].set_int64_param(4);
  r.add_outputs()->set_name("token_ids");
  Place(r.mutable_outputs(0)->mutable_parameters(), "out", 0, 31);
  ExpectBad(r, "token_ids: shared_memory_byte_size 31 is less than the output's 32 bytes");
}

TEST(KServeTranslateTest, ResponseCarriesTheNativeAnswer) {
  auto r = Request(2);
  (*r.mutable_parameters())["mode"].set_string_param("top_k");
  (*r.mutable_parameters())["top_k"].set_int64_param(3);
  auto t = TranslateRequest(r, Model());
  ASSERT_TRUE(t.ok()) << t.status();
  v1::LogitsResponse native;
  for (int i = 0; i < 6; ++i) {
    native.add_token_ids(10 + i);
    native.add_values(0.5f * i);
  }
  native.mutable_timing()->set_compute_us(42);
  inference::ModelInferResponse out;
  TranslateResponse(*t, Model(), native, &out);
  EXPECT_EQ(out.model_name(), "head");
  EXPECT_EQ(out.model_version(), "1");
  EXPECT_EQ(out.id(), "req-1");
  EXPECT_EQ(out.parameters().at("compute_us").int64_param(), 42);
  ASSERT_EQ(out.outputs_size(), 2);  // no probs without return_probs
  EXPECT_EQ(out.outputs(0).name(), "token_ids");
  EXPECT_EQ(out.outputs(0).datatype(), "INT32");
  EXPECT_EQ(std::vector<int64_t>(out.outputs(0).shape().begin(), out.outputs(0).shape().end()),
            (std::vector<int64_t>{2, 3}));
  int32_t ids[6];
  ASSERT_EQ(out.raw_output_contents(0).size(), sizeof(ids));
  std::memcpy(ids, out.raw_output_contents(0).data(), sizeof(ids));
  EXPECT_EQ(ids[5], 15);
  float values[6];
  std::memcpy(values, out.raw_output_contents(1).data(), sizeof(values));
  EXPECT_EQ(values[5], 2.5f);
}

TEST(KServeTranslateTest, FullLogitsMoveOut) {
  auto t = TranslateRequest(Request(1), Model());
  ASSERT_TRUE(t.ok()) << t.status();
  v1::LogitsResponse native;
  native.set_vocab_size(100);
  native.set_logits(std::string(200, '\x07'));
  inference::ModelInferResponse out;
  TranslateResponse(*t, Model(), native, &out);
  ASSERT_EQ(out.outputs_size(), 1);
  EXPECT_EQ(out.outputs(0).name(), "logits");
  EXPECT_EQ(out.outputs(0).datatype(), "BF16");
  EXPECT_EQ(out.outputs(0).shape(1), 100);
  EXPECT_EQ(out.raw_output_contents(0), std::string(200, '\x07'));
}

TEST(KServeTranslateTest, ModelDescription) {
  const auto meta = ModelMetadata(Model());
  EXPECT_EQ(meta.name(), "head");
  ASSERT_EQ(meta.inputs_size(), 1);
  EXPECT_EQ(meta.inputs(0).shape(0), -1);
  EXPECT_EQ(meta.inputs(0).shape(1), 8);
  const auto cfg = ModelConfig(Model());
  EXPECT_EQ(cfg.max_batch_size(), 0);
  EXPECT_EQ(cfg.output_size(), 4);
  EXPECT_EQ(cfg.output(0).dims(1), 100);
  EXPECT_TRUE(CheckModel(Model(), "head", "").ok());
  EXPECT_TRUE(CheckModel(Model(), "head", "1").ok());
}

}  // namespace
}  // namespace drafthead::kserve
