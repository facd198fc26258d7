// Where a rank's weights come from: a safetensors checkpoint (one file, or a directory holding a
// sharded checkpoint with model.safetensors.index.json), seeded synthetic weights, and optionally
// a precomputed fp8 twin (drafthead-quantize's output). Only the rows a rank owns are read.
//
// Untrusted input: every malformed file gets an error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/group/shard_geometry.h"

namespace drafthead {

struct WeightsConfig {
  std::string weights;                     // FILE or DIR; may be empty with synthetic_seed
  std::string tensor = "lm_head.weight";
  std::string twin;                        // optional twin file
  std::optional<uint64_t> synthetic_seed;  // synthetic weights instead of a checkpoint
  int64_t hidden_size = 0;   // synthetic: K (required); checkpoint: checked when nonzero
  int64_t padded_vocab = 0;  // synthetic: rows (required); checkpoint: checked when nonzero
  int threads = 0;           // loader threads (copy, check, synthesize); <= 0: hardware threads
};

struct HeadShape {
  int64_t hidden = 0;  // K
  int64_t rows = 0;    // padded vocab: the checkpoint tensor's rows
  std::string source;  // "synthetic(seed=7)" or the file the tensor lives in
};

// The LM head's shape, from the checkpoint header (or the synthetic config). K must be a
// positive multiple of 32.
absl::StatusOr<HeadShape> ProbeHeadShape(const WeightsConfig& cfg);

// Progress callback: bytes done of total, for the start-up report. Called on the thread that
// called LoadShardWeights, a few dozen times per load, last with done == total.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

// Rank geo.rank's shard (geo must agree with ProbeHeadShape's answer): bf16 rows
// [row_begin, row_begin + S) zero-padded past the checkpoint, read only when need_bf16 or no twin
// is configured; with cfg.twin, that rank's twin tensors
// (shapes checked against geo). Rejects non-finite weights (the twin of a NaN is undefined): the
// error names the file, the tensor and the global row. Uses cfg.threads threads; safe to call for
// several ranks at once (each call owns its pool and mappings).
absl::StatusOr<ShardWeights> LoadShardWeights(const WeightsConfig& cfg, const ShardGeometry& geo,
                                              bool need_bf16, const LoadProgress& progress = {});

// The synthetic generator: bf16 weights of rows [row0, row0 + nrows) of a [rows, k] head, a pure
// function of (seed, row, column) so any rank computes its rows independently. Gaussian entries
// with per-row scales varying over ~1.5 decades and a few outlier columns 8x larger.
// Entries are ~N(0, 1) x scale(seed, row), scale log-uniform in 0.02 x 10^[-0.75, 0.75); the 8
// outlier columns (a function of seed and k) are x8. dst: [nrows, k]. Thread-safe (pure).
void SynthesizeRows(uint64_t seed, int64_t row0, int64_t nrows, int64_t k, uint16_t* dst);

// ---- the twin file (drafthead-quantize writes it, LoadShardWeights reads it) ----------------
// Tensors per rank R: "shard.R.e4m3" F8_E4M3 [S, K] and "shard.R.exp" U8 [ceil(S/32), K/32].
std::string TwinCodesTensor(int rank);
std::string TwinExpTensor(int rank);

// The __metadata__ drafthead-quantize records: format, tp, hidden, padded_vocab, shard_rows and
// the source (tensor + weights path, or synthetic_seed). LoadShardWeights verifies each key that is
// present against its config and geometry.
std::map<std::string, std::string> TwinMetadata(const WeightsConfig& cfg, const ShardGeometry& geo);
inline constexpr char kTwinFormat[] = "drafthead-fp8-twin-v1";

}  // namespace drafthead
