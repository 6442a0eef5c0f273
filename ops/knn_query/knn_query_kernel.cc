// knn_query's kernel (the op is defined in knn_query.cc): one k-d tree per batch segment, built
// on every call, then a depth-first search per query point.
//
// Exactness contract: squared distances are (dx*dx + dy*dy) + dz*dz in the input dtype, the
// order is (distance, index), and the tree only ever prunes a subtree whose lower bound is
// provably larger (see `Query::bound`), so results equal a naive loop bit for bit. (Building
// with FMA contraction enabled would break the first point; the default x86-64 flags do not.)
#include "knn_query_kernel.h"

#include <opbridge/cpu.h>
#include <opbridge/float32_copy.h>
#include <opbridge/segments.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "knn_leaf_variants.h"

namespace opbridge {
namespace {

// Points per leaf at most; leaves get between kLeafSize/2 and kLeafSize (power-of-two leaf
// counts). Measured at k = 16: leaves of 16-32 points beat 6-12 by 15% and 24-48 by 7%.
constexpr int64_t kLeafSize = 32;
// How the k best are kept (measured at n = 100 000, see docs/ops/knn_query.md): at k = 1 one key,
// each leaf reduced to its smallest key first (no candidate list); above, a sorted array
// with branch-free insertion for float32 up to k = 32 (13% faster than a branching one at
// k = 16, slower from k = 64 and with float64's 128-bit keys), then a sorted array with
// branching insertion up to k = 128 (1.2x faster than a heap at k = 64), then a max-heap.
enum class Keep { One, BranchFree, Insertion, Heap };
constexpr int64_t kMaxBranchFreeK = 32;
constexpr int64_t kMaxInsertionK = 128;
// Padding index: larger than any row index (n < 2^31 is checked), so it sorts after real points.
constexpr int32_t kNoPoint = std::numeric_limits<int32_t>::max();

// ---- validation -------------------------------------------------------------------------------

// NaN has no place in a distance order and infinities make NaN distances: both are rejected.
template <typename T>
void check_finite(const T* p, int64_t rows, const char* name) {
  bool ok = true;
  for (int64_t i = 0; i < rows * 3; ++i) ok &= (p[i] - p[i]) == T(0);  // false for NaN and ±inf
  if (ok) return;
  for (int64_t i = 0; i < rows * 3; ++i)
    OB_CHECK(std::isfinite(p[i]), name, "[", i / 3, ", ", i % 3, "] = ", p[i], " is not finite");
}

// ---- the forest: one implicit, balanced k-d tree per segment ----------------------------------
//
// A segment of c points gets depth D, the least with ceil(c / 2^D) <= kLeafSize. Node i has
// children 2i+1 and 2i+2; a node covering sorted positions [b, e) splits them at
// mid = b + (e - b) / 2, so ranges follow from the node's path and are never stored. The
// median point's coordinate is the split: left points are <= split, right points >= split.
// Points are reordered so every leaf is a contiguous run of the coordinate arrays.

template <typename T>
struct BuildPoint {
  T c[3];
  int32_t idx;
};

template <typename T>
struct Forest {
  std::vector<int64_t> point_begin;  // per segment: first row in xyz (and in the reordered arrays)
  std::vector<int64_t> count;        // per segment: points
  std::vector<int> depth;            // per segment: -1 when no tree is built
  std::vector<int64_t> node_base;    // per segment: its node 0 in the node arrays
  std::vector<T> split;              // per node (leaves unused)
  std::vector<uint8_t> split_dim;    // per node (leaves unused)
  std::vector<int32_t> min_idx;      // per node: the smallest row index below it (for ties)
  std::vector<T> x, y, z;            // reordered coordinates
  std::vector<int32_t> idx;          // reordered row indices
};

// Positions [b, e) of node j (0-based within its level) at `level` of a tree over c points.
inline void node_range(int64_t c, int level, int64_t j, int64_t& b, int64_t& e) {
  b = 0, e = c;
  for (int bit = level - 1; bit >= 0; --bit) {
    const int64_t mid = b + (e - b) / 2;
    if ((j >> bit) & 1) b = mid; else e = mid;
  }
}

// Runs fn(segment, j) for j < per_segment[s], for every segment, in parallel.
template <typename F>
void for_each_task(KernelContext& ctx, const std::vector<int64_t>& per_segment, int64_t grain, F&& fn) {
  std::vector<int64_t> prefix(per_segment.size() + 1, 0);
  for (size_t s = 0; s < per_segment.size(); ++s) prefix[s + 1] = prefix[s] + per_segment[s];
  ctx.parallel_for(prefix.back(), grain, [&](int64_t b, int64_t e) {
    size_t s = static_cast<size_t>(std::upper_bound(prefix.begin(), prefix.end(), b) - prefix.begin()) - 1;
    for (int64_t t = b; t < e; ++t) {
      while (prefix[s + 1] <= t) ++s;
      fn(s, t - prefix[s]);
    }
  });
}

// Sizes the forest: a tree for every segment that has points and queries (`wanted`), of the
// least depth whose leaves hold at most kLeafSize points. Returns the largest depth, -1 if none.
template <typename T>
int plan_forest(Forest<T>& f, int64_t n, const std::vector<bool>& wanted) {
  const size_t b = f.point_begin.size();
  f.depth.assign(b, -1);
  f.node_base.assign(b, 0);
  int max_depth = -1;
  int64_t nodes = 0;
  for (size_t s = 0; s < b; ++s) {
    if (!wanted[s] || f.count[s] == 0) continue;
    int d = 0;
    while ((f.count[s] + (int64_t{1} << d) - 1) >> d > kLeafSize) ++d;
    f.depth[s] = d;
    f.node_base[s] = nodes;
    nodes += (int64_t{2} << d) - 1;
    max_depth = std::max(max_depth, d);
  }
  f.split.resize(static_cast<size_t>(nodes));
  f.split_dim.resize(static_cast<size_t>(nodes));
  f.min_idx.resize(static_cast<size_t>(nodes));
  f.x.resize(static_cast<size_t>(n));
  f.y.resize(static_cast<size_t>(n));
  f.z.resize(static_cast<size_t>(n));
  f.idx.resize(static_cast<size_t>(n));
  return max_depth;
}

// std::nth_element's contract on p[0, n) by coordinate d: p[kth] is the element a sort would put
// there, none before it larger, none after it smaller. Quickselect with a branch-free Lomuto
// partition (each point swapped into place whatever its side: the split's comparisons on random
// coordinates are unpredictable branches, the bulk of a branchy partition's time); points equal
// to the pivot get a pass of their own only when no point is below it, so runs of equal
// coordinates still shrink the range.
template <typename T>
void select_kth(BuildPoint<T>* p, int64_t n, int64_t kth, int d) {
  int64_t lo = 0, hi = n;
  while (hi - lo > 16) {
    const T a = p[lo].c[d], b = p[lo + (hi - lo) / 2].c[d], c = p[hi - 1].c[d];
    const T pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of three
    auto partition = [&](int64_t from, auto goes_left) {
      int64_t s = from;
      for (int64_t i = from; i < hi; ++i) {
        const BuildPoint<T> v = p[i];
        const bool left = goes_left(v.c[d]);
        p[i] = p[s];
        p[s] = v;
        s += left;
      }
      return s;
    };
    const int64_t below = partition(lo, [pivot](T v) { return v < pivot; });
    if (kth < below) {
      hi = below;
    } else if (below > lo) {
      lo = below;
    } else {  // the pivot is the least: split off the points equal to it (at least the pivot)
      const int64_t equal = partition(lo, [pivot](T v) { return v == pivot; });
      if (kth < equal) return;
      lo = equal;
    }
  }
  for (int64_t i = lo + 1; i < hi; ++i) {  // insertion sort of the last few
    const BuildPoint<T> v = p[i];
    int64_t j = i;
    for (; j > lo && v.c[d] < p[j - 1].c[d]; --j) p[j] = p[j - 1];
    p[j] = v;
  }
}

// Splits node j of `level` in segment s's tree: the median along the widest extent moves to
// the middle of the node's range, and becomes the split.
template <typename T>
void split_node(Forest<T>& f, BuildPoint<T>* pts, size_t s, int level, int64_t j) {
  int64_t lo, hi;
  node_range(f.count[s], level, j, lo, hi);
  BuildPoint<T>* p = pts + f.point_begin[s];
  T mn[3] = {p[lo].c[0], p[lo].c[1], p[lo].c[2]}, mx[3] = {mn[0], mn[1], mn[2]};
  int32_t first = p[lo].idx;
  for (int64_t i = lo + 1; i < hi; ++i) {
    for (int a = 0; a < 3; ++a) {
      mn[a] = std::min(mn[a], p[i].c[a]);
      mx[a] = std::max(mx[a], p[i].c[a]);
    }
    first = std::min(first, p[i].idx);
  }
  // Split the widest extent: adapts to flat or elongated clouds (scans, surfaces).
  int d = 0;
  for (int a = 1; a < 3; ++a)
    if (mx[a] - mn[a] > mx[d] - mn[d]) d = a;
  const int64_t mid = lo + (hi - lo) / 2;
  select_kth(p + lo, hi - lo, mid - lo, d);
  const int64_t node = f.node_base[s] + (int64_t{1} << level) - 1 + j;
  f.split[node] = p[mid].c[d];
  f.split_dim[node] = static_cast<uint8_t>(d);
  f.min_idx[node] = first;
}

// Leaf j of segment s's tree: its points into the reordered coordinate arrays, and its
// smallest index.
template <typename T>
void write_leaf(Forest<T>& f, const BuildPoint<T>* pts, size_t s, int64_t j) {
  int64_t lo, hi;
  node_range(f.count[s], f.depth[s], j, lo, hi);
  const int64_t base = f.point_begin[s];
  int32_t first = kNoPoint;
  for (int64_t i = base + lo; i < base + hi; ++i) {
    f.x[i] = pts[i].c[0];
    f.y[i] = pts[i].c[1];
    f.z[i] = pts[i].c[2];
    f.idx[i] = pts[i].idx;
    first = std::min(first, pts[i].idx);
  }
  f.min_idx[f.node_base[s] + (int64_t{1} << f.depth[s]) - 1 + j] = first;
}

template <typename T>
void build_forest(KernelContext& ctx, Forest<T>& f, const T* xyz, int64_t n, const std::vector<bool>& wanted) {
  const int max_depth = plan_forest(f, n, wanted);
  std::vector<BuildPoint<T>> pts(static_cast<size_t>(n));
  ctx.parallel_for(n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      pts[i] = BuildPoint<T>{{xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]}, static_cast<int32_t>(i)};
  });

