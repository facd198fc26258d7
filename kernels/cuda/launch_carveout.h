// The preferred shared-memory carveout of the kernels a thread launches (host-only, so that the
// CUDA backend's host code can set it around a step): LaunchKernel (dependent_launch.cuh) passes
// it as a launch attribute while a ScopedSharedCarveout lives.
#pragma once

namespace drafthead::cuda {

// Percent (cudaSharedCarveout's scale); -1 (the default): none given. Kernels of one chain that
// differ in carveout may make an SM reconfigure (drain) between them; an experiment knob of the
// CUDA backend (BackendOptions::cuda_smem_carveout, measured by drafthead-bench-step).
inline thread_local int t_shared_carveout = -1;
class ScopedSharedCarveout {
 public:
  explicit ScopedSharedCarveout(int percent) : saved_(t_shared_carveout) { t_shared_carveout = percent; }
  ~ScopedSharedCarveout() { t_shared_carveout = saved_; }
  ScopedSharedCarveout(const ScopedSharedCarveout&) = delete;
  ScopedSharedCarveout& operator=(const ScopedSharedCarveout&) = delete;

 private:
  int saved_;
};

}  // namespace drafthead::cuda
