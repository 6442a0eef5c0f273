// Furthest point sampling (fps_kernel.h): from the start point, repeatedly pick the point whose
// squared distance to the picked set is largest. Each point keeps the running minimum of its
// squared distances to the picks (starting at Rules::initial_distance); a pick is the argmax of
// those minima. Distances are sums over the coordinates in order, ((d0² + d1²) + d2²), in the
// compute type, so results equal a plain loop bit for bit.
#include "fps_kernel.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace opbridge::fps {
namespace {

// Points per task when one segment's scan is split over the thread pool: below this a chain runs
// on one thread, and segments run side by side.
constexpr int64_t kChunk = 8192;

int bit_width(int64_t threads) {
  int bits = 0;
  while ((int64_t{1} << bits) < threads) ++bits;
  return bits;
}

// Which of two equally distant points the original keeps: the lower key (see Rules::threads).
struct TieOrder {
  int64_t threads = 0;  // 0: by index
  int bits = 0;
  uint64_t key(int64_t k) const {
    if (threads == 0) return static_cast<uint64_t>(k);
    uint64_t t = static_cast<uint64_t>(k % threads), r = 0;
    for (int b = 0; b < bits; ++b, t >>= 1) r = (r << 1) | (t & 1);
    return (r << 32) | static_cast<uint64_t>(k);  // then the thread's lowest index
  }
  bool before(int64_t a, int64_t b) const { return key(a) < key(b); }
};

// The best candidate of a run of points: the largest distance, ties by TieOrder. `best` is -1 when
// the run has no candidate (every point skipped), as a CUDA thread without points reports it.
template <typename C>
struct Best {
  C dist = C(-1);
  int64_t index = 0;
  void offer(C d, int64_t k, const TieOrder& ties) {
    if (d > dist || (d == dist && dist >= C(0) && ties.before(k, index))) dist = d, index = k;
  }
};

// One segment's points as columns of the compute type, and its running minimum distances.
template <typename C>
struct Cloud {
  int64_t n = 0, dims = 0;
  std::vector<std::vector<C>> col;  // col[d][k]
  std::vector<C> dist;
  std::vector<uint8_t> skipped;     // Rules::skip_near_origin

  // Points [lo, hi): their distance to point `from` lowers their minimum; the best of them.
  Best<C> update(int64_t from, int64_t lo, int64_t hi, const TieOrder& ties) {
    Best<C> best;
    if (dims == 3) {
      const C* x = col[0].data();
      const C* y = col[1].data();
      const C* z = col[2].data();
      const C fx = x[from], fy = y[from], fz = z[from];
      for (int64_t k = lo; k < hi; ++k) {
        if (!skipped.empty() && skipped[k]) continue;
        const C dx = x[k] - fx, dy = y[k] - fy, dz = z[k] - fz;
        const C d = dx * dx + dy * dy + dz * dz;
        const C m = std::min(d, dist[k]);
        dist[k] = m;
        best.offer(m, k, ties);
      }
      return best;
    }
    for (int64_t k = lo; k < hi; ++k) {
      if (!skipped.empty() && skipped[k]) continue;
      C d = C(0);
      for (int64_t c = 0; c < dims; ++c) {
        const C v = col[c][k] - col[c][from];
        d += v * v;
      }
      const C m = std::min(d, dist[k]);
      dist[k] = m;
      best.offer(m, k, ties);
    }
    return best;
  }
};

template <typename S, typename C>
Cloud<C> load(const S* p, int64_t dims, const Segment& s, const Rules& rules) {
  Cloud<C> c;
  c.n = s.count, c.dims = dims;
  c.col.assign(static_cast<size_t>(dims), std::vector<C>(static_cast<size_t>(s.count)));
  for (int64_t k = 0; k < s.count; ++k)
    for (int64_t d = 0; d < dims; ++d) c.col[d][k] = static_cast<C>(widen(p[(s.begin + k) * dims + d]));
  c.dist.assign(static_cast<size_t>(s.count), static_cast<C>(rules.initial_distance));
  if (rules.skip_near_origin) {
    c.skipped.resize(static_cast<size_t>(s.count));
    for (int64_t k = 0; k < s.count; ++k) {
      C mag = C(0);
      for (int64_t d = 0; d < dims; ++d) mag += c.col[d][k] * c.col[d][k];
      c.skipped[k] = static_cast<double>(mag) <= 1e-3;  // the original compares float with a double literal
    }
  }
  return c;
}

// One segment's chain. With `parallel`, each scan is split over the pool in chunks combined in
// order (the same picks as one thread's scan).
template <typename S, typename C, typename I>
void chain(KernelContext& ctx, const S* p, int64_t dims, const Segment& s, const Rules& rules, const TieOrder& ties,
           I* out, bool parallel) {
  if (s.samples == 0) return;
  Cloud<C> cloud = load<S, C>(p, dims, s, rules);
  const int64_t base = rules.local_indices ? 0 : s.begin;
  const int64_t chunks = parallel ? (s.count + kChunk - 1) / kChunk : 1;
  std::vector<Best<C>> part(static_cast<size_t>(chunks));
  int64_t pick = s.start;
  out[s.out_begin] = static_cast<I>(base + pick);
  for (int64_t j = 1; j < s.samples; ++j) {
    Best<C> best;
    if (chunks == 1) {
      best = cloud.update(pick, 0, s.count, ties);
    } else {
      ctx.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) part[c] = cloud.update(pick, c * kChunk, std::min(s.count, (c + 1) * kChunk), ties);
      });
      for (const Best<C>& q : part)
        if (q.dist >= C(0)) best.offer(q.dist, q.index, ties);
    }
    pick = best.index;  // 0 when every point is skipped: what the CUDA reduction's default gives
    out[s.out_begin + j] = static_cast<I>(base + pick);
    if (best.dist <= C(0)) {  // every minimum is 0 (or no point counts): the same pick from here on
      std::fill(out + s.out_begin + j + 1, out + s.out_begin + s.samples, static_cast<I>(base + pick));
      return;
    }
  }
}

}  // namespace

int64_t cuda_threads(int64_t largest, int64_t cap) {
  if (cap <= 0) return 0;
  int64_t t = 1;
  while (t <= std::min(largest, cap) / 2) t *= 2;  // t * 2 <= min(...) without overflowing at 2^62
  return t;
}

void sample(KernelContext& ctx, const TensorView& points, const std::vector<Segment>& segments, const Rules& rules,
            TensorView& out) {
  const int64_t dims = points.dim(1);
  TieOrder ties{rules.threads, bit_width(rules.threads)};
  int64_t largest = 0;
  for (const Segment& s : segments) largest = std::max(largest, s.count);
  // Few large segments: each scan split over the pool; else segments side by side.
  const bool split = segments.size() < 4 && largest >= 2 * kChunk;
  visit_dtype<float, double, Float16, BFloat16>(points.dtype, [&](auto zero) {
    using S = decltype(zero);
    using C = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S* p = points.data_as<S>();
    visit_dtype<int32_t, int64_t>(out.dtype, [&](auto izero) {
      using I = decltype(izero);
      I* o = out.data_as<I>();
      if (split) {
        for (const Segment& s : segments) chain<S, C, I>(ctx, p, dims, s, rules, ties, o, true);
        return;
      }
      ctx.parallel_for(static_cast<int64_t>(segments.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) chain<S, C, I>(ctx, p, dims, segments[i], rules, ties, o, false);
      });
    });
  });
}

}  // namespace opbridge::fps
