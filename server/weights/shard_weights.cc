#include "server/weights/shard_weights.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "kernels/numeric.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace drafthead {
namespace {

// safetensors data is little-endian and is copied as is.
static_assert(std::endian::native == std::endian::little);

std::string SyntheticName(uint64_t seed) { return absl::StrCat("synthetic(seed=", seed, ")"); }

std::string Where(const std::string& file, const std::string& tensor) {
  return absl::StrCat(file, ": tensor '", tensor, "': ");
}

absl::Status CheckHidden(int64_t k, const std::string& where) {
  if (k <= 0 || k % 32 != 0)
    return absl::InvalidArgumentError(
        absl::StrCat(where, "hidden size ", k, " is not a positive multiple of 32 (the twin's ",
                     "32x32 blocks need it)"));
  return absl::OkStatus();
}

struct Opened {
  std::unique_ptr<st::Checkpoint> ckpt;
  const st::SafetensorsFile* file = nullptr;  // owned by ckpt
  HeadShape shape;
};

absl::StatusOr<Opened> OpenHead(const WeightsConfig& cfg) {
  if (cfg.weights.empty())
    return absl::InvalidArgumentError("no weights: give a checkpoint FILE|DIR or a synthetic seed");
  // Directory-level errors (no index, several files) do not mention the tensor: add it.
  auto name_tensor = [&](const absl::Status& s) {
    if (s.message().find(cfg.tensor) != absl::string_view::npos) return s;
    return absl::Status(s.code(),
                        absl::StrCat(s.message(), " (reading tensor '", cfg.tensor, "')"));
  };
  Opened o;
  absl::StatusOr<std::unique_ptr<st::Checkpoint>> ckpt = st::Checkpoint::Open(cfg.weights);
  if (!ckpt.ok()) return name_tensor(ckpt.status());
  o.ckpt = *std::move(ckpt);
  absl::StatusOr<const st::SafetensorsFile*> f = o.ckpt->File(cfg.tensor);
  if (!f.ok()) return name_tensor(f.status());
  o.file = *f;
  const st::TensorInfo* t = o.file->header().Find(cfg.tensor);  // File() checked it is there
  const std::string where = Where(o.file->path(), cfg.tensor);
  if (t->dtype != st::DType::kBF16 || t->shape.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat(where, "is ", st::DTypeName(t->dtype), " with ",
                                                   t->shape.size(),
                                                   " dims; the LM head must be 2-D BF16"));
  o.shape.rows = t->shape[0];
  o.shape.hidden = t->shape[1];
  o.shape.source = o.file->path();
  DH_RETURN_IF_ERROR(CheckHidden(o.shape.hidden, where));
  if (o.shape.rows <= 0) return absl::InvalidArgumentError(where + "has no rows");
  if (cfg.hidden_size != 0 && cfg.hidden_size != o.shape.hidden)
    return absl::InvalidArgumentError(absl::StrCat(where, "hidden size ", o.shape.hidden,
                                                   " but ", cfg.hidden_size, " was configured"));
  if (cfg.padded_vocab != 0 && cfg.padded_vocab != o.shape.rows)
    return absl::InvalidArgumentError(absl::StrCat(where, o.shape.rows, " rows but padded vocab ",
                                                   cfg.padded_vocab, " was configured"));
  return o;
}

// Runs `fn(r0, r1)` over [0, rows) in slices, each slice in parallel on the pool, reporting
// progress on this thread after each slice; stops at the first slice whose error is set.
class SlicedLoad {
 public:
  SlicedLoad(cpu::ThreadPool& pool, const LoadProgress& progress, uint64_t total)
      : pool_(pool), progress_(progress), total_(total) {}

