// corner_pool: corner pooling (CornerNet, CentripetalNet), as mmcv's CornerPool computes it: the
// running maximum of each row or column of a feature map, towards one side. For mode 'bottom' the
// output at row h is the maximum of rows 0..h, for 'top' of rows h..H-1; 'right' and 'left' do the
// same along the width. mmcv computes it as torch.cummax (flipped before and after for top and
// left), so its rule is this op's: the maximum moves to the next value when that value is NaN, or
// when neither is NaN and it is >= the maximum so far (a tie moves it to the later value, in the
// direction of the sweep). The output is a copy of input values, bit for bit; the gradient of each
// output goes to the position its maximum came from.
#include <opbridge/op.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace opbridge {
namespace {

// Which axis the sweep runs along, and from which end.
struct Sweep {
  bool along_height;  // top, bottom: along H (each step a whole row, contiguous); left, right: along W
  bool from_end;      // top, left: from the last row (column) towards the first
};

Sweep sweep_of(const std::string& mode) {
  OB_CHECK(mode == "top" || mode == "bottom" || mode == "left" || mode == "right",
           "mode must be 'top', 'bottom', 'left' or 'right', got '", mode, "'");
  return {mode == "top" || mode == "bottom", mode == "top" || mode == "left"};
}

// torch.cummax's rule for whether `next` becomes the running maximum over `current`.
template <typename C>
inline bool takes_over(C next, C current) {
  return next != next || (current == current && next >= current);
}

struct Plane {
  int64_t planes, h, w;
};

Plane plane_of(const TensorView& x) { return {x.dim(0) * x.dim(1), x.dim(2), x.dim(3)}; }

// Planes per parallel chunk: about 2^15 values each.
int64_t grain(const Plane& p) { return std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, p.h * p.w)); }

// The position of a sweep of n at step `step`.
inline int64_t at(const Sweep& s, int64_t step, int64_t n) { return s.from_end ? n - 1 - step : step; }

template <typename T>
void forward_plane(const Sweep& s, const Plane& p, const T* x, T* y) {
  if (s.along_height) {
    // Row by row: each output row is the elementwise pick between the input row and the
    // previous output row (a compare and a blend the compiler vectorises along W).
    for (int64_t step = 0; step < p.h; ++step) {
      const int64_t r = at(s, step, p.h);
      const T* in = x + r * p.w;
      T* out = y + r * p.w;
      if (step == 0) {
        std::copy(in, in + p.w, out);
        continue;
      }
      const T* prev = y + at(s, step - 1, p.h) * p.w;
      for (int64_t j = 0; j < p.w; ++j) out[j] = takes_over(widen(in[j]), widen(prev[j])) ? in[j] : prev[j];
    }
    return;
  }
  for (int64_t r = 0; r < p.h; ++r) {
    const T* in = x + r * p.w;
    T* out = y + r * p.w;
    if (p.w == 0) continue;
    T best = in[at(s, 0, p.w)];
    for (int64_t step = 0; step < p.w; ++step) {
      const int64_t j = at(s, step, p.w);
      if (takes_over(widen(in[j]), widen(best))) best = in[j];
      out[j] = best;
    }
  }
}

// One sweep's gradient: the running maximum is found again; the incoming gradients of the
// positions it holds are summed in sweep order, in compute_t<T> from 0 and rounded to T once (as
// PyTorch's scatter_add over cummax's indices sums them on the CPU, the 16-bit floats in float32),
// and written to where it came from. `lanes` sweeps run side by side, lane l reading
// element base + l * lane_stride + position * step_stride.
template <typename T>
void backward_sweeps(const Sweep& s, int64_t n, int64_t lanes, int64_t step_stride, int64_t lane_stride,
                     const T* g, const T* x, T* gx, std::vector<int64_t>& holder, std::vector<T>& best,
                     std::vector<compute_t<T>>& sum) {
  holder.assign(static_cast<size_t>(lanes), 0);
  best.resize(static_cast<size_t>(lanes));
  sum.resize(static_cast<size_t>(lanes));
  for (int64_t step = 0; step < n; ++step) {
    const int64_t pos = at(s, step, n);
    for (int64_t l = 0; l < lanes; ++l) {
      const int64_t e = l * lane_stride + pos * step_stride;
      if (step == 0 || takes_over(widen(x[e]), widen(best[l]))) {
        if (step > 0) gx[l * lane_stride + holder[l] * step_stride] = narrow<T>(sum[l]);
        holder[l] = pos;
        best[l] = x[e];
        sum[l] = compute_t<T>(0) + widen(g[e]);  // 0 + g: a -0.0 gradient sums to +0.0, as in PyTorch
      } else {
        sum[l] += widen(g[e]);
      }
    }
  }
  if (n > 0)
    for (int64_t l = 0; l < lanes; ++l) gx[l * lane_stride + holder[l] * step_stride] = narrow<T>(sum[l]);
}

