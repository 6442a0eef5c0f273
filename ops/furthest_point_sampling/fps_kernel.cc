// Furthest point sampling (fps_kernel.h): from the start point, repeatedly pick the point whose
// squared distance to the picked set is largest. Each point keeps the running minimum of its
// squared distances to the picks (starting at Rules::initial_distance); a pick is the argmax of
// those minima. Distances are sums over the coordinates in order, ((d0² + d1²) + d2²), in the
// compute type, so results equal a plain loop bit for bit.
//
// The points are grouped into blocks of nearby points (cells along a Z-order curve), stored column
// by column in the compute type. Each block keeps its bounding box and its largest minimum with
// that point; a pick updates only the blocks its new distances can lower (fps_step_impl.h proves
// the skip exact) and takes the largest block top. Late in a chain a pick touches a few blocks,
// not every point. The pick runs in the widest vector variant this CPU has (fps_variants.h).
#include "fps_kernel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <opbridge/cpu.h>

#include "fps_step_impl.h"
#include "fps_variants.h"

namespace opbridge::fps {

Variant scalar_variant() {
  return Variant{step<Scalar<float>, 0>, step<Scalar<float>, 3>, step<Scalar<double>, 0>, step<Scalar<double>, 3>,
                 "scalar"};
}

const Variant& best_variant() {
  static const Variant chosen = widest_variant(avx512_variant, avx2_variant, scalar_variant());
  return chosen;
}

namespace {

// Positions come in groups of this many (the widest vector), blocks too.
constexpr int64_t kLanes = 16;
// Points per block at most (measured: 128 to 512 were alike at 100 000 and 16 384 points).
constexpr int64_t kLeaf = 256;

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
};

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One segment's points in blocks (fps_variants.h's Blocks), and the storage behind it.
template <typename C>
struct Layout {
  std::vector<C> coord, dist, lo, hi, top;
  std::vector<uint64_t> key;
  std::vector<int64_t> begin, best, index;  // index: the segment's point at each position (-1: padding)
  Blocks<C> view;
};

// `pts` (the segment's non-skipped points, columns `col`) reordered along a Z-order curve and cut
// into blocks: returns the block boundaries. Each coordinate is quantised over the points' range
// (16 bits each, 48 at most shared by the first coordinates), the bits interleaved into a Morton
// code, and the codes radix-sorted (no comparison branches: a k-d split's selections cost more
// than all the picks). The blocks are the cells of the implied bisection tree, halved until at
// most kLeaf points are left: compact boxes. Any grouping gives the same picks; this one prunes.
template <typename C>
std::vector<int64_t> z_blocks(const std::vector<std::vector<C>>& col, std::vector<int64_t>& pts) {
  const int64_t n = static_cast<int64_t>(pts.size());
  const int dims = static_cast<int>(std::min<size_t>(col.size(), 48)), bits = std::min(16, 48 / dims);
  uint64_t spread[256];  // bit b of a byte to bit b * dims
  for (uint64_t v = 0; v < 256; ++v) {
    spread[v] = 0;
    for (int b = 0; b < 8 && b < bits; ++b) spread[v] |= ((v >> b) & 1) << (b * dims);
  }
  struct Item {
    uint64_t code;
    int64_t k;
  };
  std::vector<Item> items(static_cast<size_t>(n)), other(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) items[i] = {0, pts[i]};
  const double top = static_cast<double>((uint64_t{1} << bits) - 1);
  for (int c = 0; c < dims; ++c) {
    const std::vector<C>& x = col[c];
    C lo = x[pts[0]], hi = lo;
    for (int64_t k : pts) lo = std::min(lo, x[k]), hi = std::max(hi, x[k]);
    const double span = static_cast<double>(hi) - static_cast<double>(lo);
    if (!(span > 0 && std::isfinite(span))) continue;  // one value, or float64 points too far apart
    const double scale = top / span;
    for (Item& it : items) {
      const double q = (static_cast<double>(x[it.k]) - static_cast<double>(lo)) * scale;
      const uint64_t v = static_cast<uint64_t>(std::min(std::max(q, 0.0), top));
      uint64_t bits_of_v = spread[v & 255];
      if (bits > 8) bits_of_v |= spread[(v >> 8) & 255] << (8 * dims);  // then dims <= 5: the shift fits
      it.code |= bits_of_v << c;
    }
  }
  // LSD radix sort on bytes: stable, so equal codes keep the points' order.
  const int total = bits * dims;
  for (int shift = 0; shift < total; shift += 8) {
    int64_t count[257] = {};
    for (const Item& it : items) ++count[((it.code >> shift) & 255) + 1];
    if (*std::max_element(count + 1, count + 257) == n) continue;  // one digit value: nothing moves
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (const Item& it : items) other[count[(it.code >> shift) & 255]++] = it;
    items.swap(other);
  }
  std::vector<uint64_t> code(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) code[i] = items[i].code, pts[i] = items[i].k;
  std::vector<int64_t> bounds{0};
  struct Cell {
    int64_t b, e;
    int bit;
  };
  std::vector<Cell> todo{{0, n, total - 1}};
  while (!todo.empty()) {
    const Cell cell = todo.back();
    todo.pop_back();
    if (cell.e - cell.b <= kLeaf || cell.bit < 0) {
      for (int64_t b = cell.b + kLeaf; b < cell.e; b += kLeaf) bounds.push_back(b);  // equal codes: runs of kLeaf
      bounds.push_back(cell.e);
      continue;
    }
    // The codes of a cell share the bits above `bit`: those with it set come last.
    const int64_t mid = std::partition_point(code.begin() + cell.b, code.begin() + cell.e,
                                             [&](uint64_t v) { return !((v >> cell.bit) & 1); }) - code.begin();
    if (mid < cell.e) todo.push_back({mid, cell.e, cell.bit - 1});
    if (mid > cell.b) todo.push_back({cell.b, mid, cell.bit - 1});
  }
  return bounds;
}