  template <typename Fn>  // absl::Status fn(int64_t r0, int64_t r1), thread-safe
  absl::Status Run(int64_t rows, uint64_t bytes_per_row, Fn fn) {
    constexpr int64_t kSlices = 32;
    const int64_t slice = std::max<int64_t>(64, (rows + kSlices - 1) / kSlices);
    for (int64_t s0 = 0; s0 < rows; s0 += slice) {
      const int64_t s1 = std::min(rows, s0 + slice);
      std::mutex mu;
      absl::Status first;  // the error with the smallest row, so the report is deterministic
      int64_t first_row = INT64_MAX;
      pool_.ParallelFor(s1 - s0, 8, [&](int64_t a, int64_t b) {
        absl::Status s = fn(s0 + a, s0 + b);
        if (s.ok()) return;
        std::lock_guard<std::mutex> l(mu);
        if (s0 + a < first_row) {
          first_row = s0 + a;
          first = std::move(s);
        }
      });
      if (!first.ok()) return first;
      Advance(static_cast<uint64_t>(s1 - s0) * bytes_per_row);
    }
    return absl::OkStatus();
  }

  void Advance(uint64_t bytes) {
    done_ += bytes;
    if (progress_) progress_(done_, total_);
  }
  uint64_t done() const { return done_; }

 private:
  cpu::ThreadPool& pool_;
  const LoadProgress& progress_;
  uint64_t total_, done_ = 0;
};

// bf16 inf/NaN: exponent all ones.
bool Bf16Finite(uint16_t b) { return (b & 0x7f80u) != 0x7f80u; }

absl::Status LoadCheckpointRows(const Opened& o, const WeightsConfig& cfg, const ShardGeometry& geo,
                                uint16_t* dst, SlicedLoad& load) {
  const st::TensorInfo* t = o.file->header().Find(cfg.tensor);
  const int64_t k = geo.hidden;
  const int64_t base = geo.row_begin();
  const st::SafetensorsFile* f = o.file;
  return load.Run(geo.rows_present(), static_cast<uint64_t>(k) * 2,
                  [&](int64_t r0, int64_t r1) -> absl::Status {
    uint16_t* out = dst + r0 * k;
    DH_RETURN_IF_ERROR(f->ReadRows(cfg.tensor, base + r0, r1 - r0, out,
                                   static_cast<uint64_t>(r1 - r0) * k * 2));
    // Our copy is all we need: drop the mapped pages from this process's resident set.
    f->ReleaseRows(*t, base + r0, r1 - r0);
    for (int64_t i = 0; i < (r1 - r0) * k; ++i) {
      if (!Bf16Finite(out[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(f->path(), cfg.tensor), "non-finite weight (bf16 bits 0x",
            absl::Hex(out[i]), ") at row ", base + r0 + i / k, ", column ", i % k));
      }
    }
    return absl::OkStatus();
  });
}

// Integer metadata values the twin must agree on.
absl::Status CheckTwinMeta(const st::SafetensorsFile& f, const std::string& key, int64_t want) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) return absl::OkStatus();
  int64_t got = 0;
  if (!absl::SimpleAtoi(it->second, &got) || got != want)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": __metadata__ ", key, "=",
                                                   it->second, " but this server has ", want));
  return absl::OkStatus();
}

absl::Status CheckTwinSource(const st::SafetensorsFile& f, const WeightsConfig& cfg) {
  const auto& m = f.metadata();
  if (auto it = m.find("format"); it != m.end() && it->second != kTwinFormat)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": __metadata__ format '", it->second,
                                                   "', expected '", kTwinFormat, "'"));
  const auto tensor = m.find("tensor");
  const auto seed = m.find("synthetic_seed");
  if (cfg.synthetic_seed) {
    if (tensor != m.end())
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": the twin was built from checkpoint tensor '", tensor->second,
          "' but the weights are ", SyntheticName(*cfg.synthetic_seed)));
    if (seed != m.end() && seed->second != absl::StrCat(*cfg.synthetic_seed))
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": the twin was built from ",
                                                     "synthetic seed ", seed->second, " but the ",
                                                     "weights are ",
                                                     SyntheticName(*cfg.synthetic_seed)));
  } else {
    if (seed != m.end())
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": the twin was built from synthetic weights (seed ", seed->second,
          ") but the weights are tensor '", cfg.tensor, "' of ", cfg.weights));
    if (tensor != m.end() && tensor->second != cfg.tensor)
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": the twin was built from tensor '",
                                                     tensor->second, "', not '", cfg.tensor, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckTwinTensor(const st::SafetensorsFile& f, const std::string& name, st::DType dtype,
                             std::vector<int64_t> shape) {
  DH_ASSIGN_OR_RETURN(const st::TensorInfo* t, f.Find(name));
  if (t->dtype != dtype || t->shape != shape) {
    auto dims = [](const std::vector<int64_t>& s) {
      std::string out = "[";
      for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
      return out + "]";
    };
    return absl::InvalidArgumentError(absl::StrCat(Where(f.path(), name), st::DTypeName(t->dtype),
                                                   " ", dims(t->shape), ", expected ",
                                                   st::DTypeName(dtype), " ", dims(shape),
                                                   " for this shard"));
  }
  return absl::OkStatus();
}

