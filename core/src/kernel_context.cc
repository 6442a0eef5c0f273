#include "opbridge/kernel_context.h"

#include "opbridge/error.h"

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

void* KernelContext::scratch(size_t bytes) {
  auto buf = std::make_unique<std::byte[]>(bytes);
  std::lock_guard<std::mutex> lock(scratch_mu_);
  scratch_.push_back(std::move(buf));
  return scratch_.back().get();
}

}  // namespace opbridge