template <typename T>
void backward_plane(const Sweep& s, const Plane& p, const T* g, const T* x, T* gx, std::vector<int64_t>& holder,
                    std::vector<T>& best, std::vector<compute_t<T>>& sum) {
  std::fill(gx, gx + p.h * p.w, narrow<T>(0));
  if (s.along_height) {
    backward_sweeps(s, p.h, p.w, p.w, 1, g, x, gx, holder, best, sum);  // W lanes, contiguous
  } else {
    for (int64_t r = 0; r < p.h; ++r)
      backward_sweeps(s, p.w, 1, 1, 0, g + r * p.w, x + r * p.w, gx + r * p.w, holder, best, sum);
  }
}

void corner_pool_kernel(KernelContext& ctx, const TensorView& x, const std::string& mode, TensorView& output) {
  const Sweep s = sweep_of(mode);
  const Plane p = plane_of(x);
  visit_dtype<float, double, Float16, BFloat16>(x.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data_as<T>();
    T* py = output.data_as<T>();
    ctx.parallel_for(p.planes, grain(p), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) forward_plane(s, p, px + i * p.h * p.w, py + i * p.h * p.w);
    });
  });
}

void corner_pool_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& x,
                                 const std::string& mode, TensorView& grad_x) {
  const Sweep s = sweep_of(mode);
  const Plane p = plane_of(x);
  visit_dtype<float, double, Float16, BFloat16>(x.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* pg = grad_output.data_as<T>();
    const T* px = x.data_as<T>();
    T* pgx = grad_x.data_as<T>();
    ctx.parallel_for(p.planes, grain(p), [&](int64_t b, int64_t e) {
      std::vector<int64_t> holder;
      std::vector<T> best;
      std::vector<compute_t<T>> sum;
      for (int64_t i = b; i < e; ++i) {
        const int64_t off = i * p.h * p.w;
        backward_plane(s, p, pg + off, px + off, pgx + off, holder, best, sum);
      }
    });
  });
}

void input_and_mode(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
      .input("x", "T", "(N, C, H, W) feature map", 4)
      .string_attr("mode", "",
                   "'top' (maximum of rows h..H-1), 'bottom' (rows 0..h), 'left' (columns w..W-1) or 'right' "
                   "(columns 0..w); required in effect: the default '' is refused");
}

}  // namespace

OPBRIDGE_OP(corner_pool_backward)
    .doc("The gradient of corner_pool: each output's incoming gradient goes to the position its running maximum "
         "came from (torch.cummax's index).")
    .input("grad_output", "T", "(N, C, H, W) gradient of output", 4)
    .with(input_and_mode)
    .with([](OpBuilder& op) {
      for (int64_t axis = 0; axis < 4; ++axis)
        op.check(dim("grad_output", axis) == dim("x", axis), "grad_output must have the shape of x");
    })
    .output("grad_x", "T", shape::same({"x"}), "(N, C, H, W)")
    .cpu(corner_pool_backward_kernel);

OPBRIDGE_OP(corner_pool)
    .doc("Corner pooling (CornerNet), as mmcv.ops.CornerPool: the running maximum of each column ('top', "
         "'bottom') or row ('left', 'right') of the feature map, towards the named side, with torch.cummax's rule "
         "(a NaN propagates; a tie moves the maximum to the later value).")
    .with(input_and_mode)
    .output("output", "T", shape::same({"x"}), "(N, C, H, W)")
    .cpu(corner_pool_kernel)
    .backward("corner_pool_backward");

}  // namespace opbridge
