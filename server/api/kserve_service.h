// inference.GRPCInferenceService (KServe v2 / Open Inference Protocol, with Triton's streaming and
// model-configuration RPCs) on rank 0, beside drafthead.v1.DraftHead on the same port. A thin
// layer: every inference is translated (kserve_translate.h) into the native LogitsRequest and run
// by DraftHeadService::Submit, so it is validated, queued, batched with native requests, computed
// and answered by the same code; the native answer is translated back.
//
// Readiness: ServerReady and ModelReady say what grpc.health.v1 says (SERVING once every rank holds
// its shard); ModelInfer before that is UNAVAILABLE, as ComputeLogits is. ServerLive is always
// true (the process answers).
//
// Shared memory (Triton's extension, kserve_shm.h): on the server's region registry, the one the
// native API's regions use; without one (or with a kind off) the RPCs and tensor parameters answer
// FAILED_PRECONDITION naming --shared-memory, and ServerMetadata does not list the extension.
//
// Threads: gRPC's callback threads; no handler blocks (Unregister waits, bounded, for a copy in
// progress); completions run where the native ones do.
// Lifetime: `native`, `health` and `regions` outlive this; this outlives the gRPC server.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"
#include "server/api/health.h"
#include "server/api/kserve_translate.h"
#include "server/api/service.h"
#include "server/regions/region_registry.h"

namespace drafthead {

// ModelStreamInfer is registered raw (ByteBuffers in and out), as StreamLogits is (service.h): each
// answer is serialized once into the buffer its stream's budget counts and gRPC writes from.
namespace kserve_base {
using G = inference::GRPCInferenceService;
// Every RPC of the service (as its generated CallbackService lists them), ModelStreamInfer raw; a
// new RPC: add its WithCallbackMethod_ here, or its override does not compile.
using Service = G::WithCallbackMethod_ServerLive<G::WithCallbackMethod_ServerReady<G::WithCallbackMethod_ModelReady<
    G::WithCallbackMethod_ServerMetadata<G::WithCallbackMethod_ModelMetadata<G::WithCallbackMethod_ModelInfer<
        G::WithRawCallbackMethod_ModelStreamInfer<G::WithCallbackMethod_ModelConfig<
            G::WithCallbackMethod_ModelStatistics<G::WithCallbackMethod_RepositoryIndex<
                G::WithCallbackMethod_SystemSharedMemoryStatus<G::WithCallbackMethod_SystemSharedMemoryRegister<
                    G::WithCallbackMethod_SystemSharedMemoryUnregister<G::WithCallbackMethod_CudaSharedMemoryStatus<
                        G::WithCallbackMethod_CudaSharedMemoryRegister<G::WithCallbackMethod_CudaSharedMemoryUnregister<
                            G::Service>>>>>>>>>>>>>>>>;
}  // namespace kserve_base

class KServeService final : public kserve_base::Service {
 public:
  // `regions` may be null (no shared memory).
  KServeService(DraftHeadService& native, const HealthService& health, kserve::ModelDescription model,
                regions::RegionRegistry* regions);

  // The protocol extensions this service implements (ServerMetadata.extensions).
  const std::vector<std::string>& extensions() const { return extensions_; }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest* req,
                                       inference::ServerLiveResponse* resp) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest* req,
                                        inference::ServerReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* req,
                                       inference::ModelReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* req,
                                           inference::ServerMetadataResponse* resp) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* resp) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const inference::ModelConfigRequest* req,
                                        inference::ModelConfigResponse* resp) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const inference::ModelInferRequest* req,
                                       inference::ModelInferResponse* resp) override;
  // Answers strictly in request order (as Triton answers a non-decoupled model's stream), each
  // carrying its request's id; a refused one in-band, in its place: error_message
  // "CODE: field: why", infer_response with the id. The stream goes on. A request with
  // triton_enable_empty_final_response = true gets triton_final_response = true on its answer (its
  // only one: no empty final answer follows, as in Triton for a non-decoupled model). The stream is
  // one caller of the batcher's fair queueing; each answer is serialized once when it is ready.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* ctx) override;

  // Triton's statistics extension: the model's counts since start, every request through either
  // API (Metrics::inference_stats). `name` empty: every model (the one); unknown: NOT_FOUND.
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* req,
                                            inference::ModelStatisticsResponse* resp) override;
  // The one model and its state; load / unload are not served (not listed in extensions).
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* resp) override;

  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext* ctx,
                                                       const inference::SystemSharedMemoryRegisterRequest* req,
                                                       inference::SystemSharedMemoryRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext* ctx,
                                                         const inference::SystemSharedMemoryUnregisterRequest* req,
                                                         inference::SystemSharedMemoryUnregisterResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                     const inference::SystemSharedMemoryStatusRequest* req,
                                                     inference::SystemSharedMemoryStatusResponse* resp) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(grpc::CallbackServerContext* ctx,
                                                     const inference::CudaSharedMemoryRegisterRequest* req,
                                                     inference::CudaSharedMemoryRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(grpc::CallbackServerContext* ctx,
                                                       const inference::CudaSharedMemoryUnregisterRequest* req,
                                                       inference::CudaSharedMemoryUnregisterResponse* resp) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                   const inference::CudaSharedMemoryStatusRequest* req,
                                                   inference::CudaSharedMemoryStatusResponse* resp) override;

 private:
  class StreamReactor;

  // Translates, submits to the native service and translates the answer; `done` is called
  // exactly once (possibly before Infer returns), with the answer only when OK. `admitted`, when
  // given, sees the native request of a translated one just before it is submitted (a stream
  // reserves its answer's bytes there).
  // `req` by value: a stream moves its request in (kserve::TranslateRequest).
  void Infer(grpc::CallbackServerContext* ctx, inference::ModelInferRequest req,
             std::function<void(const absl::Status&, inference::ModelInferResponse*)> done,
             const std::function<void(const v1::LogitsRequest&)>& admitted = nullptr,
             bool may_run_inline = false,  // DraftHeadService::Submit's, and `caller`
             std::optional<CallerKey> caller = std::nullopt);

  DraftHeadService& native_;
  const HealthService& health_;
  const kserve::ModelDescription model_;
  regions::RegionRegistry* const regions_;
  const std::vector<std::string> extensions_;
};

}  // namespace drafthead
