// Where a rank's weights come from: a safetensors checkpoint (one file, or a directory holding a
// sharded checkpoint with model.safetensors.index.json), seeded synthetic weights, and optionally
// a precomputed fp8 twin (drafthead-quantize's output). Only the rows a rank owns are read.
//
// Untrusted input: every malformed file gets an error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/shard.h"

namespace drafthead {

struct WeightsConfig {
  std::string weights;                     // FILE or DIR; may be empty with synthetic_seed
  std::string tensor = "lm_head.weight";
  std::string twin;                        // optional twin file
  std::optional<uint64_t> synthetic_seed;  // synthetic weights instead of a checkpoint
  int64_t hidden_size = 0;   // synthetic: K (required); checkpoint: checked when nonzero
  int64_t padded_vocab = 0;  // synthetic: rows (required); checkpoint: checked when nonzero
};

struct HeadShape {
  int64_t hidden = 0;  // K
  int64_t rows = 0;    // padded vocab: the checkpoint tensor's rows
  std::string source;  // "synthetic(seed=7)" or the file the tensor lives in
};

// The LM head's shape, from the checkpoint header (or the synthetic config). K must be a
// positive multiple of 32.
absl::StatusOr<HeadShape> ProbeHeadShape(const WeightsConfig& cfg);

// Progress callback: bytes done of total, for the start-up report.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

// Rank geo.rank's shard: bf16 rows [row_begin, row_begin + S) zero-padded past the checkpoint,
// read only when need_bf16 or no twin is configured; with cfg.twin, that rank's twin tensors
// (shapes checked against geo). Rejects non-finite weights (the twin of a NaN is undefined).
absl::StatusOr<ShardWeights> LoadShardWeights(const WeightsConfig& cfg, const ShardGeometry& geo,
                                              bool need_bf16, const LoadProgress& progress = {});

// The synthetic generator: bf16 weights of rows [row0, row0 + nrows) of a [rows, k] head, a pure
// function of (seed, row, column) so any rank computes its rows independently. Gaussian entries
// with per-row scales varying over ~1.5 decades and a few outlier columns 8x larger.
void SynthesizeRows(uint64_t seed, int64_t row0, int64_t nrows, int64_t k, uint16_t* dst);

}  // namespace drafthead
