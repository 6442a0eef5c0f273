#include "opbridge/kernel_context.h"

#include <algorithm>

#include "opbridge/block_cache.h"
#include "opbridge/error.h"
#include "opbridge/kernel_call.h"

namespace opbridge {

const TensorView& KernelContext::input(size_t i) const {
  const TensorView* t = inputs_.at(i);
  OB_CHECK(t, "optional input '", op_.inputs.at(i).name, "' is absent");
  return *t;
}

size_t KernelContext::index_of_input(std::string_view name) const {
  int i = op_.input_index(name);
  OB_CHECK(i >= 0, "kernel asks for unknown input '", name, "'");
  return static_cast<size_t>(i);
}

const AttrValue& KernelContext::attr(std::string_view name) const {
  int i = op_.attr_index(name);
  OB_CHECK(i >= 0, "kernel asks for unknown attribute '", name, "'");
  return attrs_.at(static_cast<size_t>(i));
}

namespace {
bool pending(const TensorView& t) {
  for (int64_t d : t.shape)
    if (d == kDataDependentDim) return true;
  return false;
}
}  // namespace

TensorView& KernelContext::allocate_output(size_t i, Shape shape) {
  OB_CHECK(i < outputs_.size(), "kernel allocates output ", i, " of ", outputs_.size());
  TensorView& out = outputs_[i];
  const OutputSpec& spec = op_.outputs[i];
  OB_CHECK(pending(out), "output '", spec.name, "' is not data-dependent or is already allocated");
  OB_CHECK(shape.size() == out.shape.size(), "kernel gives output '", spec.name, "' rank ", shape.size(),
           "; its shape rule has rank ", out.shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    OB_CHECK(shape[d] >= 0, "kernel gives output '", spec.name, "' the negative size ", shape_str(shape));
    OB_CHECK(out.shape[d] == kDataDependentDim || out.shape[d] == shape[d], "kernel gives output '", spec.name,
             "' shape ", shape_str(shape), "; its shape rule fixes axis ", d, " to ", out.shape[d]);
  }
  checked_nbytes(out.dtype, shape, spec.name);
  out.data = host_.output_memory(i, out.dtype, shape);
  out.strides = contiguous_strides(shape);
  out.shape = std::move(shape);
  return out;
}

void KernelContext::check_outputs_allocated() const {
  for (size_t i = 0; i < outputs_.size(); ++i)
    OB_CHECK(!pending(outputs_[i]), "the kernel returned without allocating its data-dependent output '",
             op_.outputs[i].name, "' (a bug in the op's kernel)");
}

void* KernelContext::scratch(size_t bytes) {
  // Not zero-filled: kernels write their scratch before reading it. Large blocks come back from
  // the scratch cache on later calls instead of as fresh pages.
  size_t size = 0;
  void* block = scratch_cache().take(bytes, size);
  std::lock_guard<std::mutex> lock(scratch_mu_);
  try {
    scratch_.push_back({block, size});
  } catch (...) {
    scratch_cache().give(block, size);
    throw;
  }
  return block;
}

KernelContext::~KernelContext() {
  for (const ScratchBlock& s : scratch_) scratch_cache().give(s.block, s.size);
}

}  // namespace opbridge
