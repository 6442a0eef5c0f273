// The NMS family's kernels. Each sorts once (O(N log N)) and gathers the boxes into one array per
// coordinate, so the IoU loops read contiguous memory and vectorise. nms checks each candidate
// against the boxes kept so far and stops at the first that suppresses it: the same boxes as
// mmcv's kept-box-suppresses-the-rest pass (a box is dropped exactly when a box kept before it
// overlaps it), with fewer IoUs, and none past max_num. From a few thousand candidates it checks
// only the kept boxes in the candidate's cells of a grid (Grid).
#include "nms_kernel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace opbridge {
namespace {

// mmcv's IoU, operand for operand (a is the box taken first): a zero union gives NaN, which passes
// no threshold.
template <typename T>
inline T iou(T ax1, T ay1, T ax2, T ay2, T aarea, T bx1, T by1, T bx2, T by2, T barea, T off) {
  const T w = std::max(T(0), std::min(ax2, bx2) - std::max(ax1, bx1) + off);
  const T h = std::max(T(0), std::min(ay2, by2) - std::max(ay1, by1) + off);
  const T inter = w * h;
  return inter / (aarea + barea - inter);
}

template <typename T>
void check_finite(const TensorView& t, const char* name) {
  const T* v = t.data_as<T>();
  const int64_t per_row = t.rank() > 1 ? t.dim(1) : 1;
  for (int64_t i = 0; i < t.numel(); ++i)
    OB_CHECK(std::isfinite(v[i]), name, " has a value that is not finite (", v[i], " at row ", i / per_row, ")");
}

// Candidates from which nms searches the kept boxes through a grid (Grid below).
constexpr size_t kGridFrom = 4096;

template <typename T>
struct Ranked {
  T score;
  int64_t index;
};

// Indices of the scores (those above `threshold` when `filter`), by descending score, ties lowest
// index first.
template <typename T>
std::vector<Ranked<T>> by_score(const T* score, int64_t stride, int64_t n, bool filter, T threshold) {
  std::vector<Ranked<T>> order;
  order.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (!filter || score[i * stride] > threshold) order.push_back({score[i * stride], i});
  std::sort(order.begin(), order.end(), [](const Ranked<T>& a, const Ranked<T>& b) {
    return a.score > b.score || (a.score == b.score && a.index < b.index);
  });
  return order;
}

// Boxes one array per coordinate, with their areas.
template <typename T>
struct Columns {
  std::vector<T> x1, y1, x2, y2, area;
  void reserve(size_t n) {
    for (auto* c : {&x1, &y1, &x2, &y2, &area}) c->reserve(n);
  }
  void push(const T* b, T off) {
    x1.push_back(b[0]), y1.push_back(b[1]), x2.push_back(b[2]), y2.push_back(b[3]);
    area.push_back((b[2] - b[0] + off) * (b[3] - b[1] + off));
  }
  void move(size_t from, size_t to) {
    for (auto* c : {&x1, &y1, &x2, &y2, &area}) (*c)[to] = (*c)[from];
  }
  size_t size() const { return x1.size(); }
};

// Whether any box of `kept` overlaps b (its area ba) with an IoU above thr. Branch-free blocks of
// 16, so the compiler vectorises them; the first block with a hit ends the search.
template <typename T>
bool any_suppresses(const Columns<T>& kept, const T* b, T ba, T off, T thr) {
  const size_t m = kept.size();
  const T *kx1 = kept.x1.data(), *ky1 = kept.y1.data(), *kx2 = kept.x2.data(), *ky2 = kept.y2.data();
  const T* ka = kept.area.data();
  const T bx1 = b[0], by1 = b[1], bx2 = b[2], by2 = b[3];
  constexpr size_t kBlock = 16;
  size_t j = 0;
  for (; j + kBlock <= m; j += kBlock) {
    int hit = 0;
    for (size_t u = j; u < j + kBlock; ++u)
      hit |= static_cast<int>(iou(kx1[u], ky1[u], kx2[u], ky2[u], ka[u], bx1, by1, bx2, by2, ba, off) > thr);
    if (hit) return true;
  }
  for (; j < m; ++j)
    if (iou(kx1[j], ky1[j], kx2[j], ky2[j], ka[j], bx1, by1, bx2, by2, ba, off) > thr) return true;
  return false;
}

// The kept boxes by the cells of a uniform grid they cover. With iou_threshold >= 0 only a kept box
// that overlaps a candidate can suppress it (an IoU above 0 needs w > 0 and h > 0, which in mmcv's
// arithmetic means their spans [x1, x2 + offset] and [y1, y2 + offset] share a point); such a
// pair shares that point's cell, since a coordinate's cell is monotonic in it. So a candidate is
// checked against the kept boxes in its cells only, with the same IoU: the same boxes are kept.
// A box covering many cells is checked against every candidate (kept) or every kept box
// (candidate) instead.
template <typename T>
class Grid {
 public:
  Grid(const T* b, const std::vector<Ranked<T>>& order, T off) : off_(off) {
    double lo[2] = {HUGE_VAL, HUGE_VAL}, hi[2] = {-HUGE_VAL, -HUGE_VAL}, extent[2] = {0, 0};
    size_t m = 0;
    for (const Ranked<T>& r : order) {
      const T* p = b + r.index * 4;
      if (!nonempty(p)) continue;
      for (int a = 0; a < 2; ++a) {
        lo[a] = std::min(lo[a], double(p[a])), hi[a] = std::max(hi[a], double(p[a + 2]) + double(off));
        extent[a] += double(p[a + 2]) + double(off) - double(p[a]);
      }
      ++m;
    }
    if (m == 0) return;  // no box overlaps any other
    const double limit = double(m) / 8 + 64;  // cells at most about this many (each holds 5 vectors)
    for (int a = 0; a < 2; ++a) {
      lo_[a] = lo[a];
      // Cells about the mean box size, fewer when the boxes are small for their extent.
      const double cell = std::max(extent[a] / double(m), (hi[a] - lo[a]) / std::sqrt(limit));
      // A range beyond double's (float64 boxes near its limits): one cell, every box in it.
      inv_[a] = cell > 0 && std::isfinite(cell) && std::isfinite(hi[a] - lo[a]) ? 1.0 / cell : 0.0;
      n_[a] = inv_[a] == 0 ? 1 : std::min<int64_t>(static_cast<int64_t>((hi[a] - lo[a]) * inv_[a]) + 1, int64_t(limit));
    }
    cells_.resize(static_cast<size_t>(n_[0] * n_[1]));
  }

