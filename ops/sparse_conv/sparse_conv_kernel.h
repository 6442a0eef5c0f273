// The sparse convolution family's kernels (sparse_conv.cc declares the ops): the rulebook
// (sparse_conv_rulebook.cc) and the gather-GEMM-scatter convolution and max pooling over it
// (sparse_conv_kernel.cc).
#pragma once

#include <opbridge/op.h>

#include <vector>

namespace opbridge {

void sparse_indice_pairs_kernel(KernelContext& ctx, const TensorView& indices, const std::vector<int64_t>& spatial_shape,
                                const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                                const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                                const std::vector<int64_t>& output_padding, int64_t batch_size, bool subm,
                                bool transposed, TensorView& out_indices, TensorView& indice_pairs,
                                TensorView& indice_pair_num);

void sparse_indice_conv_kernel(KernelContext& ctx, const TensorView& features, const TensorView& filters,
                               const TensorView& indice_pairs, const TensorView& indice_pair_num,
                               const TensorView& out_indices, bool inverse, TensorView& output);
void sparse_indice_conv_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& features,
                                        const TensorView& filters, const TensorView& indice_pairs,
                                        const TensorView& indice_pair_num, bool inverse, TensorView& grad_features,
                                        TensorView& grad_filters);

void sparse_indice_maxpool_kernel(KernelContext& ctx, const TensorView& features, const TensorView& indice_pairs,
                                  const TensorView& indice_pair_num, const TensorView& out_indices,
                                  TensorView& output);
void sparse_indice_maxpool_backward_kernel(KernelContext& ctx, const TensorView& grad_output,
                                           const TensorView& features, const TensorView& output,
                                           const TensorView& indice_pairs, const TensorView& indice_pair_num,
                                           TensorView& grad_features);

}  // namespace opbridge