template <typename C>
void build(const std::vector<std::vector<C>>& col, std::vector<int64_t> pts, const Rules& rules,
           const TieOrder& ties, Layout<C>& l) {
  constexpr C kInf = std::numeric_limits<C>::infinity();
  const int64_t dims = static_cast<int64_t>(col.size());
  const std::vector<int64_t> bounds = z_blocks(col, pts);
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1, padded_blocks = round_up(blocks, kLanes);
  l.begin.assign(static_cast<size_t>(padded_blocks + 1), 0);
  for (int64_t b = 0; b < blocks; ++b) l.begin[b + 1] = l.begin[b] + round_up(bounds[b + 1] - bounds[b], kLanes);
  const int64_t stride = l.begin[blocks];
  for (int64_t b = blocks; b < padded_blocks; ++b) l.begin[b + 1] = stride;
  l.coord.assign(static_cast<size_t>(dims * stride), C(0));
  l.dist.assign(static_cast<size_t>(stride), -kInf);
  l.key.assign(static_cast<size_t>(stride), ~uint64_t{0});
  l.index.assign(static_cast<size_t>(stride), -1);
  l.lo.assign(static_cast<size_t>(dims * padded_blocks), kInf);
  l.hi.assign(static_cast<size_t>(dims * padded_blocks), -kInf);
  l.top.assign(static_cast<size_t>(padded_blocks), -kInf);
  l.best.assign(static_cast<size_t>(padded_blocks), -1);
  const C initial = static_cast<C>(rules.initial_distance);
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t pos = l.begin[b];
    for (int64_t i = bounds[b]; i < bounds[b + 1]; ++i, ++pos) {
      const int64_t k = pts[i];
      for (int64_t c = 0; c < dims; ++c) {
        const C v = col[c][k];
        l.coord[c * stride + pos] = v;
        l.lo[c * padded_blocks + b] = std::min(l.lo[c * padded_blocks + b], v);
        l.hi[c * padded_blocks + b] = std::max(l.hi[c * padded_blocks + b], v);
      }
      l.dist[pos] = initial;
      l.key[pos] = ties.key(k);
      l.index[pos] = k;
      if (l.best[b] < 0 || l.key[pos] < l.key[l.best[b]]) l.best[b] = pos;  // every minimum ties at the start
    }
    l.top[b] = initial;
  }
  l.view = Blocks<C>{dims, stride, padded_blocks, l.coord.data(), l.dist.data(), l.key.data(), l.begin.data(),
                     l.lo.data(), l.hi.data(), l.top.data(), l.best.data()};
}

