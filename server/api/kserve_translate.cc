#include "server/api/kserve_translate.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/version.h"

namespace drafthead::kserve {
namespace {

using inference::InferParameter;

constexpr char kInput[] = "hidden";
constexpr const char* kOutputs[] = {"logits", "token_ids", "values", "probs"};
constexpr char kKnownParameters[] =
    "mode, top_k, return_probs, temperature, seed, head, logits_dtype; Triton's reserved: priority, timeout, "
    "sequence_id, sequence_start, sequence_end, headers, binary_data_output, "
    "triton_enable_empty_final_response";
constexpr char kEnableFinalResponse[] = "triton_enable_empty_final_response";

absl::Status Bad(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

const char* KindName(const InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam: return "bool_param";
    case InferParameter::kInt64Param: return "int64_param";
    case InferParameter::kStringParam: return "string_param";
    case InferParameter::kDoubleParam: return "double_param";
    case InferParameter::kUint64Param: return "uint64_param";
    default: return "no value";
  }
}

absl::Status WrongKind(const std::string& name, const InferParameter& p, absl::string_view want) {
  return Bad(name, absl::StrCat("want ", want, ", got ", KindName(p)));
}

// A string parameter naming one of `choices`, as the native enum value.
template <typename Enum>
absl::StatusOr<Enum> Choice(const std::string& name, const InferParameter& p,
                            std::initializer_list<std::pair<const char*, Enum>> choices) {
  if (p.parameter_choice_case() != InferParameter::kStringParam)
    return WrongKind(name, p, "a string_param");
  std::vector<std::string> names;
  for (const auto& [text, value] : choices) {
    if (p.string_param() == text) return value;
    names.push_back(text);
  }
  return Bad(name, absl::StrCat("unknown value '", p.string_param(), "' (one of ",
                                absl::StrJoin(names, ", "), ")"));
}

// An int64 or uint64 parameter as uint64 (a negative int64 is refused).
absl::StatusOr<uint64_t> Unsigned(const std::string& name, const InferParameter& p) {
  if (p.parameter_choice_case() == InferParameter::kUint64Param) return p.uint64_param();
  if (p.parameter_choice_case() != InferParameter::kInt64Param)
    return WrongKind(name, p, "an int64_param or uint64_param");
  if (p.int64_param() < 0) return Bad(name, absl::StrCat(p.int64_param(), " is negative"));
  return static_cast<uint64_t>(p.int64_param());
}

absl::Status ApplyParameter(const std::string& name, const InferParameter& p,
                            const ModelDescription& model, TranslatedRequest* t) {
  v1::LogitsRequest* r = &t->native;
  if (name == "mode") {
    auto mode = Choice<v1::Mode>(name, p, {{"full_logits", v1::FULL_LOGITS}, {"top_k", v1::TOP_K},
                                           {"argmax", v1::ARGMAX}, {"sample", v1::SAMPLE}});
    if (!mode.ok()) return mode.status();
    r->set_mode(*mode);
  } else if (name == "head") {
    auto head = Choice<v1::Head>(name, p, {{"fp8_twin", v1::FP8_TWIN}, {"bf16_exact", v1::BF16_EXACT}});
    if (!head.ok()) return head.status();
    r->set_head(*head);
  } else if (name == "logits_dtype") {
    auto dtype = Choice<v1::DType>(name, p, {{"BF16", v1::BF16}, {"FP32", v1::FP32}});
    if (!dtype.ok()) return dtype.status();
    r->set_logits_dtype(*dtype);
  } else if (name == "top_k") {
    auto k = Unsigned(name, p);
    if (!k.ok()) return k.status();
    // The native check (1..max) names the range; a count past uint32 cannot reach it intact.
    if (*k > std::numeric_limits<uint32_t>::max())
      return Bad(name, absl::StrCat(*k, " is outside 1..", std::min(model.max_top_k, model.vocab_size)));
    r->set_top_k(static_cast<uint32_t>(*k));
  } else if (name == "seed") {
    auto seed = Unsigned(name, p);
    if (!seed.ok()) return seed.status();
    r->set_seed(*seed);
  } else if (name == "return_probs") {
    if (p.parameter_choice_case() != InferParameter::kBoolParam) return WrongKind(name, p, "a bool_param");
    r->set_return_probs(p.bool_param());
  } else if (name == "temperature") {
    // Out of float's range becomes infinite, which the native check refuses by name.
    if (p.parameter_choice_case() == InferParameter::kDoubleParam)
      r->set_temperature(static_cast<float>(p.double_param()));
    else if (p.parameter_choice_case() == InferParameter::kInt64Param)
      r->set_temperature(static_cast<float>(p.int64_param()));
    else
      return WrongKind(name, p, "a double_param (or int64_param)");
  } else if (name == "priority") {
    // Triton's reserved request parameter (tritonclient's infer(priority=)): checked and otherwise
    // ignored, as Triton ignores it for a model without priority levels (the queue here is fair
    // between callers, FIFO within one).
    if (auto v = Unsigned(name, p); !v.ok()) return v.status();
  } else if (name == "timeout") {
    // Triton's reserved request parameter (tritonclient's infer(timeout=)), microseconds, 0: none.
    auto us = Unsigned(name, p);
    if (!us.ok()) return us.status();
    t->timeout_us = *us;
  } else if (name == kEnableFinalResponse || name == "sequence_start" || name == "sequence_end" ||
             name == "binary_data_output") {
    // Triton's bools. perf_analyzer (Triton's C++ client) sends triton_enable_empty_final_response
    // on every request; the stream reads it (WantsFinalResponseFlag). A model without a sequence
    // batcher ignores the sequence flags; binary_data_output is HTTP's (gRPC outputs are raw).
    if (p.parameter_choice_case() != InferParameter::kBoolParam) return WrongKind(name, p, "a bool_param");
  } else if (name == "sequence_id") {
    // Triton: int64 or string correlation id, ignored by a model that is not a sequence model.
    if (p.parameter_choice_case() != InferParameter::kInt64Param &&
        p.parameter_choice_case() != InferParameter::kStringParam)
      return WrongKind(name, p, "an int64_param or string_param");
  } else if (name == "headers") {
    // Reserved by Triton for forwarded HTTP / gRPC headers; a generic parameter's types there.
    if (p.parameter_choice_case() != InferParameter::kStringParam &&
        p.parameter_choice_case() != InferParameter::kInt64Param &&
        p.parameter_choice_case() != InferParameter::kBoolParam)
      return WrongKind(name, p, "a string_param, int64_param or bool_param");
  } else if (absl::StartsWith(name, "triton_")) {
    // As Triton: the prefix is reserved, and only the names it knows are allowed.
    return Bad("parameters", absl::StrCat("'", name, "': names starting with 'triton_' are reserved; the one "
                                          "allowed is ", kEnableFinalResponse));
  } else {
    // Triton hands unknown names to the backend; drafthead has no backend parameters, and a typo
    // ("topk") silently ignored would answer another mode: refused, naming it.
    return Bad("parameters", absl::StrCat("unknown parameter '", name, "' (known: ", kKnownParameters, ")"));
  }
  return absl::OkStatus();
}

// A tensor's parameters: Triton's shared-memory placement (region and byte size, an optional
// offset), and the ones Triton's clients send that change nothing over gRPC: binary_data_size
// (KServe's SDK, the size of the raw bytes, which are checked against the shape anyway),
// binary_data and binary_data_output (HTTP's choice of binary outputs). Anything else is refused,
// naming the tensor.
absl::StatusOr<std::optional<SharedMemorySlice>> ParseTensorParameters(
    const std::string& tensor, const google::protobuf::Map<std::string, InferParameter>& params) {
  SharedMemorySlice slice;
  bool has_region = false, has_size = false, has_offset = false;
  for (const auto& [name, p] : params) {
    const std::string what = absl::StrCat(tensor, ": ", name);
    if (name == "shared_memory_region") {
      if (p.parameter_choice_case() != InferParameter::kStringParam) return WrongKind(what, p, "a string_param");
      slice.region = p.string_param();
      has_region = true;
    } else if (name == "shared_memory_byte_size" || name == "shared_memory_offset") {
      auto v = Unsigned(what, p);
      if (!v.ok()) return v.status();
      (name == "shared_memory_offset" ? slice.offset : slice.byte_size) = *v;
      has_size |= name == "shared_memory_byte_size";
      has_offset |= name == "shared_memory_offset";
    } else if (name == "binary_data_size") {
      if (auto v = Unsigned(what, p); !v.ok()) return v.status();
    } else if (name == "binary_data" || name == "binary_data_output") {
      if (p.parameter_choice_case() != InferParameter::kBoolParam) return WrongKind(what, p, "a bool_param");
    } else {
      return Bad(tensor, absl::StrCat("unknown tensor parameter '", name, "'"));
    }
  }
  if (!has_region && !has_size && !has_offset) return std::nullopt;
  if (!has_region || !has_size)
    return Bad(tensor, "shared memory needs both shared_memory_region and shared_memory_byte_size");
  return slice;
}

// The native region slice: the first `bytes` of the caller's slice.
void SetSlice(const SharedMemorySlice& slice, uint64_t bytes, v1::RegionSlice* out) {
  out->set_region(slice.region);
  out->set_offset(slice.offset);
  out->set_byte_size(bytes);
}

template <typename T>
std::string RawBytes(const google::protobuf::RepeatedField<T>& values) {
  // Little-endian on every platform drafthead builds for, as the protocol's raw contents are.
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Typed contents of the input: FP32 reads fp32_contents, as raw little-endian bytes would be read
// (the same native validation follows). BF16 has no typed field in the protocol.
absl::Status TypedContents(const inference::ModelInferRequest::InferInputTensor& in, size_t values,
                           v1::LogitsRequest* r) {
  const inference::InferTensorContents& c = in.contents();
  const std::pair<const char*, int> others[] = {
      {"bool_contents", c.bool_contents_size()},     {"int_contents", c.int_contents_size()},
      {"int64_contents", c.int64_contents_size()},   {"uint_contents", c.uint_contents_size()},
      {"uint64_contents", c.uint64_contents_size()}, {"fp64_contents", c.fp64_contents_size()},
      {"bytes_contents", c.bytes_contents_size()}};
  if (in.datatype() != "FP32")
    return Bad(kInput, "BF16 has no typed contents field in the protocol: send raw_input_contents");
  for (const auto& [field, n] : others)
    if (n > 0)
      return Bad(kInput, absl::StrCat("contents.", field, " is set: FP32 values are read from contents.fp32_contents"));
  if (static_cast<size_t>(c.fp32_contents_size()) != values)
    return Bad(kInput, absl::StrCat("contents.fp32_contents holds ", c.fp32_contents_size(), " values; shape [",
                                    in.shape(0), ", ", in.shape(1), "] is ", values));
  r->set_hidden(RawBytes(c.fp32_contents()));
  return absl::OkStatus();
}

// The bytes the request's mode makes of output `name` (0: the mode does not make it).
uint64_t OutputBytes(const std::string& name, const v1::LogitsRequest& r, const ModelDescription& model) {
  const uint64_t rows = r.rows();
  if (r.mode() == v1::FULL_LOGITS)
    return name == "logits" ? rows * model.vocab_size * (r.logits_dtype() == v1::FP32 ? 4 : 2) : 0;
  const uint64_t k = r.mode() == v1::TOP_K ? r.top_k() : 1;
  if (name == "token_ids" || name == "values" || (name == "probs" && r.mode() == v1::TOP_K && r.return_probs()))
    return rows * k * 4;
  return 0;
}

absl::Status TranslateInput(inference::ModelInferRequest& req, const ModelDescription& model,
                            TranslatedRequest* t) {
  v1::LogitsRequest* r = &t->native;
  if (req.inputs_size() != 1)
    return Bad("inputs", absl::StrCat("want exactly one input tensor, ", kInput, "; got ", req.inputs_size()));
  const auto& in = req.inputs(0);
  if (in.name() != kInput)
    return Bad("inputs", absl::StrCat("unknown input '", in.name(), "' (the model's one input is ", kInput, ")"));
  size_t esize;
  if (in.datatype() == "BF16") {
    r->set_hidden_dtype(v1::BF16);
    esize = 2;
  } else if (in.datatype() == "FP32") {
    r->set_hidden_dtype(v1::FP32);
    esize = 4;
  } else {
    return Bad(kInput, absl::StrCat("datatype '", in.datatype(), "' is not served (BF16 or FP32)"));
  }
  if (in.shape_size() != 2 || in.shape(1) != model.hidden_size || in.shape(0) < 1 ||
      in.shape(0) > model.max_rows)
    return Bad(kInput, absl::StrCat("shape [", absl::StrJoin(in.shape(), ", "), "]: want [rows, ",
                                    model.hidden_size, "] with rows in 1..", model.max_rows));
  auto shm = ParseTensorParameters(kInput, in.parameters());
  if (!shm.ok()) return shm.status();
  const size_t values = static_cast<size_t>(in.shape(0)) * model.hidden_size;
  const size_t want = values * esize;
  const std::string tensor_bytes = absl::StrCat("shape [", in.shape(0), ", ", model.hidden_size,
                                                "] of ", in.datatype(), " is ", want, " bytes");
  r->set_rows(static_cast<uint32_t>(in.shape(0)));
  // One source of bytes: a region, typed contents or raw_input_contents (Triton refuses two).
  const int sources = int{shm->has_value()} + int{in.has_contents()} + int{req.raw_input_contents_size() != 0};
  if (sources > 1)
    return Bad(kInput, absl::StrCat("its values come from more than one of shared memory (",
                                    shm->has_value() ? "set" : "unset", "), contents (",
                                    in.has_contents() ? "set" : "unset", ") and raw_input_contents (",
                                    req.raw_input_contents_size(), " entries): send one"));
  if (shm->has_value()) {
    if ((*shm)->byte_size != want)
      return Bad(kInput, absl::StrCat("shared_memory_byte_size ", (*shm)->byte_size, "; ", tensor_bytes));
    SetSlice(**shm, want, r->mutable_hidden_region());
    return absl::OkStatus();
  }
  if (in.has_contents()) return TypedContents(in, values, r);
  if (req.raw_input_contents_size() != 1)
    return Bad(kInput, absl::StrCat("want its bytes in raw_input_contents[0], the one entry; got ",
                                    req.raw_input_contents_size(), " entries"));
  std::string& raw = *req.mutable_raw_input_contents(0);
  if (raw.size() != want)
    return Bad(kInput, absl::StrCat("raw_input_contents[0] holds ", raw.size(), " bytes; ", tensor_bytes));
  r->set_hidden(std::move(raw));
  return absl::OkStatus();
}

absl::Status TranslateOutputs(const inference::ModelInferRequest& req, const ModelDescription& model,
                              TranslatedRequest* t) {
  for (const auto& o : req.outputs()) {
    if (std::find(std::begin(kOutputs), std::end(kOutputs), o.name()) == std::end(kOutputs))
      return Bad("outputs", absl::StrCat("unknown output '", o.name(), "' (the model's outputs: ",
                                         absl::StrJoin(kOutputs, ", "), ")"));
    if (std::find(t->outputs.begin(), t->outputs.end(), o.name()) != t->outputs.end())
      return Bad("outputs", absl::StrCat("'", o.name(), "' is requested twice"));
    auto shm = ParseTensorParameters(o.name(), o.parameters());
    if (!shm.ok()) return shm.status();
    const uint64_t bytes = OutputBytes(o.name(), t->native, model);
    if (shm->has_value() && (*shm)->byte_size < bytes)
      return Bad(o.name(), absl::StrCat("shared_memory_byte_size ", (*shm)->byte_size,
                                        " is less than the output's ", bytes, " bytes"));
    if (shm->has_value() && bytes > 0) {
      if (o.name() == "logits")
        SetSlice(**shm, bytes, t->native.mutable_logits_region());
      else
        t->output_shm[o.name()] = **shm;
    }
    t->outputs.push_back(o.name());
  }
  return absl::OkStatus();
}

// Appends one output tensor [rows, cols] and its raw bytes.
void AddOutput(const char* name, const char* datatype, int64_t rows, int64_t cols,
               std::string bytes, inference::ModelInferResponse* out) {
  auto* t = out->add_outputs();
  t->set_name(name);
  t->set_datatype(datatype);
  t->add_shape(rows);
  t->add_shape(cols);
  *out->add_raw_output_contents() = std::move(bytes);
}

void AddTensorMetadata(const char* name, const char* datatype, int64_t cols,
                       google::protobuf::RepeatedPtrField<inference::ModelMetadataResponse::TensorMetadata>* list) {
  auto* t = list->Add();
  t->set_name(name);
  t->set_datatype(datatype);
  t->add_shape(-1);
  t->add_shape(cols);
}

void AddConfigOutput(const char* name, inference::DataType type, int64_t cols, inference::ModelConfig* c) {
  auto* o = c->add_output();
  o->set_name(name);
  o->set_data_type(type);
  o->add_dims(-1);
  o->add_dims(cols);
}

}  // namespace

ModelDescription DescribeModel(const v1::ModelInfo& info, std::string name) {
  ModelDescription m;
  m.name = std::move(name);
  m.hidden_size = info.hidden_size();
  m.vocab_size = info.vocab_size();
  m.max_rows = info.max_rows();
  m.max_top_k = info.max_top_k();
  m.has_bf16 = std::find(info.heads().begin(), info.heads().end(), v1::BF16_EXACT) != info.heads().end();
  return m;
}

absl::Status CheckModel(const ModelDescription& model, const std::string& name,
                        const std::string& version) {
  if (name != model.name)
    return absl::NotFoundError(absl::StrCat("unknown model '", name, "' (this server serves '", model.name, "')"));
  if (!version.empty() && version != kModelVersion)
    return absl::NotFoundError(absl::StrCat("model '", model.name, "' has no version '", version,
                                            "' (its one version is ", kModelVersion, ")"));
  return absl::OkStatus();
}

absl::StatusOr<TranslatedRequest> TranslateRequest(inference::ModelInferRequest req,
                                                   const ModelDescription& model) {
  if (absl::Status s = CheckModel(model, req.model_name(), req.model_version()); !s.ok()) return s;
  TranslatedRequest t;
  t.id = req.id();
  if (absl::Status s = TranslateInput(req, model, &t); !s.ok()) return s;
  // Sorted, so that of two bad parameters the same one is named every time.
  std::vector<std::string> names;
  for (const auto& [name, value] : req.parameters()) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names)
    if (absl::Status s = ApplyParameter(name, req.parameters().at(name), model, &t); !s.ok()) return s;
  if (absl::Status s = TranslateOutputs(req, model, &t); !s.ok()) return s;
  return t;
}

bool WantsFinalResponseFlag(const inference::ModelInferRequest& req) {
  const auto it = req.parameters().find(kEnableFinalResponse);
  return it != req.parameters().end() && it->second.parameter_choice_case() == InferParameter::kBoolParam &&
         it->second.bool_param();
}

void TranslateResponse(const TranslatedRequest& req, const ModelDescription& model,
                       v1::LogitsResponse& native, inference::ModelInferResponse* out) {
  out->set_model_name(model.name);
  out->set_model_version(kModelVersion);
  out->set_id(req.id);
  auto& params = *out->mutable_parameters();
  params["queue_us"].set_int64_param(native.timing().queue_us());
  params["compute_us"].set_int64_param(native.timing().compute_us());
  params["batch_rows"].set_int64_param(native.timing().batch_rows());

  const v1::LogitsRequest& r = req.native;
  const int64_t rows = r.rows();
  const bool full = r.mode() == v1::FULL_LOGITS;
  const bool probs = r.mode() == v1::TOP_K && r.return_probs();
  const int64_t k = full ? 0 : native.token_ids_size() / std::max<int64_t>(rows, 1);
  std::vector<std::string> names = req.outputs;
  if (names.empty()) names.assign(std::begin(kOutputs), std::end(kOutputs));
  for (const std::string& name : names) {
    if (name == "logits" && full) {
      AddOutput("logits", native.logits_dtype() == v1::FP32 ? "FP32" : "BF16", rows,
                native.vocab_size(), std::move(*native.mutable_logits()), out);
    } else if (name == "token_ids" && !full) {
      AddOutput("token_ids", "INT32", rows, k, RawBytes(native.token_ids()), out);
    } else if (name == "values" && !full) {
      AddOutput("values", "FP32", rows, k, RawBytes(native.values()), out);
    } else if (name == "probs" && probs) {
      AddOutput("probs", "FP32", rows, k, RawBytes(native.probs()), out);
    }
  }
}

inference::ServerMetadataResponse ServerMetadata(const std::vector<std::string>& extensions) {
  inference::ServerMetadataResponse m;
  m.set_name("drafthead");
  m.set_version(kVersion);
  for (const std::string& e : extensions) m.add_extensions(e);
  return m;
}

inference::ModelMetadataResponse ModelMetadata(const ModelDescription& model) {
  inference::ModelMetadataResponse m;
  m.set_name(model.name);
  m.add_versions(kModelVersion);
  m.set_platform(kPlatform);
  AddTensorMetadata(kInput, "BF16", model.hidden_size, m.mutable_inputs());
  AddTensorMetadata("logits", "BF16", model.vocab_size, m.mutable_outputs());
  AddTensorMetadata("token_ids", "INT32", -1, m.mutable_outputs());
  AddTensorMetadata("values", "FP32", -1, m.mutable_outputs());
  AddTensorMetadata("probs", "FP32", -1, m.mutable_outputs());
  return m;
}

inference::ModelConfig ModelConfig(const ModelDescription& model) {
  inference::ModelConfig c;
  c.set_name(model.name);
  c.set_platform(kPlatform);
  c.set_backend(kPlatform);
  c.set_max_batch_size(0);  // the client sends [rows, K]; the server batches requests itself
  auto* in = c.add_input();
  in->set_name(kInput);
  in->set_data_type(inference::TYPE_BF16);
  in->add_dims(-1);
  in->add_dims(model.hidden_size);
  AddConfigOutput("logits", inference::TYPE_BF16, model.vocab_size, &c);
  AddConfigOutput("token_ids", inference::TYPE_INT32, -1, &c);
  AddConfigOutput("values", inference::TYPE_FP32, -1, &c);
  AddConfigOutput("probs", inference::TYPE_FP32, -1, &c);
  return c;
}

namespace {

void SetDuration(const DurationStat& d, inference::StatisticDuration* out) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}

}  // namespace

