// What a kernel sees: its inputs and pre-allocated outputs as TensorViews, its attributes, and
// the host runtime's services (thread pool, scratch memory). Each adapter subclasses it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "opbridge/op_spec.h"
#include "opbridge/tensor_view.h"

namespace opbridge {

class KernelContext {
 public:
  KernelContext(const OpSpec& op, std::vector<const TensorView*> inputs, std::vector<TensorView> outputs,
                const std::vector<AttrValue>& attrs)
      : op_(op), inputs_(std::move(inputs)), outputs_(std::move(outputs)), attrs_(attrs) {}
  virtual ~KernelContext() = default;
  KernelContext(const KernelContext&) = delete;
  KernelContext& operator=(const KernelContext&) = delete;

  const OpSpec& op() const { return op_; }

  bool has_input(std::string_view name) const { return inputs_.at(index_of_input(name)) != nullptr; }
  const TensorView& input(size_t i) const;
  const TensorView& input(std::string_view name) const { return input(index_of_input(name)); }
  // nullptr when the optional input is absent.
  const TensorView* optional_input(std::string_view name) const { return inputs_.at(index_of_input(name)); }
  TensorView& output(size_t i) { return outputs_.at(i); }
  // Allocates output i, whose shape rule has data_dependent() dimensions, once the kernel knows
  // its shape (which must agree with the rule's other dimensions). Once per output, from the
  // kernel's own thread (not inside parallel_for). Until then output(i) has no data and its
  // data-dependent dims read kDataDependentDim.
  TensorView& allocate_output(size_t i, Shape shape);
  // For adapters, after the kernel: every data-dependent output was allocated.
  void check_outputs_allocated() const;

  int64_t attr_int(std::string_view name) const { return std::get<int64_t>(attr(name)); }
  double attr_float(std::string_view name) const { return std::get<double>(attr(name)); }
  bool attr_bool(std::string_view name) const { return std::get<bool>(attr(name)); }
  const std::vector<int64_t>& attr_ints(std::string_view name) const { return std::get<std::vector<int64_t>>(attr(name)); }
  const std::vector<double>& attr_floats(std::string_view name) const { return std::get<std::vector<double>>(attr(name)); }
  const std::string& attr_string(std::string_view name) const { return std::get<std::string>(attr(name)); }

  // Runs fn(begin, end) over [0, n) in chunks of at least `grain` on the host runtime's
  // intra-op thread pool (at::parallel_for in PyTorch, KernelContext_ParallelFor in ORT).
  virtual void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) = 0;
  // Scratch memory that lives until the kernel returns. Safe to call inside parallel_for.
  void* scratch(size_t bytes);

 protected:
  // The memory of a data-dependent output: the host runtime's tensor (adapters override),
  // else memory owned by this context (tests, tools).
  virtual void* allocate(size_t i, DType dtype, const Shape& shape);

 private:
  size_t index_of_input(std::string_view name) const;
  const AttrValue& attr(std::string_view name) const;

  const OpSpec& op_;
  std::vector<const TensorView*> inputs_;
  std::vector<TensorView> outputs_;
  const std::vector<AttrValue>& attrs_;
  std::mutex scratch_mu_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
  std::vector<std::unique_ptr<std::byte[]>> owned_outputs_;
};

// Serial context for tests and tools that run a kernel outside any runtime.
class SerialKernelContext : public KernelContext {
 public:
  using KernelContext::KernelContext;
  void parallel_for(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n > 0) fn(0, n);
  }
};

}  // namespace opbridge
