// What a kernel sees: its inputs and outputs as TensorViews, its attributes, and the services of
// the host runtime it runs in (thread pool, output memory, scratch memory).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <type_traits>
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

  const TensorView& input(size_t i) const;
  const TensorView& input(std::string_view name) const { return input(index_of_input(name)); }
  // nullptr when the optional input is absent.
  const TensorView* optional_input(std::string_view name) const { return inputs_.at(index_of_input(name)); }
  TensorView& output(size_t i) { return outputs_.at(i); }
  const std::vector<TensorView>& outputs() const { return outputs_; }
  // Allocates output i, whose shape rule has data_dependent() dimensions, once the kernel knows
  // its shape (which must agree with the rule's other dimensions). Once per output, from the
  // kernel's own thread (not inside parallel_for). Until then output(i) has no data and its
  // data-dependent dims read kDataDependentDim.
  TensorView& allocate_output(size_t i, Shape shape);
  // After the kernel: every data-dependent output was allocated.
  void check_outputs_allocated() const;

  int64_t attr_int(std::string_view name) const { return std::get<int64_t>(attr(name)); }
  double attr_float(std::string_view name) const { return std::get<double>(attr(name)); }
  bool attr_bool(std::string_view name) const { return std::get<bool>(attr(name)); }
  const std::vector<int64_t>& attr_ints(std::string_view name) const { return std::get<std::vector<int64_t>>(attr(name)); }
  const std::vector<double>& attr_floats(std::string_view name) const { return std::get<std::vector<double>>(attr(name)); }
  const std::string& attr_string(std::string_view name) const { return std::get<std::string>(attr(name)); }

  // Runs fn(begin, end) over [0, n) in chunks of at least `grain` on the host's thread pool.
  void parallel_for(int64_t n, int64_t grain, ParallelBody body) { host_.parallel_for(n, grain, body); }
  // Scratch memory (64-byte aligned, not zeroed) that lives until the kernel returns. Safe to
  // call inside parallel_for. Large blocks are reused across calls (<opbridge/block_cache.h>).
  void* scratch(size_t bytes);

 private:
  size_t index_of_input(std::string_view name) const;
  const AttrValue& attr(std::string_view name) const;

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

}  // namespace opbridge
