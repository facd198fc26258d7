#include "server/api/kserve_shm.h"

#include <initializer_list>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace drafthead::kserve {
namespace {

using regions::RegionKind;
using regions::RegionRegistry;

using FieldNames = std::initializer_list<std::pair<absl::string_view, absl::string_view>>;

// `s` with its leading field name (of `names`) replaced.
absl::Status Renamed(absl::Status s, FieldNames names) {
  for (const auto& [from, to] : names)
    if (absl::StartsWith(s.message(), from))
      return absl::Status(s.code(), absl::StrCat(to, s.message().substr(from.size())));
  return s;
}

// The registry names the native API's fields; these are the protocol's names for them.
absl::Status InProtocolTerms(absl::Status s) {
  return Renamed(std::move(s), {{"shm_key:", "key:"}, {"cuda_ipc_handle:", "raw_handle:"},
                                {"cuda_device:", "device_id:"}});
}

// A live access to a tensor's slice; errors name the tensor.
absl::StatusOr<regions::RegionAccess> OpenSlice(const RegionRegistry& registry, const std::string& tensor,
                                                const SharedMemorySlice& slice) {
  const std::string field = absl::StrCat(tensor, ": shared_memory_region");
  DH_ASSIGN_OR_RETURN(regions::RegionRef ref, registry.Find(slice.region, field));
  return ref.Access(slice.offset, slice.byte_size, field);
}

// The registered regions of `kind` (`name` set: that one, NOT_FOUND unless it is of that kind).
absl::StatusOr<std::vector<regions::RegionStatus>> ListKind(const RegionRegistry& registry,
                                                            const std::string& name, RegionKind kind) {
  DH_RETURN_IF_ERROR(registry.CheckEnabled(kind));
  DH_ASSIGN_OR_RETURN(std::vector<regions::RegionStatus> all, registry.List(name));
  std::vector<regions::RegionStatus> mine;
  for (auto& r : all)
    if (r.spec.kind == kind) mine.push_back(std::move(r));
  if (!name.empty() && mine.empty())
    return absl::NotFoundError(absl::StrCat("name: no ", regions::RegionKindName(kind), " region named '",
                                            name, "' is registered"));
  return mine;
}

}  // namespace

std::vector<std::string> SharedMemoryExtensions(const RegionRegistry& registry) {
  std::vector<std::string> out;
  if (registry.options().system) out.push_back("system_shared_memory");
  if (registry.options().cuda) out.push_back("cuda_shared_memory");
  return out;
}

absl::Status RegisterSystem(RegionRegistry& registry, const inference::SystemSharedMemoryRegisterRequest& req) {
  regions::RegionSpec spec;
  spec.name = req.name();
  spec.kind = RegionKind::kSystem;
  spec.shm_key = req.key();
  spec.offset = req.offset();
  spec.byte_size = req.byte_size();
  return InProtocolTerms(registry.Register(spec));
}

absl::Status RegisterCuda(RegionRegistry& registry, const inference::CudaSharedMemoryRegisterRequest& req) {
  DH_RETURN_IF_ERROR(registry.CheckEnabled(RegionKind::kCudaIpc));
  if (req.device_id() != registry.options().cuda_device)
    return absl::InvalidArgumentError(absl::StrCat(
        "device_id: ", req.device_id(), ": this server opens CUDA regions on GPU ",
        registry.options().cuda_device, " (rank 0's); memory on another GPU is registered through "
        "drafthead.v1 RegisterRegion with cuda_device = that GPU's PCI bus id"));
  regions::RegionSpec spec;
  spec.name = req.name();
  spec.kind = RegionKind::kCudaIpc;
  spec.cuda_ipc_handle = req.raw_handle();
  spec.byte_size = req.byte_size();
  return InProtocolTerms(registry.Register(spec));
}

absl::Status Unregister(RegionRegistry& registry, const std::string& name, RegionKind kind) {
  DH_RETURN_IF_ERROR(registry.CheckEnabled(kind));
  const absl::Status s = registry.Unregister(name, kind);
  // Triton answers OK for a name it does not hold (tritonclient unregisters on clean-up, whether or
  // not it registered); the native UnregisterRegion keeps NOT_FOUND.
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::StatusOr<inference::SystemSharedMemoryStatusResponse> SystemStatus(const RegionRegistry& registry,
                                                                         const std::string& name) {
  DH_ASSIGN_OR_RETURN(auto list, ListKind(registry, name, RegionKind::kSystem));
  inference::SystemSharedMemoryStatusResponse resp;
  for (const auto& r : list) {
    auto& s = (*resp.mutable_regions())[r.spec.name];
    s.set_name(r.spec.name);
    s.set_key(r.spec.shm_key);
    s.set_offset(r.spec.offset);
    s.set_byte_size(r.spec.byte_size);
  }
  return resp;
}

absl::StatusOr<inference::CudaSharedMemoryStatusResponse> CudaStatus(const RegionRegistry& registry,
                                                                     const std::string& name) {
  DH_ASSIGN_OR_RETURN(auto list, ListKind(registry, name, RegionKind::kCudaIpc));
  inference::CudaSharedMemoryStatusResponse resp;
  for (const auto& r : list) {
    auto& s = (*resp.mutable_regions())[r.spec.name];
    s.set_name(r.spec.name);
    s.set_device_id(static_cast<uint64_t>(r.cuda_device_id));
    s.set_byte_size(r.spec.byte_size);
  }
  return resp;
}

absl::Status InTensorTerms(absl::Status s) {
  return Renamed(std::move(s), {{"hidden_region:", "hidden: shared_memory_region:"},
                                {"logits_region:", "logits: shared_memory_region:"}});
}

absl::Status CheckSharedMemoryOutputs(const RegionRegistry* registry, const TranslatedRequest& t) {
  if (t.output_shm.empty()) return absl::OkStatus();
  if (registry == nullptr) return regions::SharedMemoryOff();
  DH_RETURN_IF_ERROR(registry->CheckAnyEnabled());
  for (const auto& [name, slice] : t.output_shm) DH_RETURN_IF_ERROR(OpenSlice(*registry, name, slice).status());
  return absl::OkStatus();
}

absl::Status WriteSharedMemoryOutputs(const RegionRegistry* registry, const TranslatedRequest& t,
                                      inference::ModelInferResponse* out) {
  if (t.output_shm.empty()) return absl::OkStatus();
  if (registry == nullptr) return regions::SharedMemoryOff();
  for (int i = 0; i < out->outputs_size(); ++i) {
    const auto it = t.output_shm.find(out->outputs(i).name());
    if (it == t.output_shm.end()) continue;
    std::string* bytes = out->mutable_raw_output_contents(i);
    DH_ASSIGN_OR_RETURN(regions::RegionAccess dst, OpenSlice(*registry, it->first, it->second));
    DH_RETURN_IF_ERROR(dst.Write(0, bytes->data(), bytes->size()));
    std::string().swap(*bytes);
  }
  return absl::OkStatus();
}

}  // namespace drafthead::kserve
