// The overlap of two rotated boxes (cx, cy, w, h, angle in radians), as mmcv 2.x defines it: the
// box's w side runs along (cos a, sin a) and its h side along (-sin a, cos a), in image axes (x to
// the right, y down), so a positive angle turns the box clockwise on screen. The intersection is
// the exact area of one convex quadrilateral clipped by the other's four edges (Sutherland–Hodgman),
// in the boxes' dtype, on coordinates relative to the midpoint of the two centres (mmcv's shift:
// nearby boxes far from the origin keep their digits). Each box's sine and cosine are taken in
// double and rounded to the dtype once, as mmcv does.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace opbridge::rotated {

// A box ready for many pairs: its centre (double, for the midpoint shift), its half side vectors
// and area in the compute type, and the radius of its circumscribed circle (the disjointness test).
template <typename T>
struct PreparedBox {
  double cx = 0, cy = 0;
  T ux = 0, uy = 0;  // half of the w side: (w / 2)(cos a, sin a)
  T vx = 0, vy = 0;  // half of the h side: (h / 2)(-sin a, cos a)
  T area = 0;        // w * h (mmcv's: a box under 1e-14 overlaps nothing)
  double radius = 0;
  bool finite = true;
};

// `b` points at (cx, cy, w, h, angle); `sign` is +1, or -1 for counter-clockwise angles.
template <typename T>
PreparedBox<T> prepare(const T* b, double sign) {
  PreparedBox<T> p;
  p.finite = std::isfinite(b[0]) && std::isfinite(b[1]) && std::isfinite(b[2]) && std::isfinite(b[3]) &&
             std::isfinite(b[4]);
  p.cx = static_cast<double>(b[0]);
  p.cy = static_cast<double>(b[1]);
  const double a = sign * static_cast<double>(b[4]);
  const T c = static_cast<T>(std::cos(a)), s = static_cast<T>(std::sin(a));
  const T hw = b[2] / T(2), hh = b[3] / T(2);
  p.ux = c * hw, p.uy = s * hw;
  p.vx = -s * hh, p.vy = c * hh;
  p.area = b[2] * b[3];
  // Not std::hypot: glibc 2.35 versioned it anew, which would lift the library's glibc floor.
  // Squares of a float's half sides fit a double; a double's overflow gives +inf, which only
  // disables the disjointness shortcut.
  const double dw = static_cast<double>(hw), dh = static_cast<double>(hh);
  p.radius = std::sqrt(dw * dw + dh * dh);
  return p;
}

template <typename T>
struct Pt {
  T x, y;
};

// The corners of a box whose centre is at (ox, oy), counter-clockwise in (x, y) when w * h > 0
// (both sides negative is the same box turned half a turn).
template <typename T>
inline void corners(const PreparedBox<T>& b, T ox, T oy, Pt<T>* q) {
  q[0] = {ox - b.ux - b.vx, oy - b.uy - b.vy};
  q[1] = {ox + b.ux - b.vx, oy + b.uy - b.vy};
  q[2] = {ox + b.ux + b.vx, oy + b.uy + b.vy};
  q[3] = {ox - b.ux + b.vx, oy - b.uy + b.vy};
}

// Room for the clipped polygon: each of the four clips at most doubles the vertex count, whatever
// rounding does to the inside tests (a convex input never exceeds 8).
constexpr int kMaxVertices = 64;

// The area common to boxes a and b (0 when either is under 1e-14 in area or they are disjoint).
template <typename T>
T intersection(const PreparedBox<T>& a, const PreparedBox<T>& b) {
  // Circumscribed circles apart (with a margin for rounding): nothing in common.
  const double dx = b.cx - a.cx, dy = b.cy - a.cy;
  const double reach = (a.radius + b.radius) * (1 + 1e-6);
  if (dx * dx + dy * dy > reach * reach) return T(0);
  // Centres relative to their midpoint, rounded to the compute type.
  const T hx = static_cast<T>(dx / 2), hy = static_cast<T>(dy / 2);
  Pt<T> clip[4];
  corners(a, T(-hx), T(-hy), clip);
  Pt<T> buf[2][kMaxVertices];
  int n = 4;
  corners(b, hx, hy, buf[0]);
  int cur = 0;
  for (int e = 0; e < 4 && n > 0; ++e) {
    const Pt<T> p0 = clip[e], p1 = clip[(e + 1) & 3];
    const T ex = p1.x - p0.x, ey = p1.y - p0.y;
    const Pt<T>* in = buf[cur];
    Pt<T>* out = buf[cur ^ 1];
    int m = 0;
    // Signed distance (times the edge length) of each vertex from the edge: >= 0 is inside.
    auto side = [&](const Pt<T>& q) { return ex * (q.y - p0.y) - ey * (q.x - p0.x); };
    T s_prev = side(in[n - 1]);
    Pt<T> prev = in[n - 1];
    for (int i = 0; i < n && m + 2 <= kMaxVertices; ++i) {
      const Pt<T> q = in[i];
      const T s = side(q);
      if ((s >= 0) != (s_prev >= 0)) {  // the edge prev -> q crosses the line: keep the crossing
        const T t = s_prev / (s_prev - s);
        out[m++] = {prev.x + t * (q.x - prev.x), prev.y + t * (q.y - prev.y)};
      }
      if (s >= 0) out[m++] = q;
      prev = q, s_prev = s;
    }
    n = m;
    cur ^= 1;
  }
  if (n < 3) return T(0);
  const Pt<T>* poly = buf[cur];
  T twice = 0;  // the shoelace formula, about the first vertex
  for (int i = 1; i + 1 < n; ++i)
    twice += (poly[i].x - poly[0].x) * (poly[i + 1].y - poly[0].y) - (poly[i + 1].x - poly[0].x) * (poly[i].y - poly[0].y);
  return std::fabs(twice) / T(2);
}

// mmcv's mode flag: 0 intersection over union, 1 intersection over the first box's area.
template <typename T>
T overlap(const PreparedBox<T>& a, const PreparedBox<T>& b, bool over_first) {
  if (!a.finite || !b.finite) return std::numeric_limits<T>::quiet_NaN();
  if (a.area < T(1e-14) || b.area < T(1e-14)) return T(0);
  const T inter = intersection(a, b);
  return inter / (over_first ? a.area : a.area + b.area - inter);
}

}  // namespace opbridge::rotated