// One segment's chain, on the calling thread.
template <typename S, typename C, typename I>
void chain(const S* p, int64_t dims, const Segment& s, const Rules& rules, const TieOrder& ties, const Variant& v,
           I* out) {
  if (s.samples == 0) return;
  const int64_t base = rules.local_indices ? 0 : s.begin;
  out[s.out_begin] = static_cast<I>(base + s.start);
  if (s.samples == 1) return;
  std::vector<std::vector<C>> col(static_cast<size_t>(dims), std::vector<C>(static_cast<size_t>(s.count)));
  for (int64_t k = 0; k < s.count; ++k)
    for (int64_t d = 0; d < dims; ++d) col[d][k] = static_cast<C>(widen(p[(s.begin + k) * dims + d]));
  std::vector<int64_t> pts;
  pts.reserve(static_cast<size_t>(s.count));
  for (int64_t k = 0; k < s.count; ++k) {
    if (rules.skip_near_origin) {
      C mag = C(0);
      for (int64_t d = 0; d < dims; ++d) mag += col[d][k] * col[d][k];
      if (static_cast<double>(mag) <= 1e-3) continue;  // the original compares float with a double literal
    }
    pts.push_back(k);
  }
  if (pts.empty()) {  // no candidate: the CUDA reduction's default, point 0, from here on
    std::fill(out + s.out_begin + 1, out + s.out_begin + s.samples, static_cast<I>(base));
    return;
  }
  if (dims == 0) {  // no coordinates: every distance is 0, so the lowest key from here on
    const int64_t k =
        *std::min_element(pts.begin(), pts.end(), [&](int64_t a, int64_t b) { return ties.key(a) < ties.key(b); });
    std::fill(out + s.out_begin + 1, out + s.out_begin + s.samples, static_cast<I>(base + k));
    return;
  }
  Layout<C> l;
  build(col, std::move(pts), rules, ties, l);
  Step<C> step;
  if constexpr (std::is_same_v<C, float>) step = dims == 3 ? v.step3_f : v.step_f;
  else step = dims == 3 ? v.step3_d : v.step_d;
  std::vector<C> from(static_cast<size_t>(dims));
  for (int64_t d = 0; d < dims; ++d) from[d] = col[d][s.start];
  for (int64_t j = 1; j < s.samples; ++j) {
    const Found<C> f = step(l.view, from.data());
    const int64_t pick = l.index[f.pos];
    out[s.out_begin + j] = static_cast<I>(base + pick);
    if (f.dist <= C(0)) {  // every minimum is 0: the same pick from here on
      std::fill(out + s.out_begin + j + 1, out + s.out_begin + s.samples, static_cast<I>(base + pick));
      return;
    }
    for (int64_t d = 0; d < dims; ++d) from[d] = col[d][pick];
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
            TensorView& out, const Variant* variant) {
  const int64_t dims = points.dim(1);
  const Variant& v = variant ? *variant : best_variant();
  TieOrder ties{rules.threads, bit_width(rules.threads)};
  visit_dtype<float, double, Float16, BFloat16>(points.dtype, [&](auto zero) {
    using S = decltype(zero);
    using C = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S* p = points.data_as<S>();
    visit_dtype<int32_t, int64_t>(out.dtype, [&](auto izero) {
      using I = decltype(izero);
      I* o = out.data_as<I>();
      // Segments side by side: a pick of one segment is a few microseconds once its blocks prune,
      // less than a parallel region costs.
      ctx.parallel_for(static_cast<int64_t>(segments.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) chain<S, C, I>(p, dims, segments[i], rules, ties, v, o);
      });
    });
  });
}

}  // namespace opbridge::fps