absl::Status LoadTwin(const WeightsConfig& cfg, const ShardGeometry& geo, ShardWeights& out,
                      SlicedLoad& load) {
  DH_ASSIGN_OR_RETURN(std::unique_ptr<st::SafetensorsFile> f, st::SafetensorsFile::Open(cfg.twin));
  const int64_t s = geo.shard_rows, k = geo.hidden;
  const int64_t erows = cpu::TwinExpRows(s), ecols = k / 32;
  const std::string codes_name = TwinCodesTensor(geo.rank), exp_name = TwinExpTensor(geo.rank);
  DH_RETURN_IF_ERROR(CheckTwinTensor(*f, codes_name, st::DType::kF8E4M3, {s, k}));
  DH_RETURN_IF_ERROR(CheckTwinTensor(*f, exp_name, st::DType::kU8, {erows, ecols}));
  DH_RETURN_IF_ERROR(CheckTwinMeta(*f, "tp", geo.tp));
  DH_RETURN_IF_ERROR(CheckTwinMeta(*f, "hidden", geo.hidden));
  DH_RETURN_IF_ERROR(CheckTwinMeta(*f, "padded_vocab", geo.padded_vocab));
  DH_RETURN_IF_ERROR(CheckTwinMeta(*f, "shard_rows", geo.shard_rows));
  DH_RETURN_IF_ERROR(CheckTwinSource(*f, cfg));

  out.exps.resize(static_cast<size_t>(erows * ecols));
  DH_RETURN_IF_ERROR(f->ReadAll(exp_name, out.exps.data(), out.exps.size()));
  for (size_t i = 0; i < out.exps.size(); ++i) {
    if (out.exps[i] == 255)  // e = 128 is outside the twin's clamp [-127, 127]
      return absl::InvalidArgumentError(absl::StrCat(Where(f->path(), exp_name),
                                                     "exponent 255 at block row ", i / ecols,
                                                     ", column ", i % ecols));
  }
  load.Advance(out.exps.size());

  out.codes.resize(static_cast<size_t>(s * k));
  const st::TensorInfo* t = f->header().Find(codes_name);
  return load.Run(s, static_cast<uint64_t>(k), [&](int64_t r0, int64_t r1) -> absl::Status {
    uint8_t* dst = out.codes.data() + r0 * k;
    DH_RETURN_IF_ERROR(
        f->ReadRows(codes_name, r0, r1 - r0, dst, static_cast<uint64_t>(r1 - r0) * k));
    f->ReleaseRows(*t, r0, r1 - r0);
    for (int64_t i = 0; i < (r1 - r0) * k; ++i) {
      if ((dst[i] & 0x7f) == 0x7f)  // e4m3fn NaN: make_twin never produces it
        return absl::InvalidArgumentError(absl::StrCat(Where(f->path(), codes_name),
                                                       "NaN code at shard row ", r0 + i / k,
                                                       " (global row ", geo.row_begin() + r0 + i / k,
                                                       "), column ", i % k));
    }
    return absl::OkStatus();
  });
}

absl::Status CheckGeometry(const ShardGeometry& geo, const HeadShape& shape) {
  if (geo.tp < 1 || geo.rank < 0 || geo.rank >= geo.tp || geo.hidden != shape.hidden ||
      geo.padded_vocab != shape.rows || geo.shard_rows != (geo.padded_vocab + geo.tp - 1) / geo.tp)
    return absl::InvalidArgumentError(absl::StrCat(
        "shard geometry (tp ", geo.tp, ", rank ", geo.rank, ", hidden ", geo.hidden, ", rows ",
        geo.padded_vocab, ", shard rows ", geo.shard_rows, ") does not fit ", shape.source,
        " (hidden ", shape.hidden, ", rows ", shape.rows, ")"));
  return absl::OkStatus();
}

}  // namespace