  // Top-down, one level at a time across all segments: level l has 2^l nodes per segment, so
  // threads share the work from the first levels on, whether there is one segment or many.
  const size_t b = f.point_begin.size();
  std::vector<int64_t> per_segment(b);
  for (int level = 0; level < max_depth; ++level) {
    for (size_t s = 0; s < b; ++s) per_segment[s] = f.depth[s] > level ? int64_t{1} << level : 0;
    for_each_task(ctx, per_segment, 1, [&](size_t s, int64_t j) { split_node(f, pts.data(), s, level, j); });
  }
  for (size_t s = 0; s < b; ++s) per_segment[s] = f.depth[s] >= 0 ? int64_t{1} << f.depth[s] : 0;
  for_each_task(ctx, per_segment, 64, [&](size_t s, int64_t j) { write_leaf(f, pts.data(), s, j); });
}

// ---- the query ------------------------------------------------------------------------------

// A (squared distance, index) pair as one unsigned integer: distances are never negative or
// NaN, and non-negative IEEE values order like their bit patterns, so comparing keys is
// exactly the order "distance, then index" (+inf included).
template <typename T>
struct KeyOf;
template <>
struct KeyOf<float> {
  using Bits = uint32_t;
  using Key = uint64_t;
};
template <>
struct KeyOf<double> {
  using Bits = uint64_t;
  __extension__ typedef unsigned __int128 Key;  // GCC and Clang; 96 bits are used
};
template <typename T>
using Key = typename KeyOf<T>::Key;

