#include "opbridge/kernel_call.h"

#include <new>
#include <string>

#include "opbridge/error.h"
#include "opbridge/prepare.h"

namespace opbridge {

std::vector<TensorView> run_kernel(const OpSpec& op, const std::vector<const TensorView*>& inputs,
                                   const std::vector<AttrValue>& attrs, KernelHost& host) {
  CallBuffers buffers;
  run_kernel(op, inputs, attrs, host, buffers);
  return std::move(buffers.outputs);
}

void run_kernel(const OpSpec& op, const std::vector<const TensorView*>& inputs, const std::vector<AttrValue>& attrs,
                KernelHost& host, CallBuffers& buffers) {
  PreparedCall& call = buffers.call;
  prepare_call(op, inputs, attrs, call);
  std::vector<TensorView>& outputs = buffers.outputs;
  outputs.resize(op.outputs.size());
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    TensorView& out = outputs[i];
    out.dtype = call.output_dtypes[i];
    out.shape = call.output_shapes[i];  // copied into storage kept from earlier calls
    if (op.outputs[i].data_dependent()) {  // the kernel allocates it (allocate_output)
      out.data = nullptr;
      out.strides.clear();
      continue;
    }
    out.data = output_memory(host, i, out.dtype, out.shape, op.outputs[i].name);
    contiguous_strides(out.shape, out.strides);
  }
  KernelContext ctx(op, inputs, outputs, attrs, host);
  try {
    op.cpu_kernel(ctx);
  } catch (const std::bad_alloc&) {
    // The kernel's own working memory (outputs and scratch say what they are above): name the
    // inputs it was sized by, so the error is never a bare std::bad_alloc.
    std::string given;
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (i < inputs.size() && inputs[i])
        given += detail::concat(given.empty() ? "" : ", ", op.inputs[i].name, " ", shape_str(inputs[i]->shape));
    throw Error(detail::concat("out of memory: the kernel's working memory for inputs ", given,
                               " cannot be allocated"));
  }
  ctx.check_outputs_allocated();
}

}  // namespace opbridge
