// Float64 reference implementations for tests (target drafthead_test_reference).
//
// Independent of the kernels on purpose: the twin is rebuilt from the SPEC text (exponent via
// std::frexp, e4m3 rounding by searching the table of e4m3 values, ties to the even code), logits
// are double-precision dot products of the exactly dequantized weights, and the full-vocabulary
// reductions sort whole rows. Only the SAMPLE noise comes from kernels/numeric.h, because the
// generator *is* the contract there.
//
// Typical end-to-end use (server output vs reference):
//   RefGemv ref = ReferenceLogits(w, rows, k, tp, x, m, vocab_size, RefHead::kFp8Twin);
//   for each (i, j): |got[i][j] - ref.y[i*V + j]| <= ref.Tolerance(i, j)   (+ bf16 rounding of
//   `got` when the server returned bf16: + 2^-8 * |ref|)
//   CheckTopK(ref.Row(i), got_ids, got_values, k, ref.RowTolerance(i)) == ""  (empty = ok)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace drafthead::ref {

// ---- random inputs (deterministic in seed) ------------------------------------------------------
// Gaussian N(0, stddev^2) rounded to bf16 (RNE).
std::vector<uint16_t> RandomBf16(size_t count, uint64_t seed, double stddev = 1.0);
// Fast wide-range bf16: random sign and mantissa, binary exponent uniform in [min_exp, max_exp]
// (unbiased, e.g. -8..0 gives magnitudes in [2^-8, 2); clamped to [-127, 127], where -127
// means bf16 subnormals). Always finite. For large arrays.
std::vector<uint16_t> RandomBf16Bits(size_t count, uint64_t seed, int min_exp, int max_exp);
// Random e4m3 codes as a twin may hold them (never the NaN codes 0x7f / 0xff).
std::vector<uint8_t> RandomTwinCodes(size_t count, uint64_t seed);
// Random biased block exponents in [lo, hi].
std::vector<uint8_t> RandomTwinExps(size_t count, uint64_t seed, int lo, int hi);

// ---- formats -----------------------------------------------------------------------------------
double RefBf16Value(uint16_t bits);
// e4m3fn (OCP FP8): value of a code from the format's definition; NaN for 0x7f / 0xff.
double RefE4m3Value(uint8_t code);
// fp32 -> e4m3fn code: nearest e4m3 value, ties to the even code. Values that round beyond 448
// (|f| > 464, i.e. to "480") and NaN give the NaN code 0x7f | sign, as PyTorch's cast does.
uint8_t RefFloatToE4m3(float f);
// SPEC step 3: e = ceil(log2(amax / 448.0f)) exactly (frexp), clamped to [-127, 127].
int RefTwinExponent(float amax);

// ---- the fp8 twin ------------------------------------------------------------------------------
struct RefTwin {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> codes;  // [n, k]
  std::vector<uint8_t> exps;   // [ceil(n/32), k/32], biased (e + 127)
};
// SPEC "The fp8 twin" for bf16 w [n, k] (k a multiple of 32), built independently of kernels/.
RefTwin ReferenceTwin(const uint16_t* w, int64_t n, int64_t k);
// Dequantized weight: e4m3 value x 2^(exp - 127).
double RefDequant(uint8_t code, uint8_t exp);

// ---- GEMV / logits in float64 ------------------------------------------------------------------
struct RefGemv {
  int m = 0;
  int64_t n = 0;
  std::vector<double> y;    // [m, n]: sum_k x * w
  std::vector<double> abs;  // [m, n]: sum_k |x * w|, the scale of fp32 rounding error
  double at(int i, int64_t j) const { return y[i * n + j]; }
  // What an fp32-accumulating kernel may differ by: rel * sum|x w| + abs_floor.
  double Tolerance(int i, int64_t j, double rel = 1e-5, double abs_floor = 1e-30) const {
    return rel * abs[i * n + j] + abs_floor;
  }
  // The largest Tolerance over row i (for reductions, which compare across columns).
  double RowTolerance(int i, double rel = 1e-5, double abs_floor = 1e-30) const;
  std::vector<double> Row(int i) const { return {y.begin() + i * n, y.begin() + (i + 1) * n}; }
};

// x bf16 [m, k] against a twin (codes [n, k], exps [ceil(n/32), k/32]).
RefGemv ReferenceGemvFp8(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                         const uint8_t* exps, int64_t n);
// Only output columns `cols` (for big shards): result is [m, cols.size()] in that order.
RefGemv ReferenceGemvFp8Cols(const uint16_t* x, int m, int64_t k, const uint8_t* codes,
                             const uint8_t* exps, const std::vector<int64_t>& cols);
// x bf16 [m, k] against bf16 w [n, k].
RefGemv ReferenceGemvBf16(const uint16_t* x, int m, int64_t k, const uint16_t* w, int64_t n);
RefGemv ReferenceGemvBf16Cols(const uint16_t* x, int m, int64_t k, const uint16_t* w,
                              const std::vector<int64_t>& cols);

// One shard's fp8 logits: builds the reference twin of bf16 w [n, k], then ReferenceGemvFp8.
RefGemv ReferenceTwinLogits(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int m);
// One shard's bf16 logits (= ReferenceGemvBf16).
RefGemv ReferenceBf16Logits(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int m);

enum class RefHead { kFp8Twin, kBf16Exact };
// What the whole service returns: w bf16 [rows, k] (the checkpoint), split into tp shards of
// S = ceil(rows / tp) rows (the short last one zero-padded), each shard's twin built on its own
// (blocks start at the shard's first row), logits concatenated and cropped to vocab_size.
// Result: [m, vocab_size].
RefGemv ReferenceLogits(const uint16_t* w, int64_t rows, int64_t k, int tp, const uint16_t* x,
                        int m, int64_t vocab_size, RefHead head);

// ---- full-vocabulary reductions (brute force over a whole row) ---------------------------------
// Order: larger value first, ties to the smaller id (as the server's ARGMAX / TOP_K).
std::vector<int32_t> RefTopK(const float* row, int64_t v, int k);
std::vector<int32_t> RefTopK(const std::vector<double>& row, int k);
int32_t RefArgmax(const float* row, int64_t v);
// softmax(row / T) in float64.
std::vector<double> RefSoftmax(const float* row, int64_t v, double temperature);
std::vector<double> RefSoftmax(const std::vector<double>& row, double temperature);
// SAMPLE: argmax_j SampleKey(row[j], T, seed, row_index, j) (kernels/numeric.h), ties to the
// smaller id.
int32_t RefSample(const float* row, int64_t v, float temperature, uint64_t seed,
                  uint32_t row_index);

// Tolerance-aware checks of a server answer against a float64 reference row (logits that differ
// from the reference by up to `tol` may legitimately reorder near-ties). Return "" when the answer
// is consistent, else a description of the first problem.
std::string CheckTopK(const std::vector<double>& ref_row, const int32_t* ids, const float* values,
                      int k, double tol);
std::string CheckArgmax(const std::vector<double>& ref_row, int32_t id, float value, double tol);
// The sampled id's Gumbel key must be within 2 tol / T of the best key (keys from the reference
// logits and numeric.h's noise).
std::string CheckSample(const std::vector<double>& ref_row, int32_t id, float temperature,
                        uint64_t seed, uint32_t row_index, double tol);

}  // namespace drafthead::ref
