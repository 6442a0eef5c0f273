#include "opbridge/kernel_call.h"

#include "opbridge/error.h"
#include "opbridge/prepare.h"

namespace opbridge {

int64_t checked_nbytes(DType dtype, const Shape& shape, const std::string& name) {
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape)
    OB_CHECK(!__builtin_mul_overflow(bytes, d, &bytes), "output '", name, "' of shape ", shape_str(shape),
             " is too large");
  return bytes;
}

std::vector<TensorView> run_kernel(const OpSpec& op, const std::vector<const TensorView*>& inputs,
                                   const std::vector<AttrValue>& attrs, KernelHost& host) {
  PreparedCall call = prepare_call(op, inputs, attrs);
  std::vector<TensorView> outputs;
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    const Shape& shape = call.output_shapes[i];
    const DType dtype = call.output_dtypes[i];
    if (op.outputs[i].data_dependent()) {  // the kernel allocates it (allocate_output)
      outputs.push_back(TensorView{nullptr, dtype, shape, {}, Device::CPU});
      continue;
    }
    // Refused here, in the op's words, before a host's allocator sees an impossible size.
    checked_nbytes(dtype, shape, op.outputs[i].name);
    outputs.push_back(TensorView{host.output_memory(i, dtype, shape), dtype, shape, contiguous_strides(shape), Device::CPU});
  }
  KernelContext ctx(op, inputs, std::move(outputs), attrs, host);
  op.cpu_kernel(ctx);
  ctx.check_outputs_allocated();
  return ctx.outputs();
}

}  // namespace opbridge
