// Summary statistics of timed runs, as opbridge-run prints them.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace opbridge::run {

struct LatencyStats {
  double min_ms = 0, median_ms = 0, p90_ms = 0, p99_ms = 0;
  double runs_per_s = 0;  // timed runs divided by their total time
};

// Nearest-rank percentile (the smallest sample with at least q of the samples at or below it):
// always an observed time, never an interpolation between two runs.
inline double percentile_sorted(const std::vector<double>& sorted, double q) {
  const size_t n = sorted.size();
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  return sorted[rank - 1];
}

// `times_ms` must not be empty.
inline LatencyStats summarize(std::vector<double> times_ms) {
  std::sort(times_ms.begin(), times_ms.end());
  const size_t n = times_ms.size();
  LatencyStats s;
  s.min_ms = times_ms.front();
  s.median_ms = n % 2 ? times_ms[n / 2] : (times_ms[n / 2 - 1] + times_ms[n / 2]) / 2;
  s.p90_ms = percentile_sorted(times_ms, 0.90);
  s.p99_ms = percentile_sorted(times_ms, 0.99);
  const double total = std::accumulate(times_ms.begin(), times_ms.end(), 0.0);
  s.runs_per_s = total > 0 ? static_cast<double>(n) * 1e3 / total : 0;
  return s;
}

}  // namespace opbridge::run
