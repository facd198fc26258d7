// KServe v2 / Triton (inference.GRPCInferenceService) <-> the native API: a ModelInferRequest
// becomes the very LogitsRequest a native caller would send (so it is validated by
// server/request/request.cc and batched like any other), and the native answer becomes a
// ModelInferResponse. Also the model's description in the protocol's terms (metadata, config).
// Pure functions, no threads.
//
// The mapping (docs/client.md has it for callers):
//   input `hidden` (BF16 | FP32, shape [rows, K], in raw_input_contents[0], FP32 in
//     contents.fp32_contents, or in a shared-memory region: exactly one of them)
//     -> rows, hidden (or hidden_region), hidden_dtype
//   parameters mode / top_k / return_probs / temperature / seed / head / logits_dtype -> the fields;
//   Triton's reserved request parameters with Triton's types: `timeout` (microseconds) -> a queue
//   deadline; `priority`, `sequence_*`, `headers`, `binary_data_output` checked and ignored (a
//   model without priorities or sequences); `triton_enable_empty_final_response` read by the
//   stream (WantsFinalResponseFlag); any other `triton_*` refused, as Triton refuses it. Unknown
//   names are refused (Triton would hand them to a backend; drafthead has no backend parameters).
//   Tensor parameters: shared_memory_region / _byte_size / _offset; binary_data_size,
//   binary_data, binary_data_output (sent by Triton's and KServe's clients) checked and ignored.
//   outputs: full_logits -> `logits` ([rows, vocab], BF16 | FP32); otherwise `token_ids` (INT32
//   [rows, k]), `values` (FP32) and, with return_probs, `probs` (FP32).
// Errors: INVALID_ARGUMENT whose message starts with the tensor or parameter it is about
// ("hidden: ...", "top_k: ..."); an unknown model or version NOT_FOUND.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "drafthead/v1/drafthead.pb.h"
#include "inference/grpc_service.pb.h"
#include "server/sched/metrics.h"

namespace drafthead::kserve {

inline constexpr char kModelVersion[] = "1";  // the one version the model has
inline constexpr char kPlatform[] = "drafthead";

// The served model, as the protocol describes it.
struct ModelDescription {
  std::string name = "drafthead";  // --model-name
  uint32_t hidden_size = 0;
  uint32_t vocab_size = 0;
  uint32_t max_rows = 0;
  uint32_t max_top_k = 0;
  bool has_bf16 = false;  // the BF16_EXACT head is kept
};

ModelDescription DescribeModel(const v1::ModelInfo& info, std::string name);

// NOT_FOUND unless `name` is the model's and `version` is empty or kModelVersion.
absl::Status CheckModel(const ModelDescription& model, const std::string& name,
                        const std::string& version);

// A tensor placed in a shared-memory region (Triton's tensor parameters shared_memory_region,
// shared_memory_byte_size, shared_memory_offset).
struct SharedMemorySlice {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// A ModelInferRequest as the native request, with what the answer must carry back. The input in
// shared memory becomes the native hidden_region, `logits` in shared memory the native
// logits_region (its first rows x vocab x dtype bytes), so the native path reads and writes them;
// the reductions' outputs in shared memory (which the native API returns inline) are written by
// kserve_shm.h.
struct TranslatedRequest {
  v1::LogitsRequest native;
  std::string id;                    // echoed
  uint64_t timeout_us = 0;           // Triton's `timeout`: still queued after it, refused; 0: none
  std::vector<std::string> outputs;  // the requested outputs in order; empty: all the mode makes
  std::map<std::string, SharedMemorySlice> output_shm;  // token_ids / values / probs, by name
};

// Checks the model, the input tensor, the parameters and the requested outputs; the limits that
// the native API checks (rows, top_k, temperature, finiteness, ...) are left to its validation.
// Shared-memory parameters are checked for form and size here (the input's byte size must be the
// tensor's, an output's at least the output's); the regions themselves where they are used.
// By value: a caller done with its request moves it in, and the input's bytes move on into the
// native request uncopied.
absl::StatusOr<TranslatedRequest> TranslateRequest(inference::ModelInferRequest req,
                                                   const ModelDescription& model);

// True when the request asks (triton_enable_empty_final_response = true) for Triton's
// `triton_final_response` flag on its stream answers. Read from the raw request, so that a refused
// request's in-band answer carries it too.
bool WantsFinalResponseFlag(const inference::ModelInferRequest& req);

// Fills `out` from the native answer to `req`. The logits bytes are moved out of `native`, not
// copied. Requested outputs the request's mode does not make (e.g. `logits` of a top_k request, as
// perf_analyzer asks for every output of the model) are left out. The native Timing is returned as
// int64 response parameters queue_us, compute_us and batch_rows.
void TranslateResponse(const TranslatedRequest& req, const ModelDescription& model,
                       v1::LogitsResponse& native, inference::ModelInferResponse* out);

// `extensions`: what this server implements (ServerMetadata lists exactly these).
inference::ServerMetadataResponse ServerMetadata(const std::vector<std::string>& extensions);
inference::ModelMetadataResponse ModelMetadata(const ModelDescription& model);
inference::ModelConfig ModelConfig(const ModelDescription& model);
// The model's statistics in the protocol's terms (batch_stats by batch size, ascending).
inference::ModelStatistics ModelStatistics(const ModelDescription& model, const InferenceStats& stats);
// The repository index: the one model, READY once serving (else LOADING); `ready_only` as the
// request's `ready`.
inference::RepositoryIndexResponse RepositoryIndex(const ModelDescription& model, bool serving, bool ready_only);

}  // namespace drafthead::kserve
