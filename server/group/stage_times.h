// Where one batch's time went across the group (microseconds of wall or device time). The compute
// backend fills its part (h2d, gemv, epilogue, d2h) on each Run; the engine adds the collectives'
// (broadcast, gather); the scheduler's metrics and responses read it. Below all three so that none
// of them includes another's header for it.
#pragma once

#include <cstdint>

namespace drafthead {

struct StageTimes {
  uint32_t broadcast_us = 0, h2d_us = 0, gemv_us = 0, epilogue_us = 0, gather_us = 0, d2h_us = 0;
  bool graph = false;  // the backend's step replayed a captured CUDA graph
  // The backend's stages (h2d .. d2h) were not measured (they read 0): the CUDA backend times one
  // step in BackendOptions::cuda_stage_events_every, each timed step costing ~5 us more.
  bool step_untimed = false;
};

}  // namespace drafthead