template <typename T>
inline Key<T> make_key(T d2, int32_t id) {
  typename KeyOf<T>::Bits bits;
  std::memcpy(&bits, &d2, sizeof bits);
  return (static_cast<Key<T>>(bits) << 32) | static_cast<uint32_t>(id);
}
template <typename T>
inline T key_d2(Key<T> key) {
  const auto bits = static_cast<typename KeyOf<T>::Bits>(key >> 32);
  T d2;
  std::memcpy(&d2, &bits, sizeof d2);
  return d2;
}
template <typename T>
inline int32_t key_idx(Key<T> key) { return static_cast<int32_t>(static_cast<uint32_t>(key)); }

// The k best keys so far: a sorted array or a max-heap (see Keep). Starts full of padding
// keys (+inf, kNoPoint), so "better than the worst" is the only test.
template <typename T, Keep kKeep>
class Best {
  static constexpr bool kHeap = kKeep == Keep::Heap;

 public:
  static constexpr bool kOne = kKeep == Keep::One;
  void reset(int64_t k) {
    k_ = k;
    keys_.assign(static_cast<size_t>(k), make_key(std::numeric_limits<T>::infinity(), kNoPoint));
  }
  // The key a candidate must beat: the last of the sorted array, or the heap's root.
  Key<T> worst() const { return kHeap ? keys_[0] : keys_[k_ - 1]; }
  // k = 1: keeps the smaller of the two.
  void push_min(Key<T> key) { keys_[0] = key < keys_[0] ? key : keys_[0]; }

