// Log-linear (HDR-style) histogram of non-negative integers (the load tester records nanoseconds).
//
// Values below 2^(bits+1) have their own bucket (exact). Above, each power-of-two range
// [2^e, 2^(e+1)) is split into 2^bits equal buckets, so a bucket's width is at most 2^-bits of any
// value in it: a reported percentile (the bucket's midpoint, clamped to the exact min/max) is within
// a relative error of 2^-(bits+1) of the exact nearest-rank percentile. Recording is an index
// computation and an increment: no locks, no allocation (the bucket array is sized at
// construction). Histograms with the same `bits` merge by adding counts, so each thread keeps its
// own and they are combined at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace drafthead::client {

class LogLinearHistogram {
 public:
  // bits in [1, 12]: 7 gives <= 0.4% error in 128 buckets per octave. Values above `max_value` are
  // clamped to it (counted, and reported as max_value); max_value < 2^62.
  explicit LogLinearHistogram(int bits = 7, uint64_t max_value = uint64_t{1} << 40);

  void Record(uint64_t v) {
    if (v > max_value_) v = max_value_;
    ++counts_[IndexOf(v)];
    ++count_;
    sum_ += v;
    if (v < min_) min_ = v;
    if (v > max_) max_ = v;
  }
  // Adds `other`'s counts; both must have the same bits and max_value (else returns false).
  bool Merge(const LogLinearHistogram& other);
  void Clear();

  uint64_t count() const { return count_; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  double mean() const { return count_ ? static_cast<double>(sum_) / static_cast<double>(count_) : 0.0; }
  // Nearest-rank percentile, q in [0, 1]: the value of rank ceil(q * count) (rank 1 for q = 0).
  // 0 when empty.
  double Percentile(double q) const;

  // Bucket iteration (for plots and exports): [lower, upper) of bucket i and its count.
  size_t buckets() const { return counts_.size(); }
  uint64_t BucketCount(size_t i) const { return counts_[i]; }
  uint64_t BucketLower(size_t i) const;
  uint64_t BucketUpper(size_t i) const;  // exclusive
  int bits() const { return bits_; }

  // The largest relative error Percentile() can have against the exact nearest-rank value.
  double RelativeErrorBound() const { return 1.0 / static_cast<double>(uint64_t{1} << (bits_ + 1)); }

  size_t IndexOf(uint64_t v) const {
    if (v < two_m_) return static_cast<size_t>(v);
    const int b = 63 - __builtin_clzll(v);  // v in [2^b, 2^(b+1)), b >= bits + 1
    const int shift = b - bits_;
    return static_cast<size_t>(shift) * m_ + static_cast<size_t>(v >> shift);
  }

 private:
  int bits_;
  uint64_t m_;      // 2^bits sub-buckets per octave
  uint64_t two_m_;  // values below this are exact
  uint64_t max_value_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = std::numeric_limits<uint64_t>::max();
  uint64_t max_ = 0;
};

}  // namespace drafthead::client