  // A kept box. Each cell it covers holds a copy of it, so a candidate's checks read contiguous
  // columns (any_suppresses, vectorised).
  void add(const T* p) {
    int64_t c[4];
    if (!span(p, c)) return;  // it overlaps nothing: it suppresses nothing
    if ((c[2] - c[0] + 1) * (c[3] - c[1] + 1) > kMaxCells) return big_.push(p, off_);
    for (int64_t y = c[1]; y <= c[3]; ++y)
      for (int64_t x = c[0]; x <= c[2]; ++x) cells_[static_cast<size_t>(y * n_[0] + x)].push(p, off_);
  }

  // Whether a kept box overlaps the candidate at `p` with an IoU above thr; `kept` holds them all.
  bool suppressed(const Columns<T>& kept, const T* p, T area, T thr) const {
    int64_t c[4];
    if (!span(p, c)) return false;
    if ((c[2] - c[0] + 1) * (c[3] - c[1] + 1) > kMaxCells) return any_suppresses(kept, p, area, off_, thr);
    if (any_suppresses(big_, p, area, off_, thr)) return true;
    for (int64_t y = c[1]; y <= c[3]; ++y)
      for (int64_t x = c[0]; x <= c[2]; ++x)
        if (any_suppresses(cells_[static_cast<size_t>(y * n_[0] + x)], p, area, off_, thr)) return true;
    return false;
  }

 private:
  static constexpr int64_t kMaxCells = 64;