  void push(Key<T> key) {  // the caller checked that key < worst()
    if (kHeap) return sift_down(key, k_);
    Key<T>* a = keys_.data();
    if (kKeep == Keep::BranchFree) {
      // Slot j takes a[j-1] if that is larger than key, else key if a[j] is larger, else stays:
      // min(max(a[j-1], key), a[j]), from the back so a[j-1] is still the old value.
      for (int64_t j = k_ - 1; j > 0; --j) {
        const Key<T> m = a[j - 1] > key ? a[j - 1] : key;
        a[j] = m < a[j] ? m : a[j];
      }
      a[0] = key < a[0] ? key : a[0];
      return;
    }
    int64_t j = k_ - 1;
    for (; j > 0 && key < a[j - 1]; --j) a[j] = a[j - 1];
    a[j] = key;
  }

  // Writes the k pairs nearest first, then padding up to k_out: index -1, distance +inf (a
  // padded slot is never nearer than a real point, and weighs 0 under 1/dist).
  void write(int32_t* out_idx, T* out_dist, int64_t k_out, bool squared) {
    if (kHeap) {
      for (int64_t last = k_ - 1; last > 0; --last) {  // heap sort: worst to the back
        const Key<T> key = keys_[last];
        keys_[last] = keys_[0];
        sift_down(key, last);
      }
    }
    for (int64_t i = 0; i < k_out; ++i) {
      const int32_t id = i < k_ ? key_idx<T>(keys_[i]) : kNoPoint;
      out_idx[i] = id == kNoPoint ? -1 : id;
      const T d2 = id == kNoPoint ? std::numeric_limits<T>::infinity() : key_d2<T>(keys_[i]);
      out_dist[i] = squared ? d2 : std::sqrt(d2);
    }
  }

