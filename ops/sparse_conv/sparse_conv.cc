// Sparse convolution (SECOND's, as mmcv 2.x's sparse ops compute it): a rulebook of (input row,
// output row) pairs per kernel offset, built once per layer from the active sites, and the
// convolution and max pooling that run over it. The kernels are in sparse_conv_rulebook.cc and
// sparse_conv_kernel.cc.
#include <opbridge/op.h>

#include "sparse_conv_kernel.h"

namespace opbridge {

namespace {
// The rulebook both sides of a convolution read: pairs (K, 2, L) and their counts (K,).
void rulebook_inputs(OpBuilder& op) {
  op.types("I", {DType::Int32})
      .input("indice_pairs", "I",
             "(K, 2, L) per kernel offset, indice_pair_num[k] pairs: row 0 the input rows, row 1 the output rows "
             "(sparse_indice_pairs' output); the rest is not read",
             3)
      .input("indice_pair_num", "I", "(K,) the pairs of each kernel offset", 1)
      .check(dim("indice_pairs", 1) == 2, "indice_pairs must be (K, 2, L)")
      .check(dim("indice_pair_num", 0) == dim("indice_pairs", 0), "indice_pair_num must have one entry per kernel offset");
}

void conv_attributes(OpBuilder& op) {
  op.bool_attr("inverse", false,
               "run the rulebook backwards (mmcv's SparseInverseConv): read row 1's rows of features, write row 0's")
      .check(dim("filters", -2) == dim("features", 1), "filters must be (*kernel_size, Cin, Cout) with Cin = features.shape[1]");
}
}  // namespace

OPBRIDGE_OP(sparse_indice_pairs)
    .doc("The rulebook of a sparse convolution over the active sites `indices` (mmcv's get_indice_pairs, in the "
         "order of its CPU kernel): the output sites, numbered by first appearance (input rows in order; for each, "
         "the sites it reaches from the highest position down), and per kernel offset the (input row, output row) "
         "pairs, by input row. The output grid is mmcv's: (in + 2 padding - dilation (kernel - 1) - 1) // stride + 1, "
         "for a transposed convolution (in - 1) stride - 2 padding + kernel + output_padding, for a submanifold one "
         "the input grid with stride 1 and padding kernel_size // 2 (whatever stride and padding say) and the input "
         "sites as output sites.")
    .types("I", {DType::Int32})
    .input("indices", "I", "(N, D + 1) active sites, 1 <= D <= 4: batch index, then the D coordinates; no site twice",
           2)
    .ints_attr("spatial_shape", "(D,) the input grid's size; each coordinate must be within it")
    .ints_attr("kernel_size", "(D,) the kernel's size; prod(kernel_size) <= 4096")
    .ints_attr("stride", {}, "(D,) or empty (all 1)")
    .ints_attr("padding", {}, "(D,) or empty (all 0)")
    .ints_attr("dilation", {}, "(D,) or empty (all 1)")
    .ints_attr("output_padding", {}, "(D,) or empty (all 0); enters a transposed convolution's grid only")
    .int_attr("batch_size", -1, "batch indices must be below it; -1: any batch index >= 0")
    .bool_attr("subm", false, "a submanifold convolution: the output sites are the input sites")
    .bool_attr("transposed", false, "a transposed convolution (not with subm)")
    .check(dim("indices", 1) >= 2, "indices must be (N, D + 1) with D >= 1")
    .check(dim("indices", 1) <= 5, "indices must be (N, D + 1) with D <= 4")
    .output("out_indices", DType::Int32, shape::dims({data_dependent("sites"), dim("indices", 1)}),
            "(M, D + 1) the output sites (for subm, indices itself)")
    .output("indice_pairs", DType::Int32,
            shape::dims({data_dependent("kernel_volume"), constant(2), dim("indices", 0)}),
            "(K, 2, N), K = prod(kernel_size): row 0 input rows, row 1 output rows, -1 past indice_pair_num[k]")
    .output("indice_pair_num", DType::Int32, shape::dims({data_dependent("kernel_volume")}),
            "(K,) the pairs of each kernel offset")
    .cpu(sparse_indice_pairs_kernel);

OPBRIDGE_OP(sparse_indice_conv_backward)
    .doc("The gradient of sparse_indice_conv with respect to features and filters.")
    .types("T", {DType::Float32, DType::Float64})
    .input("grad_output", "T", "(M, Cout) gradient of the output", 2)
    .input("features", "T", "(N, Cin) the forward's features", 2)
    .input("filters", "T", "(*kernel_size, Cin, Cout) the forward's filters")
    .with(rulebook_inputs)
    .with(conv_attributes)
    .check(dim("grad_output", 1) == dim("filters", -1), "grad_output must be (M, Cout) with Cout = filters.shape[-1]")
    .output("grad_features", "T", shape::same({"features"}), "(N, Cin)")
    .output("grad_filters", "T", shape::same({"filters"}), "(*kernel_size, Cin, Cout)")
    .cpu(sparse_indice_conv_backward_kernel);

OPBRIDGE_OP(sparse_indice_conv)
    .doc("Sparse convolution over a rulebook (mmcv's indice_conv_forward): output[o] = sum over the kernel offsets "
         "k and their pairs (i, o) of features[i] @ filters[k], with filters mmcv's (*kernel_size, Cin, Cout) "
         "viewed as (K, Cin, Cout); zero rows where no pair writes. No bias (mmcv adds it after).")
    .types("T", {DType::Float32, DType::Float64})
    .input("features", "T", "(N, Cin) features of the input sites", 2)
    .input("filters", "T", "(*kernel_size, Cin, Cout)")
    .with(rulebook_inputs)
    .input("out_indices", "I", "(M, ...) the output sites (sparse_indice_pairs' out_indices): only their count is read")
    .with(conv_attributes)
    .output("output", "T", shape::dims({dim("out_indices", 0), dim("filters", -1)}), "(M, Cout)")
    .cpu(sparse_indice_conv_kernel)
    .backward("sparse_indice_conv_backward");

OPBRIDGE_OP(sparse_indice_maxpool_backward)
    .doc("The gradient of sparse_indice_maxpool with respect to features.")
    .types("T", {DType::Float32, DType::Float64})
    .input("grad_output", "T", "(M, C) gradient of the output", 2)
    .input("features", "T", "(N, C) the forward's features", 2)
    .input("output", "T", "(M, C) the forward's output", 2)
    .with(rulebook_inputs)
    .check(dim("output", 1) == dim("features", 1), "output must have the channels of features")
    .check(dim("grad_output", 0) == dim("output", 0), "grad_output must have the shape of output")
    .check(dim("grad_output", 1) == dim("output", 1), "grad_output must have the shape of output")
    .output("grad_features", "T", shape::same({"features"}), "(N, C): each input equal to its output's maximum "
            "takes that output's gradient (all of them on a tie)")
    .cpu(sparse_indice_maxpool_backward_kernel);

OPBRIDGE_OP(sparse_indice_maxpool)
    .doc("Sparse max pooling over a rulebook (mmcv's indice_maxpool_forward): output[o] = the channel-wise maximum "
         "of 0 and the features[i] of o's pairs (mmcv starts every output at 0); NaN is never taken.")
    .types("T", {DType::Float32, DType::Float64})
    .input("features", "T", "(N, C) features of the input sites", 2)
    .with(rulebook_inputs)
    .input("out_indices", "I", "(M, ...) the output sites: only their count is read")
    .output("output", "T", shape::dims({dim("out_indices", 0), dim("features", 1)}), "(M, C)")
    .cpu(sparse_indice_maxpool_kernel)
    .backward("sparse_indice_maxpool_backward");

}  // namespace opbridge