inference::ModelStatistics ModelStatistics(const ModelDescription& model, const InferenceStats& stats) {
  inference::ModelStatistics m;
  m.set_name(model.name);
  m.set_version(kModelVersion);
  m.set_last_inference(stats.last_inference_ms);
  m.set_inference_count(stats.inference_count);
  m.set_execution_count(stats.execution_count);
  auto* s = m.mutable_inference_stats();
  SetDuration(stats.success, s->mutable_success());
  SetDuration(stats.fail, s->mutable_fail());
  SetDuration(stats.queue, s->mutable_queue());
  SetDuration(stats.compute.input, s->mutable_compute_input());
  SetDuration(stats.compute.infer, s->mutable_compute_infer());
  SetDuration(stats.compute.output, s->mutable_compute_output());
  for (const auto& [size, c] : stats.batches) {  // std::map: ascending
    auto* b = m.add_batch_stats();
    b->set_batch_size(size);
    SetDuration(c.input, b->mutable_compute_input());
    SetDuration(c.infer, b->mutable_compute_infer());
    SetDuration(c.output, b->mutable_compute_output());
  }
  return m;
}

inference::RepositoryIndexResponse RepositoryIndex(const ModelDescription& model, bool serving, bool ready_only) {
  inference::RepositoryIndexResponse r;
  if (ready_only && !serving) return r;
  auto* m = r.add_models();
  m->set_name(model.name);
  m->set_version(kModelVersion);
  m->set_state(serving ? "READY" : "LOADING");
  if (!serving) m->set_reason("the rank group is loading its shards");
  return r;
}

}  // namespace drafthead::kserve