 private:
  // Puts `key` at the root of the max-heap keys_[0, size) and sifts it down.
  void sift_down(Key<T> key, int64_t size) {
    int64_t j = 0;
    for (;;) {
      int64_t c = 2 * j + 1;
      if (c >= size) break;
      if (c + 1 < size && keys_[c] < keys_[c + 1]) ++c;
      if (!(key < keys_[c])) break;
      keys_[j] = keys_[c];
      j = c;
    }
    keys_[j] = key;
  }
  int64_t k_ = 0;
  std::vector<Key<T>> keys_;
};

// The smallest (d2, index) key among a leaf's len <= kLeafSize points (x, y, z, idx) from q: the
// smallest distance (as bits: non-negative IEEE values order like their patterns), then the
// smallest index among the points at it. Plain code (knn_leaf_variants.h has the vector ones for
// float32): two reductions without a branch per point.
template <typename T>
Key<T> nearest_in_leaf(const T* x, const T* y, const T* z, const int32_t* idx, int len, const T* q) {
  using Bits = typename KeyOf<T>::Bits;
  // Signed: a distance's sign bit is 0, and a signed minimum vectorises on every x86-64 target.
  using SBits = std::make_signed_t<Bits>;
  SBits bits[kLeafSize];
  for (int i = 0; i < len; ++i) {
    const T dx = x[i] - q[0], dy = y[i] - q[1], dz = z[i] - q[2];
    const T d2 = dx * dx + dy * dy + dz * dz;
    std::memcpy(&bits[i], &d2, sizeof d2);
  }
  SBits lowest = std::numeric_limits<SBits>::max();
  for (int i = 0; i < len; ++i) lowest = bits[i] < lowest ? bits[i] : lowest;
  int32_t first = kNoPoint;
  for (int i = 0; i < len; ++i) first = bits[i] == lowest && idx[i] < first ? idx[i] : first;
  T d;
  std::memcpy(&d, &lowest, sizeof d);
  return make_key(d, first);
}

}  // namespace

namespace knn_leaf {
Variant scalar_variant() { return Variant{nearest_in_leaf<float>, "scalar"}; }
const Variant& best_variant() {
  static const Variant chosen = widest_variant(avx512_variant, avx2_variant, scalar_variant());
  return chosen;
}
}  // namespace knn_leaf

namespace {

// nearest_in_leaf in the widest variant this CPU runs (float32), or plain (float64).
template <typename T>
Key<T> nearest(const T* x, const T* y, const T* z, const int32_t* idx, int len, const T* q) {
  if constexpr (std::is_same_v<T, float>) {
    static const knn_leaf::NearestInLeaf variant = knn_leaf::best_variant().nearest_f;
    return variant(x, y, z, idx, len, q);
  } else {
    return nearest_in_leaf<T>(x, y, z, idx, len, q);
  }
}

// The k-d tree of one segment, as the query sees it.
template <typename T>
struct SegmentTree {
  const T* split;
  const uint8_t* split_dim;
  const int32_t* min_idx;
  const T *x, *y, *z;
  const int32_t* idx;
  int64_t count, first_leaf;
};

// Depth-first search of one segment's tree for one query point, near child first.
template <typename T, typename BestT>
struct Query {
  const SegmentTree<T>& t;
  T q[3];
  BestT& best;

  // A lower bound on the squared distance from q to any point of a cell, given per axis the
  // distance o[a] = |fl(q - face)| to the cell's nearer splitting plane (0 inside). Planes are
  // point coordinates, so each term is <= the same term for any point beyond the plane
  // (rounding is monotone); with the sum in a point's order, the bound never exceeds a point's
  // computed distance, so pruning on it is exact.
  static T bound(const T o[3]) { return o[0] * o[0] + o[1] * o[1] + o[2] * o[2]; }

