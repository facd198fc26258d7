// drafthead-quantize: builds the fp8 twin of every rank's shard offline and writes it as one
// safetensors file the server takes as --twin (SPEC "Command-line contract").
//
//   drafthead-quantize --weights=FILE|DIR [--tensor=lm_head.weight] --tp=N --out=FILE [--threads=T]
//   drafthead-quantize --synthetic=SEED --hidden-size=K --padded-vocab=N --tp=N --out=FILE
//
// One rank at a time: load its bf16 rows, MakeTwin, stream the codes and exponents out, free.
// Peak memory is one bf16 shard plus its twin. Exit codes: common/exit_codes.h (0 done, 2 bad
// flags, 1 failure).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/exit_codes.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/twin.h"
#include "common/safetensors.h"
#include "server/group/shard_geometry.h"
#include "common/status_macros.h"
#include "server/weights/shard_weights.h"

ABSL_FLAG(std::string, weights, "", "checkpoint: a .safetensors file or a directory");
ABSL_FLAG(std::string, tensor, "lm_head.weight", "the LM head tensor, bf16 [rows, K]");
ABSL_FLAG(int, tp, 0, "tensor-parallel ranks the twin is split for");
ABSL_FLAG(std::string, out, "", "output twin file (.safetensors)");
ABSL_FLAG(int, threads, 0, "worker threads; 0: one per hardware thread");
ABSL_FLAG(std::optional<uint64_t>, synthetic, std::nullopt,
          "use the seeded synthetic weights instead of a checkpoint (needs --hidden-size and "
          "--padded-vocab)");
ABSL_FLAG(int64_t, hidden_size, 0, "K: synthetic (required) or checked against the checkpoint");
ABSL_FLAG(int64_t, padded_vocab, 0, "rows: synthetic (required) or checked");

namespace drafthead {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

absl::Status Quantize(const WeightsConfig& cfg, int tp, const std::string& out) {
  const auto start = std::chrono::steady_clock::now();
  DH_ASSIGN_OR_RETURN(const HeadShape shape, ProbeHeadShape(cfg));
  const ShardGeometry geo0 = ShardGeometry::Make(tp, 0, shape.hidden, shape.rows, shape.rows);
  const int64_t s = geo0.shard_rows, k = geo0.hidden;
  const int64_t erows = cpu::TwinExpRows(s), ecols = k / 32;
  std::fprintf(stderr, "drafthead-quantize: %s [%lld, %lld] -> tp %d, %lld rows per shard\n",
               shape.source.c_str(), static_cast<long long>(shape.rows),
               static_cast<long long>(k), tp, static_cast<long long>(s));

  std::vector<st::TensorSpec> specs;
  for (int r = 0; r < tp; ++r) {
    specs.push_back({TwinCodesTensor(r), st::DType::kF8E4M3, {s, k}});
    specs.push_back({TwinExpTensor(r), st::DType::kU8, {erows, ecols}});
  }
  std::map<std::string, std::string> meta = TwinMetadata(cfg, geo0);
  meta["source"] = shape.source;
  DH_ASSIGN_OR_RETURN(std::unique_ptr<st::SafetensorsWriter> writer,
                      st::SafetensorsWriter::Create(out, std::move(specs), meta));

  cpu::ThreadPool pool(cfg.threads);
  std::vector<uint8_t> codes(static_cast<size_t>(s * k)), exps(static_cast<size_t>(erows * ecols));
  for (int r = 0; r < tp; ++r) {
    const ShardGeometry geo = geo0.ForRank(r);
    const auto t0 = std::chrono::steady_clock::now();
    DH_ASSIGN_OR_RETURN(ShardWeights w, LoadShardWeights(cfg, geo, /*need_bf16=*/true));
    const double load_s = Seconds(t0);
    const auto t1 = std::chrono::steady_clock::now();
    cpu::MakeTwin(w.bf16.data(), s, k, codes.data(), exps.data(), pool);
    w = ShardWeights();  // free the bf16 shard before the next rank loads its own
    const double twin_s = Seconds(t1);
    DH_RETURN_IF_ERROR(writer->Append(codes.data(), codes.size()));
    DH_RETURN_IF_ERROR(writer->Append(exps.data(), exps.size()));
    std::fprintf(stderr,
                 "  rank %d/%d: rows [%lld, %lld) (%lld present), load %.2fs, "
                 "twin %.2fs\n",
                 r, tp, static_cast<long long>(geo.row_begin()),
                 static_cast<long long>(geo.row_begin() + s),
                 static_cast<long long>(geo.rows_present()), load_s, twin_s);
  }
  DH_RETURN_IF_ERROR(writer->Finish());
  const double mb = static_cast<double>(tp) * static_cast<double>(codes.size() + exps.size()) / 1e6;
  std::fprintf(stderr, "drafthead-quantize: wrote %s: %d shards, %.1f MB in %.2fs\n", out.c_str(),
               tp, mb, Seconds(start));
  return absl::OkStatus();
}

}  // namespace
}  // namespace drafthead

int main(int argc, char** argv) {
  drafthead::SetProgramInfo(
      "drafthead-quantize",
      "builds the fp8 twin: --weights=FILE|DIR --tensor=NAME --tp=N --out=FILE, or "
      "--synthetic=SEED --hidden-size=K --padded-vocab=N --tp=N --out=FILE");
  std::vector<std::string> storage;
  std::vector<char*> args = drafthead::NormalizeFlagNames(argc, argv, storage);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());

  drafthead::WeightsConfig cfg;
  cfg.weights = absl::GetFlag(FLAGS_weights);
  cfg.tensor = absl::GetFlag(FLAGS_tensor);
  cfg.synthetic_seed = absl::GetFlag(FLAGS_synthetic);
  cfg.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  cfg.padded_vocab = absl::GetFlag(FLAGS_padded_vocab);
  cfg.threads = absl::GetFlag(FLAGS_threads);
  const int tp = absl::GetFlag(FLAGS_tp);
  const std::string out = absl::GetFlag(FLAGS_out);

  std::string usage;
  if (tp < 1) usage = "--tp must be >= 1";
  else if (out.empty()) usage = "--out is required";
  else if (cfg.weights.empty() == !cfg.synthetic_seed.has_value())
    usage = "give exactly one of --weights and --synthetic";
  if (!usage.empty()) {
    std::fprintf(stderr, "drafthead-quantize: %s\n", usage.c_str());
    return drafthead::kExitUsage;
  }
  const absl::Status s = drafthead::Quantize(cfg, tp, out);
  if (!s.ok()) {
    std::fprintf(stderr, "drafthead-quantize: error: %s\n", s.ToString().c_str());
    return drafthead::kExitFailed;
  }
  return drafthead::kExitOk;
}
