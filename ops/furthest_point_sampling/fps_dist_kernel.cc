// furthest_point_sampling_with_dist's kernel (the op is defined in furthest_point_sampling.cc):
// furthest point sampling over a given distance matrix, as mmcv's
// furthest_point_sample_with_dist (3DSSD's feature-space FPS) computes it. The distances are
// read, not computed, so no spatial pruning applies: each pick reads one row of the matrix, O(N)
// per pick, as the original does.
//
// The original is one CUDA block of T threads per batch item (T the largest power of two not above
// N, at most 1024): thread t scans points t, t + T, ... keeping the largest running minimum (from
// -1, index 0: a thread whose minima are all below -1 offers point 0), and the block reduces the
// threads' bests pairwise (slot s takes slot s + half only when its value is larger). Both steps are
// reproduced, so ties, negative distances and npoint > N give the original's picks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <opbridge/half.h>

#include "fps_kernel.h"

namespace opbridge {
namespace {

template <typename S, typename C>
void chain(const S* dist, int64_t n, int64_t npoint, int64_t threads, int32_t* out) {
  if (npoint == 0) return;
  out[0] = 0;
  std::vector<C> temp(static_cast<size_t>(n), static_cast<C>(1e10));  // mmcv's temp buffer, filled with 1e10
  std::vector<C> best(static_cast<size_t>(threads));
  std::vector<int64_t> besti(static_cast<size_t>(threads));
  int64_t old = 0;
  for (int64_t j = 1; j < npoint; ++j) {
    std::fill(best.begin(), best.end(), C(-1));
    std::fill(besti.begin(), besti.end(), 0);
    const S* row = dist + old * n;
    for (int64_t k = 0, t = 0; k < n; ++k, t = t + 1 == threads ? 0 : t + 1) {
      const C d2 = std::min(static_cast<C>(widen(row[k])), temp[k]);
      temp[k] = d2;
      if (d2 > best[t]) best[t] = d2, besti[t] = k;
    }
    for (int64_t half = threads / 2; half >= 1; half /= 2)
      for (int64_t s = 0; s < half; ++s)
        if (best[s + half] > best[s]) best[s] = best[s + half], besti[s] = besti[s + half];
    old = besti[0];
    out[j] = static_cast<int32_t>(old);
  }
}

}  // namespace

void fps_with_dist_kernel(KernelContext& ctx, const TensorView& dist, int64_t npoint, int64_t tie_threads,
                          TensorView& idx) {
  const int64_t b = dist.dim(0), n = dist.dim(1);
  OB_CHECK(n > 0 || npoint == 0 || b == 0, "dist has no points to sample ", npoint, " from");
  OB_CHECK(n <= std::numeric_limits<int32_t>::max(), "dist has ", n, " points; idx is int32");
  // At most the original's block: 0 asks for the lowest index among equals, one thread's rule.
  const int64_t threads = std::max<int64_t>(fps::cuda_threads(n, tie_threads), 1);
  visit_dtype<float, double, Float16, BFloat16>(dist.dtype, [&](auto zero) {
    using S = decltype(zero);
    using C = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S* p = dist.data_as<S>();
    // NaN and infinite distances have no order: refused, naming the first.
    for (int64_t i = 0; i < dist.numel(); ++i)
      OB_CHECK(std::isfinite(static_cast<double>(widen(p[i]))), "dist has a value that is not finite (",
               static_cast<double>(widen(p[i])), " at batch item ", i / (n * n), ", row ", i / n % n, ", column ",
               i % n, ")");
    int32_t* out = idx.data_as<int32_t>();
    ctx.parallel_for(b, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) chain<S, C>(p + i * n * n, n, npoint, threads, out + i * npoint);
    });
  });
}

}  // namespace opbridge
