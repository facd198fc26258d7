#include "client/histogram.h"

#include <algorithm>
#include <cmath>

namespace drafthead::client {

LogLinearHistogram::LogLinearHistogram(int bits, uint64_t max_value)
    : bits_(std::clamp(bits, 1, 12)),
      m_(uint64_t{1} << bits_),
      two_m_(uint64_t{2} << bits_),
      max_value_(std::min<uint64_t>(std::max<uint64_t>(max_value, two_m_), (uint64_t{1} << 62) - 1)) {
  counts_.assign(IndexOf(max_value_) + 1, 0);
}

bool LogLinearHistogram::Merge(const LogLinearHistogram& o) {
  if (o.bits_ != bits_ || o.max_value_ != max_value_) return false;
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
  count_ += o.count_;
  sum_ += o.sum_;
  min_ = std::min(min_, o.min_);
  max_ = std::max(max_, o.max_);
  return true;
}

void LogLinearHistogram::Clear() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = sum_ = max_ = 0;
  min_ = std::numeric_limits<uint64_t>::max();
}

uint64_t LogLinearHistogram::BucketLower(size_t i) const {
  if (i < two_m_) return i;
  const uint64_t shift = i / m_ - 1;  // i = shift * m + (v >> shift), (v >> shift) in [m, 2m)
  const uint64_t top = i - shift * m_;
  return top << shift;
}

uint64_t LogLinearHistogram::BucketUpper(size_t i) const {
  if (i < two_m_) return i + 1;
  const uint64_t shift = i / m_ - 1;
  return BucketLower(i) + (uint64_t{1} << shift);
}

double LogLinearHistogram::Percentile(double q) const {
  if (count_ == 0) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  rank = std::clamp<uint64_t>(rank, 1, count_);
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      const uint64_t lo = BucketLower(i), hi = BucketUpper(i);
      // Exact buckets hold one value; wider ones report their midpoint, kept inside [min, max].
      double v = (hi - lo == 1) ? static_cast<double>(lo) : 0.5 * static_cast<double>(lo + hi - 1);
      v = std::clamp(v, static_cast<double>(min()), static_cast<double>(max_));
      return v;
    }
  }
  return static_cast<double>(max_);
}

}  // namespace drafthead::client