  bool nonempty(const T* p) const {
    return double(p[0]) <= double(p[2]) + double(off_) && double(p[1]) <= double(p[3]) + double(off_);
  }
  // Monotonic in v (clamped, and NaN, from an infinite difference times 0, to cell 0).
  int64_t cell(double v, int a) const {
    const double t = (v - lo_[a]) * inv_[a];
    if (!(t >= 0)) return 0;
    return t >= double(n_[a] - 1) ? n_[a] - 1 : static_cast<int64_t>(t);
  }
  // The cells [x0, y0, x1, y1] the box's spans cover; false when a span is empty.
  bool span(const T* p, int64_t* c) const {
    if (cells_.empty() || !nonempty(p)) return false;
    c[0] = cell(p[0], 0), c[1] = cell(p[1], 1);
    c[2] = cell(double(p[2]) + double(off_), 0), c[3] = cell(double(p[3]) + double(off_), 1);
    return true;
  }

  T off_;
  double lo_[2] = {0, 0}, inv_[2] = {1, 1};
  int64_t n_[2] = {0, 0};
  std::vector<Columns<T>> cells_;
  Columns<T> big_;
};

template <typename T>
void run_nms(KernelContext& ctx, const TensorView& boxes, const TensorView& scores, double iou_threshold,
             int64_t offset, double score_threshold, int64_t max_num, TensorView& inds) {
  check_finite<T>(boxes, "boxes");
  check_finite<T>(scores, "scores");
  const T* b = boxes.data_as<T>();
  const T off = static_cast<T>(offset), thr = static_cast<T>(iou_threshold);
  const auto order = by_score(scores.data_as<T>(), 1, scores.dim(0), score_threshold > 0,
                              static_cast<T>(score_threshold));
  const size_t limit = max_num > 0 ? std::min(static_cast<size_t>(max_num), order.size()) : order.size();
  Columns<T> kept;
  kept.reserve(limit);
  std::vector<int64_t> keep;
  keep.reserve(limit);
  // Past a few thousand candidates the grid pays for itself; a negative threshold lets boxes that
  // do not overlap suppress each other, so it takes the full scan.
  const bool use_grid = thr >= 0 && order.size() >= kGridFrom;
  Grid<T> grid(b, use_grid ? order : std::vector<Ranked<T>>{}, off);
  for (const Ranked<T>& r : order) {
    if (keep.size() == limit) break;
    const T* box = b + r.index * 4;
    const T area = (box[2] - box[0] + off) * (box[3] - box[1] + off);
    if (use_grid ? grid.suppressed(kept, box, area, thr) : any_suppresses(kept, box, area, off, thr)) continue;
    if (use_grid) grid.add(box);
    kept.push(box, off);
    keep.push_back(r.index);
  }
  int64_t* out = ctx.allocate_output(inds, {static_cast<int64_t>(keep.size())}).data_as<int64_t>();
  std::copy(keep.begin(), keep.end(), out);
}

template <typename T>
void run_softnms(KernelContext& ctx, const TensorView& boxes, const TensorView& scores, double iou_threshold,
                 double sigma_attr, double min_score_attr, int64_t method, int64_t offset, TensorView& dets,
                 TensorView& inds) {
  check_finite<T>(boxes, "boxes");
  check_finite<T>(scores, "scores");
  const T off = static_cast<T>(offset), thr = static_cast<T>(iou_threshold);
  const T sigma = static_cast<T>(sigma_attr), min_score = static_cast<T>(min_score_attr);
  const int64_t n = boxes.dim(0);
  const T *b = boxes.data_as<T>(), *s = scores.data_as<T>();
  // The boxes not yet taken or dropped, in no particular order (the tie rule reads their indices).
  Columns<T> live;
  live.reserve(static_cast<size_t>(n));
  std::vector<T> score(s, s + n);
  std::vector<int64_t> index(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) live.push(b + i * 4, off), index[i] = i;
  std::vector<T> taken;  // (kept, 5)
  std::vector<int64_t> taken_index;
  size_t m = static_cast<size_t>(n);
  while (m > 0) {
    size_t best = 0;
    for (size_t j = 1; j < m; ++j)
      if (score[j] > score[best] || (score[j] == score[best] && index[j] < index[best])) best = j;
    const T bx1 = live.x1[best], by1 = live.y1[best], bx2 = live.x2[best], by2 = live.y2[best];
    const T ba = live.area[best];
    taken.insert(taken.end(), {bx1, by1, bx2, by2, score[best]});
    taken_index.push_back(index[best]);
    --m;
    live.move(m, best), score[best] = score[m], index[best] = index[m];
    size_t w = 0;
    for (size_t j = 0; j < m; ++j) {
      const T ovr = iou(bx1, by1, bx2, by2, ba, live.x1[j], live.y1[j], live.x2[j], live.y2[j], live.area[j], off);
      T weight = 1;
      if (method == 0) {
        if (ovr >= thr) weight = 0;
      } else if (method == 1) {
        if (ovr >= thr) weight = 1 - ovr;
      } else if (!std::isnan(ovr)) {  // a zero union leaves the score as it is
        weight = std::exp(-(ovr * ovr) / sigma);
      }
      const T decayed = score[j] * weight;
      if (decayed < min_score) continue;
      live.move(j, w), score[w] = decayed, index[w] = index[j];
      ++w;
    }
    m = w;
  }
  const int64_t kept = static_cast<int64_t>(taken_index.size());
  std::copy(taken.begin(), taken.end(), ctx.allocate_output(dets, {kept, 5}).data_as<T>());
  std::copy(taken_index.begin(), taken_index.end(), ctx.allocate_output(inds, {kept}).data_as<int64_t>());
}

template <typename T>
void run_nms_match(const TensorView& dets, double iou_threshold, TensorView& matched, TensorView& group) {
  check_finite<T>(dets, "dets");
  const T* d = dets.data_as<T>();
  const T thr = static_cast<T>(iou_threshold);
  const auto order = by_score(d + 4, 5, dets.dim(0), false, T(0));
  Columns<T> sorted;
  sorted.reserve(order.size());
  for (const Ranked<T>& r : order) sorted.push(d + r.index * 5, T(0));
  std::vector<size_t> live(order.size());  // positions in `order` not yet in a group
  for (size_t i = 0; i < live.size(); ++i) live[i] = i;
  int64_t *out = matched.data_as<int64_t>(), *gid = group.data_as<int64_t>();
  int64_t pos = 0;
  for (int64_t g = 0; !live.empty(); ++g) {
    const size_t k = live[0];
    out[pos] = order[k].index, gid[pos++] = g;
    size_t w = 0;
    for (size_t j = 1; j < live.size(); ++j) {
      const size_t p = live[j];
      const T ovr = iou(sorted.x1[k], sorted.y1[k], sorted.x2[k], sorted.y2[k], sorted.area[k], sorted.x1[p],
                        sorted.y1[p], sorted.x2[p], sorted.y2[p], sorted.area[p], T(0));
      if (ovr >= thr)
        out[pos] = order[p].index, gid[pos++] = g;
      else
        live[w++] = p;
    }
    live.resize(w);
  }
}

void check_threshold(double v, const char* name) {
  OB_CHECK(!std::isnan(v), name, " must be a number, got nan");
}

}  // namespace

