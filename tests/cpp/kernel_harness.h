// Runs an op's kernel outside any runtime, for kernel tests against naive loops.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "opbridge/kernel_context.h"
#include "opbridge/prepare.h"
#include "opbridge/registry.h"
#include "opbridge/shape_infer.h"

namespace opbridge::testing {

// A tensor that owns its bytes.
struct Tensor {
  std::shared_ptr<std::vector<std::byte>> bytes;
  TensorView view;

  template <typename T>
  static Tensor of(Shape shape, std::vector<T> values) {
    Tensor t;
    t.bytes = std::make_shared<std::vector<std::byte>>(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(t.bytes->data(), values.data(), t.bytes->size());
    t.view = TensorView{t.bytes->data(), DTypeOf<T>::value, shape, contiguous_strides(shape), Device::CPU};
    EXPECT_EQ(t.view.numel(), static_cast<int64_t>(values.size()));
    return t;
  }
  template <typename T>
  static Tensor random(Shape shape, uint32_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> dist(-2.0, 2.0);
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = static_cast<T>(dist(gen));
    return of<T>(std::move(shape), std::move(v));
  }
  template <typename T>
  std::vector<T> values() const {
    const T* p = view.data_as<T>();
    return std::vector<T>(p, p + view.numel());
  }
};

// Splits work over real threads in small chunks, so kernel tests exercise chunk boundaries.
class ThreadedKernelContext final : public KernelContext {
 public:
  using KernelContext::KernelContext;
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) override {
    const int64_t chunk = 7;  // deliberately tiny and odd
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(4);
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        try {
          for (int64_t b = t * chunk; b < n; b += 4 * chunk) fn(b, std::min(n, b + chunk));
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    for (auto& th : threads) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
};

// Runs op `name` on the given inputs (nullopt: an absent optional input) and attributes.
inline std::vector<Tensor> run(const std::string& name, const std::vector<std::optional<Tensor>>& in,
                               const std::map<std::string, AttrValue>& given = {}, bool threaded = true) {
  const OpSpec* op = registry().find(name);
  if (!op) throw Error("no op " + name);
  std::vector<const TensorView*> inputs;
  for (const auto& t : in) inputs.push_back(t ? &t->view : nullptr);
  inputs.resize(op->inputs.size(), nullptr);
  std::vector<std::optional<AttrValue>> attr_in;
  for (const AttrSpec& a : op->attrs) {
    auto it = given.find(a.name);
    attr_in.push_back(it == given.end() ? std::nullopt : std::optional<AttrValue>(it->second));
  }
  std::vector<AttrValue> attrs = resolve_attrs(*op, attr_in);
  PreparedCall call = prepare_call(*op, inputs, attrs);
  std::vector<Tensor> outs;
  std::vector<TensorView> views;
  for (size_t i = 0; i < op->outputs.size(); ++i) {
    Tensor t;
    int64_t n = 1;
    for (int64_t d : call.output_shapes[i]) n *= std::max<int64_t>(d, 0);  // data-dependent: kernel allocates
    t.bytes = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(n) * dtype_size(call.output_dtypes[i]));
    t.view = TensorView{t.bytes->data(), call.output_dtypes[i], call.output_shapes[i],
                        contiguous_strides(call.output_shapes[i]), Device::CPU};
    views.push_back(t.view);
    outs.push_back(std::move(t));
  }
  auto finish = [&](KernelContext& ctx) {
    op->cpu_kernel(ctx);
    ctx.check_outputs_allocated();
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!op->outputs[i].data_dependent()) continue;
      // Copy out of the context's own memory before it goes.
      const TensorView& v = ctx.output(i);
      size_t bytes = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
      outs[i].bytes = std::make_shared<std::vector<std::byte>>(bytes);
      if (bytes) std::memcpy(outs[i].bytes->data(), v.data, bytes);
      outs[i].view = TensorView{outs[i].bytes->data(), v.dtype, v.shape, v.strides, Device::CPU};
    }
  };
  if (threaded) {
    ThreadedKernelContext ctx(*op, inputs, views, attrs);
    finish(ctx);
  } else {
    SerialKernelContext ctx(*op, inputs, views, attrs);
    finish(ctx);
  }
  return outs;
}

// Row-major index -> offset into a tensor of `in_shape` broadcast to `out_shape`.
inline int64_t broadcast_offset(const Shape& out_shape, const Shape& in_shape, int64_t index) {
  int64_t off = 0, stride = 1;
  for (size_t j = 0; j < out_shape.size(); ++j) {
    size_t oa = out_shape.size() - 1 - j;
    int64_t coord = index % out_shape[oa];
    index /= out_shape[oa];
    if (j < in_shape.size()) {
      int64_t d = in_shape[in_shape.size() - 1 - j];
      off += (d == 1 ? 0 : coord) * stride;
      stride *= d;
    }
  }
  return off;
}

}  // namespace opbridge::testing
