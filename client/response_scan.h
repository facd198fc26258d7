// Reading the measured fields of a serialized LogitsResponse without parsing it into a message:
// the load tester counts every answer at full speed, so it skips the logits bytes instead of
// copying them.
#pragma once

#include <cstdint>
#include <string>

#include <grpcpp/support/byte_buffer.h>

namespace drafthead::client {

inline constexpr int kMalformedCode = 13;  // INTERNAL: an answer we could not read

// Timing's per-stage fields, numbers 4 .. 3 + kTimingStages in this order
// (proto/drafthead/v1/drafthead.proto).
inline constexpr int kTimingStages = 9;
inline constexpr const char* kTimingStageNames[kTimingStages] = {
    "validate", "broadcast", "h2d", "gemv", "epilogue", "gather", "d2h", "combine", "server"};
// The stages Timing.step_untimed (field 13) says were not measured: h2d, gemv, epilogue, d2h.
inline constexpr bool IsStepStage(int stage) { return stage >= 2 && stage <= 6 && stage != 5; }

struct ScannedResponse {
  uint32_t rows = 0, queue_us = 0, compute_us = 0, batch_rows = 0;
  uint32_t stage_us[kTimingStages] = {};
  bool step_untimed = false;  // Timing.step_untimed: the IsStepStage stages read 0, unmeasured
  int32_t error_code = 0;
  bool has_error_message = false;
};

// False if the bytes are not a valid LogitsResponse encoding.
bool ScanLogitsResponse(const std::string& bytes, ScannedResponse* out);

// Reads one answer off the wire into *out. Returns its status code: 0, the in-band error's code,
// or kMalformedCode; unless 0, *msg points at a message that lives as long as the program.
int ScanAnswer(grpc::ByteBuffer* answer, ScannedResponse* out, const std::string** msg);

}  // namespace drafthead::client
