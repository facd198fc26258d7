// Shard geometry: which rows of the checkpoint's LM head a rank owns, and how many of them lie
// inside the cropped vocabulary. SPEC: S = ceil(rows / tp), rank r owns [r*S, (r+1)*S), a short
// last shard zero-padded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace drafthead {

struct ShardGeometry {
  int tp = 1;
  int rank = 0;
  int64_t hidden = 0;        // K
  int64_t padded_vocab = 0;  // checkpoint rows
  int64_t vocab_size = 0;    // crop, <= padded_vocab
  int64_t shard_rows = 0;    // S

  static ShardGeometry Make(int tp, int rank, int64_t hidden, int64_t padded_vocab,
                            int64_t vocab_size) {
    ShardGeometry g;
    g.tp = tp;
    g.rank = rank;
    g.hidden = hidden;
    g.padded_vocab = padded_vocab;
    g.vocab_size = vocab_size;
    g.shard_rows = (padded_vocab + tp - 1) / tp;
    return g;
  }
  int64_t row_begin() const { return static_cast<int64_t>(rank) * shard_rows; }
  // Checkpoint rows this rank reads (the rest of its shard is zero padding).
  int64_t rows_present() const {
    return std::clamp<int64_t>(padded_vocab - row_begin(), 0, shard_rows);
  }
  // Columns of this rank's logits inside the cropped vocabulary.
  int64_t valid_cols() const { return std::clamp<int64_t>(vocab_size - row_begin(), 0, shard_rows); }
  ShardGeometry ForRank(int r) const { return Make(tp, r, hidden, padded_vocab, vocab_size); }
};

// One rank's weights on the host, as the loader hands them to a backend.
struct ShardWeights {
  ShardGeometry geo;
  std::vector<uint16_t> bf16;  // [S, K] bf16 bits, zero-padded; empty when loaded from a twin only
  std::vector<uint8_t> codes;  // the fp8 twin [S, K] if loaded from --twin, else empty
  std::vector<uint8_t> exps;   // [ceil(S/32), K/32]
};

}  // namespace drafthead