  // Whether a cell with lower bound `lb` whose smallest index is `first` may hold a better pair.
  bool worth(T lb, int32_t first) const { return make_key(lb, first) < best.worst(); }

  void scan_leaf(int64_t lo, int64_t hi) {
    const T *x = t.x + lo, *y = t.y + lo, *z = t.z + lo;
    if constexpr (BestT::kOne)  // k = 1: the leaf's smallest key, in this CPU's widest vectors
      best.push_min(nearest<T>(x, y, z, t.idx + lo, static_cast<int>(hi - lo), q));
    else
      scan_candidates(x, y, z, lo, hi - lo);
  }

  // k > 1: the leaf's points [lo, lo + len) that beat the current k-th, pushed in order.
  void scan_candidates(const T* x, const T* y, const T* z, int64_t lo, int64_t len) {
    T d2[kLeafSize];
    for (int64_t i = 0; i < len; ++i) {  // vectorized
      const T dx = x[i] - q[0], dy = y[i] - q[1], dz = z[i] - q[2];
      d2[i] = dx * dx + dy * dy + dz * dz;
    }
    // Most points lose to the current worst: find the few candidates without a branch each,
    // then push those that beat it in the exact (distance, index) order.
    const T w = key_d2<T>(best.worst());
    int cand[kLeafSize];
    int n_cand = 0;
    for (int i = 0; i < static_cast<int>(len); ++i) {
      cand[n_cand] = i;
      n_cand += d2[i] <= w;
    }
    for (int j = 0; j < n_cand; ++j) {
      const Key<T> key = make_key(d2[cand[j]], t.idx[lo + cand[j]]);
      if (key < best.worst()) best.push(key);
    }
  }

  // Visits `node` (sorted positions [lo, hi)), with o and lb its cell's plane distances and bound.
  void visit(int64_t node, int64_t lo, int64_t hi, T o[3], T lb) {
    if (node >= t.first_leaf) return scan_leaf(lo, hi);
    const int d = t.split_dim[node];
    const T diff = q[d] - t.split[node];
    const int64_t mid = lo + (hi - lo) / 2;
    // Near child: the side of the split q lies on (right when on it: those points are >= it).
    const bool left_near = diff < 0;
    const int64_t near = 2 * node + (left_near ? 1 : 2), far = 2 * node + (left_near ? 2 : 1);
    const int64_t near_lo = left_near ? lo : mid, near_hi = left_near ? mid : hi;
    const int64_t far_lo = left_near ? mid : lo, far_hi = left_near ? hi : mid;
    const T old = o[d], far_plane = std::abs(diff);
    o[d] = far_plane;
    const T far_lb = bound(o);
    o[d] = old;
    // Equal bounds (duplicates, q on the plane): the subtree with the smaller index first, so
    // ties settle after a few leaves instead of the whole tree.
    const bool far_first = far_lb == lb && t.min_idx[far] < t.min_idx[near];
    if (!far_first && worth(lb, t.min_idx[near])) visit(near, near_lo, near_hi, o, lb);
    if (worth(far_lb, t.min_idx[far])) {
      o[d] = far_plane;
      visit(far, far_lo, far_hi, o, far_lb);
      o[d] = old;
    }
    if (far_first && worth(lb, t.min_idx[near])) visit(near, near_lo, near_hi, o, lb);
  }

