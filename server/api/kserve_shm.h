// Triton's shared-memory extension for the KServe v2 service, on the one region registry
// (server/regions/region_registry.h) that the native API's regions use too: a region registered
// through either API can be named by both. The RPCs in the protocol's terms; the data path is the
// native one (kserve_translate.h turns the input and `logits` into hidden_region / logits_region)
// except for the reductions' outputs, which the native API returns inline: those are written
// here when the request completes. An output in shared memory keeps its raw_output_contents entry,
// empty, as Triton keeps it.
//
// Threads: as the registry (every function is thread-safe). Failure: the registry's codes
// (FAILED_PRECONDITION when a kind is off, naming --shared-memory; NOT_FOUND for an unknown
// region named by a tensor or a Status call, while Unregister of one is OK as in Triton; ALREADY_EXISTS for a taken name; INVALID_ARGUMENT for a bad key, handle, slice or size),
// with the registry's field names restated as the protocol's (key, raw_handle, device_id) and a
// tensor's slice errors prefixed with the tensor.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"
#include "server/api/kserve_translate.h"
#include "server/regions/region_registry.h"

namespace drafthead::kserve {

// ServerMetadata.extensions names of the kinds the registry serves.
std::vector<std::string> SharedMemoryExtensions(const regions::RegionRegistry& registry);

absl::Status RegisterSystem(regions::RegionRegistry& registry,
                            const inference::SystemSharedMemoryRegisterRequest& req);
// Triton names the GPU by ordinal; the registry opens CUDA regions on rank 0's GPU (and takes
// others by PCI bus id through the native API): any other device_id is INVALID_ARGUMENT.
absl::Status RegisterCuda(regions::RegionRegistry& registry,
                          const inference::CudaSharedMemoryRegisterRequest& req);
// `name` empty: every region of that kind. A name not registered (as that kind) is OK, nothing
// done, as in Triton; only a kind that is off is an error (FAILED_PRECONDITION).
absl::Status Unregister(regions::RegionRegistry& registry, const std::string& name,
                        regions::RegionKind kind);
absl::StatusOr<inference::SystemSharedMemoryStatusResponse> SystemStatus(
    const regions::RegionRegistry& registry, const std::string& name);
absl::StatusOr<inference::CudaSharedMemoryStatusResponse> CudaStatus(
    const regions::RegionRegistry& registry, const std::string& name);

// A native error about hidden_region / logits_region restated for the tensor it came from.
absl::Status InTensorTerms(absl::Status s);

// Checks, before the request is queued, that every output region of t.output_shm exists and
// holds its slice. `registry` null or the kind off: FAILED_PRECONDITION naming --shared-memory.
absl::Status CheckSharedMemoryOutputs(const regions::RegionRegistry* registry, const TranslatedRequest& t);

// Moves the answer's outputs of t.output_shm into their regions (each region looked up again:
// one unregistered meanwhile is NOT_FOUND, and nothing is written to it).
absl::Status WriteSharedMemoryOutputs(const regions::RegionRegistry* registry, const TranslatedRequest& t,
                                      inference::ModelInferResponse* out);

}  // namespace drafthead::kserve
