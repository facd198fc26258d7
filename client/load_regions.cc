#include "client/load_regions.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/regions.h"
#include "common/status_macros.h"
#if defined(DRAFTHEAD_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace drafthead::client {
namespace {

// A pool's slices laid out one after the other: per request its hidden rows, then its logits.
struct Layout {
  std::vector<uint64_t> hidden_at, logits_at, logits_bytes;
  uint64_t total = 0;
};

Layout LayOut(const std::vector<v1::LogitsRequest>& reqs, uint32_t vocab) {
  Layout l;
  auto align = [](uint64_t n) { return (n + 255) & ~uint64_t{255}; };
  for (const auto& r : reqs) {
    l.hidden_at.push_back(l.total);
    l.total = align(l.total + r.hidden().size());
    const uint64_t lb = r.mode() == v1::FULL_LOGITS
                            ? uint64_t{r.rows()} * vocab * (r.logits_dtype() == v1::FP32 ? 4 : 2)
                            : 0;
    l.logits_at.push_back(l.total);
    l.logits_bytes.push_back(lb);
    l.total = align(l.total + lb);
  }
  return l;
}

class SystemLoadRegions final : public LoadRegions {
 public:
  std::unique_ptr<SystemRegion> region;
};

#if defined(DRAFTHEAD_HAVE_CUDA)
class CudaLoadRegions final : public LoadRegions {
 public:
  ~CudaLoadRegions() override {
    region.reset();  // unregistered before the memory goes
    if (device) cudaFree(device);
  }
  void* device = nullptr;
  std::unique_ptr<CudaRegion> region;
};
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<LoadRegions>> MoveToRegions(DraftHeadClient& client,
                                                           const std::string& kind,
                                                           uint32_t vocab_size,
                                                           std::vector<std::string>* pool) {
  std::vector<v1::LogitsRequest> reqs(pool->size());
  for (size_t i = 0; i < pool->size(); ++i) reqs[i].ParseFromString((*pool)[i]);
  const Layout l = LayOut(reqs, vocab_size);
  const std::string name = absl::StrCat("load.", getpid());
  std::unique_ptr<LoadRegions> owner;
  const RegisteredRegion* region = nullptr;
  if (kind == "system") {
    auto r = std::make_unique<SystemLoadRegions>();
    DH_ASSIGN_OR_RETURN(r->region, SystemRegion::Create(client, name, l.total));
    for (size_t i = 0; i < reqs.size(); ++i)
      std::memcpy(r->region->data() + l.hidden_at[i], reqs[i].hidden().data(), reqs[i].hidden().size());
    region = r->region.get();
    owner = std::move(r);
  } else if (kind == "cuda") {
#if defined(DRAFTHEAD_HAVE_CUDA)
    auto r = std::make_unique<CudaLoadRegions>();
    if (cudaError_t e = cudaMalloc(&r->device, l.total); e != cudaSuccess)
      return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc: ", cudaGetErrorString(e)));
    for (size_t i = 0; i < reqs.size(); ++i) {
      cudaError_t e = cudaMemcpy(static_cast<uint8_t*>(r->device) + l.hidden_at[i], reqs[i].hidden().data(),
                                 reqs[i].hidden().size(), cudaMemcpyHostToDevice);
      if (e != cudaSuccess) return absl::InternalError(absl::StrCat("cudaMemcpy: ", cudaGetErrorString(e)));
    }
    DH_ASSIGN_OR_RETURN(r->region, CudaRegion::Register(client, name, r->device, l.total));
    region = r->region.get();
    owner = std::move(r);
#else
    return absl::UnimplementedError("--shared-memory=cuda: this build of the client has no CUDA");
#endif
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared-memory=", kind, ": want system or cuda"));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    v1::LogitsRequest& r = reqs[i];
    *r.mutable_hidden_region() = region->Slice(l.hidden_at[i], r.hidden().size());
    r.clear_hidden();
    if (l.logits_bytes[i] > 0)
      *r.mutable_logits_region() = region->Slice(l.logits_at[i], l.logits_bytes[i]);
    (*pool)[i] = r.SerializeAsString();
  }
  return owner;
}

}  // namespace drafthead::client