  // visit(0, ...) without its recursion along the path it takes first: every cell on the way
  // from the root to the leaf q falls in has bound 0 (q is inside), and while the k best are
  // still padding every cell is worth visiting, so the descent is a plain loop. It stops early at
  // a node where visit() would take the far child first (q on the plane, equal bounds); from
  // there visit() runs as usual. The far children on the path are then tried deepest first, as
  // the recursion would on its way back. Same cells, same order, same result.
  void run() {
    T o[3] = {T(0), T(0), T(0)};
    struct Far {
      int64_t node, lo, hi;
      T plane;
      int dim;
    };
    Far path[32];  // a tree's depth is below 32 (n < 2^31, leaves of at least 16 points)
    int depth = 0;
    int64_t node = 0, lo = 0, hi = t.count;
    while (node < t.first_leaf) {
      const int d = t.split_dim[node];
      const T diff = q[d] - t.split[node];
      const int64_t mid = lo + (hi - lo) / 2;
      const bool left_near = diff < 0;
      const int64_t near = 2 * node + (left_near ? 1 : 2), far = 2 * node + (left_near ? 2 : 1);
      const T plane = std::abs(diff);
      // bound(o) with o[d] = plane and the other terms 0: exactly plane * plane (x + 0 = x).
      if (plane * plane == T(0) && t.min_idx[far] < t.min_idx[near]) break;
      path[depth++] = Far{far, left_near ? mid : lo, left_near ? hi : mid, plane, d};
      lo = left_near ? lo : mid;
      hi = left_near ? mid : hi;
      node = near;
    }
    visit(node, lo, hi, o, T(0));
    while (depth > 0) {
      const Far& f = path[--depth];
      o[f.dim] = f.plane;
      const T far_lb = bound(o);
      if (worth(far_lb, t.min_idx[f.node])) visit(f.node, f.lo, f.hi, o, far_lb);
      o[f.dim] = T(0);
    }
  }
};

// The tree of segment s as the query sees it.
template <typename T>
SegmentTree<T> segment_tree(const Forest<T>& f, size_t s) {
  const int64_t base = f.point_begin[s], nb = f.node_base[s], c = f.count[s];
  return SegmentTree<T>{f.split.data() + nb, f.split_dim.data() + nb, f.min_idx.data() + nb,
                        f.x.data() + base, f.y.data() + base, f.z.data() + base, f.idx.data() + base,
                        c, c ? (int64_t{1} << f.depth[s]) - 1 : 0};
}

// The forest over xyz for segment boundaries pb (points) and qb (queries).
template <typename T>
Forest<T> forest_for(KernelContext& ctx, const T* xyz, int64_t n, const std::vector<int64_t>& pb,
                     const std::vector<int64_t>& qb) {
  const size_t b = pb.size() - 1;
  Forest<T> f;
  std::vector<bool> wanted(b);
  f.point_begin.resize(b);
  f.count.resize(b);
  for (size_t s = 0; s < b; ++s) {
    f.point_begin[s] = pb[s];
    f.count[s] = pb[s + 1] - pb[s];
    wanted[s] = qb[s + 1] > qb[s];  // no queries: no tree
  }
  build_forest(ctx, f, xyz, n, wanted);
  return f;
}

// Searches every query i < m (qxyz, segments qb) and writes its row of idx and dist. When the
// queries are the points themselves (`self`), they are taken in the tree's order (position r is
// row f.idx[r], with the same coordinates): consecutive queries then walk the same path to
// neighbouring leaves, which stay in cache. The searches are the same, so is every result.
template <typename T>
void query_all(KernelContext& ctx, const Forest<T>& f, const T* qxyz, int64_t m, const std::vector<int64_t>& qb,
               bool self, int64_t k, bool squared, int32_t* out_idx, T* out_dist) {
  ctx.parallel_for(m, 256, [&](int64_t lo, int64_t hi) {
    Best<T, Keep::One> one;
    Best<T, Keep::BranchFree> branch_free;
    Best<T, Keep::Insertion> insertion;
    Best<T, Keep::Heap> heap;
    size_t s = static_cast<size_t>(std::upper_bound(qb.begin(), qb.end(), lo) - qb.begin()) - 1;
    for (int64_t r = lo; r < hi; ++r) {
      while (qb[s + 1] <= r) ++s;
      const int64_t kk = std::min(k, f.count[s]);  // a segment smaller than k: the rest is padding
      const SegmentTree<T> t = segment_tree(f, s);
      // A segment without a tree (no points) has no reordered rows: its queries keep their order.
      const bool reordered = self && f.depth[s] >= 0;
      const int64_t i = reordered ? f.idx[r] : r;
      const T q[3] = {reordered ? f.x[r] : qxyz[3 * i], reordered ? f.y[r] : qxyz[3 * i + 1],
                      reordered ? f.z[r] : qxyz[3 * i + 2]};
      auto search = [&](auto& best) {
        using BestT = std::decay_t<decltype(best)>;
        best.reset(kk);
        if (kk > 0) Query<T, BestT>{t, {q[0], q[1], q[2]}, best}.run();
        best.write(out_idx + i * k, out_dist + i * k, k, squared);
      };
      if (kk == 1) search(one);
      else if (kk > kMaxInsertionK) search(heap);
      else if (std::is_same_v<T, float> && kk <= kMaxBranchFreeK) search(branch_free);
      else search(insertion);
    }
  });
}

template <typename T>
// The points as T: the op's inputs, or their float32 copies for the 16-bit types (then out_dist
// is float32 scratch, rounded into the output by the caller).
void knn(KernelContext& ctx, int64_t k, const TensorView& xyz_t, const TensorView& offset_t, const TensorView* new_xyz_t,
         const TensorView* new_offset_t, bool squared, TensorView& idx, T* out_dist) {
  // Shape rules treat each optional input alone: only the kernel can pair them.
  OB_CHECK((new_xyz_t == nullptr) == (new_offset_t == nullptr), "new_xyz and new_offset must be given together");
  const TensorView& q_t = new_xyz_t ? *new_xyz_t : xyz_t;
  const int64_t n = xyz_t.dim(0), m = q_t.dim(0);
  // idx is int32: every row index must fit, with one value left for the padding marker.
  OB_CHECK(n < kNoPoint, "xyz has ", n, " rows; idx is int32, so at most ", kNoPoint - 1, " are supported");

  // As many segments in both: the spec checks that new_offset has offset's length.
  const std::vector<int64_t> pb = segment_bounds(offset_t, "offset", n, "xyz");
  const std::vector<int64_t> qb = new_xyz_t ? segment_bounds(*new_offset_t, "new_offset", m, "new_xyz") : pb;
  const T* xyz = xyz_t.data_as<T>();
  const T* qxyz = q_t.data_as<T>();
  check_finite(xyz, n, "xyz");
  if (new_xyz_t) check_finite(qxyz, m, "new_xyz");

  int32_t* out_idx = idx.data_as<int32_t>();
  if (m == 0) return;
  const Forest<T> f = forest_for(ctx, xyz, n, pb, qb);
  query_all(ctx, f, qxyz, m, qb, new_xyz_t == nullptr, k, squared, out_idx, out_dist);
}

}  // namespace

void knn_query_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& offset, const TensorView* new_xyz,
                      const TensorView* new_offset, int64_t k, TensorView& idx, TensorView& dist, bool squared) {
  if (is_16bit_float(xyz.dtype)) {
    // Distances computed in float32 on the 16-bit coordinates (order and ties decided there),
    // rounded to the input's type once.
    const TensorView xyz32 = float32_copy(ctx, xyz);
    const TensorView q32 = new_xyz ? float32_copy(ctx, *new_xyz) : TensorView{};
    TensorView dist32 = float32_scratch(ctx, dist);
    knn<float>(ctx, k, xyz32, offset, new_xyz ? &q32 : nullptr, new_offset, squared, idx, dist32.data_as<float>());
    return narrow_into(ctx, dist32, dist);
  }
  visit_dtype<float, double>(xyz.dtype, [&](auto zero) {
    using T = decltype(zero);
    knn<T>(ctx, k, xyz, offset, new_xyz, new_offset, squared, idx, dist.data_as<T>());
  });
}

}  // namespace opbridge
