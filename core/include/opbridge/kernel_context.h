// What a kernel sees: its arguments, bound to its parameters by position (KernelParam below, used
// by OpBuilder::cpu), and the services of the host runtime it runs in (thread pool, output memory,
// scratch memory).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "opbridge/op_spec.h"
#include "opbridge/tensor_view.h"

namespace opbridge {

// What parallel_for runs: a non-owning reference to a callable body(begin, end). Passing a
// kernel's lambda allocates nothing (a std::function would, for captures over 16 bytes: on every
// call of a small op). The callable must outlive the parallel_for call, as a lambda argument does.
class ParallelBody {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ParallelBody>>>
  ParallelBody(F&& body)  // NOLINT: implicit, so kernels pass lambdas as they are
      : body_(const_cast<void*>(static_cast<const void*>(std::addressof(body)))),
        call_([](void* b, int64_t begin, int64_t end) { (*static_cast<std::remove_reference_t<F>*>(b))(begin, end); }) {}
  void operator()(int64_t begin, int64_t end) const { call_(body_, begin, end); }

 private:
  void* body_;
  void (*call_)(void*, int64_t, int64_t);
};

// What a host runtime lends one kernel call. The torch adapter, the ONNX Runtime adapter and
// the kernel test harness each implement it; everything else about a call is the same in all of
// them (run_kernel in kernel_call.h).
class KernelHost {
 public:
  virtual ~KernelHost() = default;
  // Contiguous memory for output i, owned by the host (a torch tensor, ONNX Runtime's output).
  virtual void* output_memory(size_t i, DType dtype, const Shape& shape) = 0;
  // Runs fn(begin, end) over [0, n) in chunks of at least `grain` on the host's intra-op thread
  // pool (at::parallel_for in PyTorch, KernelContext_ParallelFor in ONNX Runtime).
  virtual void parallel_for(int64_t n, int64_t grain, ParallelBody body) = 0;
};

// host.output_memory(i, ...) for the output named `name`, its size checked first; a failure
// (std::bad_alloc, or the host's own error) becomes an Error naming the output, its shape and its
// bytes, as every allocation of an output must.
void* output_memory(KernelHost& host, size_t i, DType dtype, const Shape& shape, const std::string& name);

template <typename T> struct KernelParam;
template <typename V, ParamKind K> struct AttrParam;

// What a kernel gets besides its arguments (which OpBuilder::cpu binds to its parameters).
class KernelContext {
 public:
  // Refers to the caller's inputs, outputs and attributes, which outlive it (see run_kernel).
  KernelContext(const OpSpec& op, const std::vector<const TensorView*>& inputs, std::vector<TensorView>& outputs,
                const std::vector<AttrValue>& attrs, KernelHost& host)
      : op_(op), inputs_(inputs), outputs_(outputs), attrs_(attrs), host_(host) {}
  ~KernelContext();
  KernelContext(const KernelContext&) = delete;
  KernelContext& operator=(const KernelContext&) = delete;

  const OpSpec& op() const { return op_; }

  // Allocates `output` (one of the kernel's output parameters) whose shape rule has
  // data_dependent() dimensions, once the kernel knows its shape, which must agree with the
  // rule's other dimensions. Once per output, from the kernel's own thread (not inside
  // parallel_for). Until then the output has no data and its data-dependent dims read
  // kDataDependentDim.
  TensorView& allocate_output(TensorView& output, Shape shape);
  // After the kernel: every data-dependent output was allocated, and outputs that share a named
  // size got the same value.
  void check_outputs_allocated() const;

  // Runs fn(begin, end) over [0, n) in chunks of at least `grain` on the host's thread pool.
  void parallel_for(int64_t n, int64_t grain, ParallelBody body) { host_.parallel_for(n, grain, body); }
  // Scratch memory (64-byte aligned, not zeroed) that lives until the kernel returns. Safe to
  // call inside parallel_for. Large blocks are reused across calls (<opbridge/block_cache.h>).
  void* scratch(size_t bytes);