std::string TwinCodesTensor(int rank) { return absl::StrCat("shard.", rank, ".e4m3"); }
std::string TwinExpTensor(int rank) { return absl::StrCat("shard.", rank, ".exp"); }

std::map<std::string, std::string> TwinMetadata(const WeightsConfig& cfg,
                                                const ShardGeometry& geo) {
  std::map<std::string, std::string> m = {
      {"format", kTwinFormat},
      {"tp", absl::StrCat(geo.tp)},
      {"hidden", absl::StrCat(geo.hidden)},
      {"padded_vocab", absl::StrCat(geo.padded_vocab)},
      {"shard_rows", absl::StrCat(geo.shard_rows)},
  };
  if (cfg.synthetic_seed) {
    m["synthetic_seed"] = absl::StrCat(*cfg.synthetic_seed);
  } else {
    m["tensor"] = cfg.tensor;
    m["weights"] = cfg.weights;
  }
  return m;
}

absl::StatusOr<HeadShape> ProbeHeadShape(const WeightsConfig& cfg) {
  if (cfg.synthetic_seed) {
    HeadShape s;
    s.source = SyntheticName(*cfg.synthetic_seed);
    s.hidden = cfg.hidden_size;
    s.rows = cfg.padded_vocab;
    DH_RETURN_IF_ERROR(CheckHidden(s.hidden, s.source + ": "));
    if (s.rows <= 0)
      return absl::InvalidArgumentError(
          absl::StrCat(s.source, ": padded vocab ", s.rows, " must be positive"));
    return s;
  }
  DH_ASSIGN_OR_RETURN(Opened o, OpenHead(cfg));
  return o.shape;
}

absl::StatusOr<ShardWeights> LoadShardWeights(const WeightsConfig& cfg, const ShardGeometry& geo,
                                              bool need_bf16, const LoadProgress& progress) {
  Opened opened;
  if (cfg.synthetic_seed) {
    DH_ASSIGN_OR_RETURN(opened.shape, ProbeHeadShape(cfg));
  } else {
    DH_ASSIGN_OR_RETURN(opened, OpenHead(cfg));
  }
  DH_RETURN_IF_ERROR(CheckGeometry(geo, opened.shape));

  ShardWeights out;
  out.geo = geo;
  const bool want_bf16 = need_bf16 || cfg.twin.empty();
  const int64_t s = geo.shard_rows, k = geo.hidden;
  uint64_t total = 0;
  if (want_bf16) total += static_cast<uint64_t>(s * k) * 2;
  if (!cfg.twin.empty())
    total += static_cast<uint64_t>(s * k) + static_cast<uint64_t>(cpu::TwinExpRows(s) * (k / 32));
  cpu::ThreadPool pool(cfg.threads);
  SlicedLoad load(pool, progress, total);

  if (!cfg.twin.empty()) DH_RETURN_IF_ERROR(LoadTwin(cfg, geo, out, load));
  if (want_bf16) {
    out.bf16.resize(static_cast<size_t>(s * k));  // zeros: the padding rows stay so
    if (cfg.synthetic_seed) {
      const uint64_t seed = *cfg.synthetic_seed;
      uint16_t* dst = out.bf16.data();
      DH_RETURN_IF_ERROR(load.Run(geo.rows_present(), static_cast<uint64_t>(k) * 2,
                                  [&](int64_t r0, int64_t r1) {
        SynthesizeRows(seed, geo.row_begin() + r0, r1 - r0, k, dst + r0 * k);
        return absl::OkStatus();
      }));
    } else {
      DH_RETURN_IF_ERROR(LoadCheckpointRows(opened, cfg, geo, out.bf16.data(), load));
    }
    const int64_t pad = s - geo.rows_present();
    if (pad > 0) load.Advance(static_cast<uint64_t>(pad * k) * 2);
  }
  if (load.done() != total) load.Advance(total - load.done());  // e.g. an empty shard
  return out;
}

}  // namespace drafthead