void nms_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView& scores, double iou_threshold,
                int64_t offset, double score_threshold, int64_t max_num, TensorView& inds) {
  check_threshold(iou_threshold, "iou_threshold");
  check_threshold(score_threshold, "score_threshold");
  if (boxes.dtype == DType::Float64)
    return run_nms<double>(ctx, boxes, scores, iou_threshold, offset, score_threshold, max_num, inds);
  run_nms<float>(ctx, boxes, scores, iou_threshold, offset, score_threshold, max_num, inds);
}

void softnms_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView& scores, double iou_threshold,
                    double sigma, double min_score, int64_t method, int64_t offset, TensorView& dets,
                    TensorView& inds) {
  check_threshold(iou_threshold, "iou_threshold");
  check_threshold(min_score, "min_score");
  OB_CHECK(method != 2 || sigma > 0, "sigma must be > 0 for the gaussian method (2), got ", sigma);
  if (boxes.dtype == DType::Float64)
    return run_softnms<double>(ctx, boxes, scores, iou_threshold, sigma, min_score, method, offset, dets, inds);
  run_softnms<float>(ctx, boxes, scores, iou_threshold, sigma, min_score, method, offset, dets, inds);
}

void nms_match_kernel(KernelContext&, const TensorView& dets, double iou_threshold, TensorView& matched,
                      TensorView& group) {
  check_threshold(iou_threshold, "iou_threshold");
  if (dets.dtype == DType::Float64) return run_nms_match<double>(dets, iou_threshold, matched, group);
  run_nms_match<float>(dets, iou_threshold, matched, group);
}

}  // namespace opbridge
