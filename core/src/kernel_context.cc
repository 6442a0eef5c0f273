#include "opbridge/kernel_context.h"

#include <algorithm>
#include <map>
#include <new>
#include <string>

#include "opbridge/block_cache.h"
#include "opbridge/error.h"

namespace opbridge {

namespace {
bool pending(const TensorView& t) {
  for (int64_t d : t.shape)
    if (d == kDataDependentDim) return true;
  return false;
}
}  // namespace

TensorView& KernelContext::allocate_output(TensorView& out, Shape shape) {
  const auto i = static_cast<size_t>(&out - outputs_.data());
  OB_CHECK(&out >= outputs_.data() && i < outputs_.size(), "kernel allocates a tensor that is not one of its outputs");
  const OutputSpec& spec = op_.outputs[i];
  OB_CHECK(pending(out), "output '", spec.name, "' is not data-dependent or is already allocated");
  OB_CHECK(shape.size() == out.shape.size(), "kernel gives output '", spec.name, "' rank ", shape.size(),
           "; its shape rule has rank ", out.shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    OB_CHECK(shape[d] >= 0, "kernel gives output '", spec.name, "' the negative size ", shape_str(shape));
    OB_CHECK(out.shape[d] == kDataDependentDim || out.shape[d] == shape[d], "kernel gives output '", spec.name,
             "' shape ", shape_str(shape), "; its shape rule fixes axis ", d, " to ", out.shape[d]);
  }
  out.data = output_memory(host_, i, out.dtype, shape, spec.name);
  out.strides = contiguous_strides(shape);
  out.shape = std::move(shape);
  return out;
}

void KernelContext::check_outputs_allocated() const {
  // A named data-dependent size is one value: the first output that has it says which.
  std::map<std::string, std::pair<int64_t, std::string>> named;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const OutputSpec& spec = op_.outputs[i];
    OB_CHECK(!pending(outputs_[i]), "the kernel returned without allocating its data-dependent output '", spec.name,
             "' (a bug in the op's kernel)");
    for (size_t d = 0; d < spec.shape.dims.size(); ++d) {
      const DimNode& n = *spec.shape.dims[d].node;
      if (n.kind != DimNode::Kind::Data || n.name.empty()) continue;
      const int64_t size = outputs_[i].shape[d];
      auto [it, first] = named.try_emplace(n.name, size, spec.name);
      OB_CHECK(first || it->second.first == size, "the kernel gave the data-dependent size '", n.name, "' two values: ",
               it->second.first, " (output '", it->second.second, "') and ", size, " (output '", spec.name,
               "') (a bug in the op's kernel)");
    }
  }
}

void* output_memory(KernelHost& host, size_t i, DType dtype, const Shape& shape, const std::string& name) {
  // Refused here, in the op's words, before a host's allocator sees an impossible size.
  const int64_t bytes = checked_nbytes(dtype, shape, name);
  const auto refused = [&](const std::string& why) {
    return Error(detail::concat("output '", name, "' of shape ", shape_str(shape), " (", bytes,
                                " bytes) cannot be allocated", why));
  };
  try {
    return host.output_memory(i, dtype, shape);
  } catch (const std::bad_alloc&) {
    throw refused(": out of memory");
  } catch (const Error&) {
    throw;  // the host's own words, which name the output already
  } catch (const std::exception& e) {  // e.g. a runtime's allocator refusing: its first line
    const std::string what = e.what();
    throw refused(": " + what.substr(0, what.find('\n')));
  }
}

void* KernelContext::scratch(size_t bytes) {
  // Not zero-filled: kernels write their scratch before reading it. Large blocks come back from
  // the scratch cache on later calls instead of as fresh pages.
  size_t size = 0;
  void* block = nullptr;
  try {
    block = scratch_cache().take(bytes, size);
  } catch (const std::bad_alloc&) {
    throw Error(detail::concat("scratch memory of ", bytes, " bytes cannot be allocated: out of memory"));
  }
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