 private:
  template <typename T> friend struct KernelParam;
  template <typename V, ParamKind K> friend struct AttrParam;
  // Parameter `p` of the kernel, in the op's order (inputs, attributes, outputs). The kinds were
  // checked against the spec when the op registered (validate_spec).
  const TensorView* bound_input(size_t p) const { return inputs_[p]; }
  const AttrValue& bound_attr(size_t p) const { return attrs_[p - inputs_.size()]; }
  TensorView& bound_output(size_t p) { return outputs_[p - inputs_.size() - attrs_.size()]; }

  const OpSpec& op_;
  const std::vector<const TensorView*>& inputs_;
  std::vector<TensorView>& outputs_;
  const std::vector<AttrValue>& attrs_;
  KernelHost& host_;
  std::mutex scratch_mu_;
  struct ScratchBlock {
    void* block;
    size_t size;
  };
  std::vector<ScratchBlock> scratch_;  // handed back to scratch_cache() when the call ends
};

// ---- binding a kernel's parameters -----------------------------------------------------------
// KernelParam<T> says which kind of argument a parameter of type T takes, and fetches it.
template <typename>
inline constexpr bool kNotAKernelParameter = false;

template <typename T>
struct KernelParam {
  static_assert(kNotAKernelParameter<T>,
                "a kernel parameter is const TensorView& (an input), const TensorView* (an optional input, nullptr "
                "when absent), TensorView& (an output), or an attribute: int64_t, double, bool, const std::string&, "
                "const std::vector<int64_t>&, const std::vector<double>&");
};
template <>
struct KernelParam<const TensorView&> {
  static constexpr ParamKind kind = ParamKind::Input;
  static const TensorView& get(KernelContext& c, size_t p) { return *c.bound_input(p); }
};
template <>
struct KernelParam<const TensorView*> {
  static constexpr ParamKind kind = ParamKind::OptionalInput;
  static const TensorView* get(KernelContext& c, size_t p) { return c.bound_input(p); }
};
template <>
struct KernelParam<TensorView&> {
  static constexpr ParamKind kind = ParamKind::Output;
  static TensorView& get(KernelContext& c, size_t p) { return c.bound_output(p); }
};
// Attributes: the parameter's type is the value's, read from the attribute's variant.
template <typename V, ParamKind K>
struct AttrParam {
  static constexpr ParamKind kind = K;
  static const V& get(KernelContext& c, size_t p) { return *std::get_if<V>(&c.bound_attr(p)); }
};
template <> struct KernelParam<int64_t> : AttrParam<int64_t, ParamKind::Int> {};
template <> struct KernelParam<double> : AttrParam<double, ParamKind::Float> {};
template <> struct KernelParam<bool> : AttrParam<bool, ParamKind::Bool> {};
template <> struct KernelParam<const std::string&> : AttrParam<std::string, ParamKind::String> {};
template <> struct KernelParam<const std::vector<int64_t>&> : AttrParam<std::vector<int64_t>, ParamKind::Ints> {};
template <> struct KernelParam<const std::vector<double>&> : AttrParam<std::vector<double>, ParamKind::Floats> {};

template <typename... Args>
struct KernelBinder {
  using F = void (*)(KernelContext&, Args...);
  static void call(Kernel::Fn erased, KernelContext& ctx) { call(reinterpret_cast<F>(erased), ctx, std::index_sequence_for<Args...>{}); }
  template <size_t... P>
  static void call(F fn, KernelContext& ctx, std::index_sequence<P...>) { fn(ctx, KernelParam<Args>::get(ctx, P)...); }
};

// A Kernel calling fn with its arguments bound by position.
template <typename... Args>
Kernel bind_kernel(void (*fn)(KernelContext&, Args...)) {
  using B = KernelBinder<Args...>;
  return Kernel{reinterpret_cast<Kernel::Fn>(fn), static_cast<void (*)(Kernel::Fn, KernelContext&)>(&B::call),
                {KernelParam<Args>::kind...}};
}

}  // namespace opbridge
