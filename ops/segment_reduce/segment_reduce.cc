// Segment and scatter reductions with torch_scatter's semantics, over the rows of a (n, f) tensor
// (a caller reshapes other layouts around the op), one kernel (segment_reduce_kernel.cc):
//   segment_csr          torch_scatter's segment_csr: segment s is rows [indptr[s], indptr[s+1])
//   segment_csr_arg      the same for min and max, with the row each value came from
//   scatter_reduce       torch_scatter's scatter along the rows: row r goes to output row index[r]
//   scatter_reduce_arg   the same for min and max, with the rows
//   segment_coo          torch_scatter's segment_coo: scatter_reduce for a sorted index, whose rows
//                        are contiguous runs (no sorting pass)
//   segment_coo_arg      the same for min and max, with the rows
// reduce is "sum", "mean", "min" or "max". Gradients for every form.
#include <opbridge/op.h>

#include "segment_reduce_kernel.h"

namespace opbridge {
namespace {

using segment::Untouched;

void segment_csr_kernel(KernelContext& ctx, const TensorView& src, const TensorView& indptr, const std::string& reduce,
                        TensorView& out) {
  segment::reduce(ctx, src, segment::csr_groups(indptr, src.dim(0)), segment::parse(reduce, false),
                  Untouched::KeepStart, out, nullptr);
}

void segment_csr_arg_kernel(KernelContext& ctx, const TensorView& src, const TensorView& indptr,
                            const std::string& reduce, TensorView& out, TensorView& arg) {
  segment::reduce(ctx, src, segment::csr_groups(indptr, src.dim(0)), segment::parse(reduce, true),
                  Untouched::KeepStart, out, &arg);
}

void scatter_reduce_kernel(KernelContext& ctx, const TensorView& src, const TensorView& index, int64_t dim_size,
                           const std::string& reduce, TensorView& out) {
  segment::reduce(ctx, src, segment::scatter_groups(index, dim_size), segment::parse(reduce, false), Untouched::Zero,
                  out, nullptr);
}

void scatter_reduce_arg_kernel(KernelContext& ctx, const TensorView& src, const TensorView& index, int64_t dim_size,
                               const std::string& reduce, TensorView& out, TensorView& arg) {
  segment::reduce(ctx, src, segment::scatter_groups(index, dim_size), segment::parse(reduce, true), Untouched::Zero,
                  out, &arg);
}

void segment_coo_kernel(KernelContext& ctx, const TensorView& src, const TensorView& index, int64_t dim_size,
                        const std::string& reduce, TensorView& out) {
  segment::reduce(ctx, src, segment::coo_groups(index, dim_size), segment::parse(reduce, false), Untouched::Zero, out,
                  nullptr);
}

void segment_coo_arg_kernel(KernelContext& ctx, const TensorView& src, const TensorView& index, int64_t dim_size,
                            const std::string& reduce, TensorView& out, TensorView& arg) {
  segment::reduce(ctx, src, segment::coo_groups(index, dim_size), segment::parse(reduce, true), Untouched::Zero, out,
                  &arg);
}

void segment_csr_backward_kernel(KernelContext& ctx, const TensorView& grad_out, const TensorView& src,
                                 const TensorView& indptr, const std::string& reduce, TensorView& grad_src) {
  segment::backward(ctx, grad_out, src, segment::csr_groups(indptr, src.dim(0)), segment::parse(reduce, false), nullptr,
                    grad_src);
}

void scatter_reduce_backward_kernel(KernelContext& ctx, const TensorView& grad_out, const TensorView& src,
                                    const TensorView& index, int64_t dim_size, const std::string& reduce,
                                    TensorView& grad_src) {
  segment::backward(ctx, grad_out, src, segment::scatter_groups(index, dim_size), segment::parse(reduce, false), nullptr,
                    grad_src);
}

// The arg forms' gradient goes to the rows `arg` names, whatever grouped them.
void arg_reduce_backward_kernel(KernelContext& ctx, const TensorView& grad_out, const TensorView& src,
                                const TensorView& arg, const std::string& reduce, TensorView& grad_src) {
  segment::Groups one_per_output;  // arg says which row: only the segment count matters
  one_per_output.begin.assign(static_cast<size_t>(grad_out.dim(0)) + 1, 0);
  segment::backward(ctx, grad_out, src, one_per_output, segment::parse(reduce, true), &arg, grad_src);
}

const std::initializer_list<DType> kValues = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};

void csr_signature(OpBuilder& op) {
  op.types("T", kValues)
      .types("I", {DType::Int32, DType::Int64})
      .input("src", "T", "(n, f) rows to reduce", 2)
      .input("indptr", "I", "(s + 1,) segment s is rows indptr[s] .. indptr[s + 1]", 1);
}

void scatter_signature(OpBuilder& op) {
  op.types("T", kValues)
      .types("I", {DType::Int32, DType::Int64})
      .input("src", "T", "(n, f) rows to reduce", 2)
      .input("index", "I", "(n,) the output row of each row of src, in [0, dim_size)", 1)
      .sym_int_attr("dim_size", "output rows (often a node count, x.size(0): a graph value in ONNX)")
      .check(dim("index", 0) == dim("src", 0), "index must have one entry per row of src")
      .check(attr("dim_size") >= 0, "dim_size must be >= 0");
}

ShapeRule csr_rows() { return shape::dims({dim("indptr", 0) - 1, dim("src", 1)}); }
ShapeRule scatter_rows() { return shape::dims({attr("dim_size"), dim("src", 1)}); }

}  // namespace

OPBRIDGE_OP(segment_csr_backward)
    .doc("The gradient of segment_csr with respect to src.")
    .with(csr_signature)
    .input("grad_out", "T", "(s, f) gradient of out", 2)
    .string_attr("reduce", "sum", "the forward's reduction")
    .check(dim("grad_out", 0) == dim("indptr", 0) - 1, "grad_out must have one row per segment")
    .check(dim("grad_out", 1) == dim("src", 1), "grad_out must have src's columns")
    .output("grad_src", "T", shape::same({"src"}), "(n, f)")
    .cpu(+[](KernelContext& ctx, const TensorView& src, const TensorView& indptr, const TensorView& grad_out,
             const std::string& reduce, TensorView& grad_src) {
      segment_csr_backward_kernel(ctx, grad_out, src, indptr, reduce, grad_src);
    });

OPBRIDGE_OP(segment_csr)
    .doc("Reduces each segment of rows of src (torch_scatter's segment_csr): sum, mean, min or max of rows "
         "indptr[s] .. indptr[s + 1], an empty segment 0.")
    .with(csr_signature)
    .string_attr("reduce", "sum", "\"sum\", \"mean\", \"min\" or \"max\"")
    .check(dim("indptr", 0) >= 1, "indptr must hold at least one boundary")
    .output("out", "T", csr_rows(), "(s, f)")
    .cpu(segment_csr_kernel)
    .backward("segment_csr_backward");

OPBRIDGE_OP(arg_reduce_backward)
    .doc("The gradient of segment_csr_arg, scatter_reduce_arg and segment_coo_arg with respect to src: each value's "
         "gradient to the row it came from.")
    .types("T", kValues)
    .types("A", {DType::Int64})
    .input("grad_out", "T", "(s, f) gradient of out", 2)
    .input("src", "T", "(n, f) the forward's rows", 2)
    .input("arg", "A", "(s, f) the forward's rows of each value", 2)
    .string_attr("reduce", "max", "the forward's reduction")
    .check(dim("arg", 0) == dim("grad_out", 0), "arg must have grad_out's shape")
    .check(dim("arg", 1) == dim("grad_out", 1), "arg must have grad_out's shape")
    .check(dim("grad_out", 1) == dim("src", 1), "grad_out must have src's columns")
    .output("grad_src", "T", shape::same({"src"}), "(n, f)")
    .cpu(arg_reduce_backward_kernel);

OPBRIDGE_OP(segment_csr_arg)
    .doc("segment_csr's min or max with the row of each value (torch_scatter's segment_csr with reduce min or max, "
         "and its arg_out): an empty segment is 0 with row n.")
    .with(csr_signature)
    .string_attr("reduce", "max", "\"min\" or \"max\"")
    .check(dim("indptr", 0) >= 1, "indptr must hold at least one boundary")
    .output("out", "T", csr_rows(), "(s, f)")
    .output("arg", DType::Int64, csr_rows(), "(s, f) the row of src each value came from; n for an empty segment")
    .cpu(segment_csr_arg_kernel)
    .backward("arg_reduce_backward");

OPBRIDGE_OP(scatter_reduce_backward)
    .doc("The gradient of scatter_reduce and segment_coo with respect to src.")
    .with(scatter_signature)
    .input("grad_out", "T", "(dim_size, f) gradient of out", 2)
    .string_attr("reduce", "sum", "the forward's reduction")
    .check(dim("grad_out", 0) == attr("dim_size"), "grad_out must have dim_size rows")
    .check(dim("grad_out", 1) == dim("src", 1), "grad_out must have src's columns")
    .output("grad_src", "T", shape::same({"src"}), "(n, f)")
    .cpu(+[](KernelContext& ctx, const TensorView& src, const TensorView& index, const TensorView& grad_out,
             int64_t dim_size, const std::string& reduce, TensorView& grad_src) {
      scatter_reduce_backward_kernel(ctx, grad_out, src, index, dim_size, reduce, grad_src);
    });

OPBRIDGE_OP(scatter_reduce)
    .doc("Reduces the rows of src that index sends to each output row (torch_scatter's scatter along the rows): "
         "sum, mean, min or max, an output row no row reaches 0.")
    .with(scatter_signature)
    .string_attr("reduce", "sum", "\"sum\", \"mean\", \"min\" or \"max\"")
    .output("out", "T", scatter_rows(), "(dim_size, f)")
    .cpu(scatter_reduce_kernel)
    .backward("scatter_reduce_backward");

OPBRIDGE_OP(scatter_reduce_arg)
    .doc("scatter_reduce's min or max with the row of each value (torch_scatter's scatter_min / scatter_max): an "
         "output row no row reaches is 0 with row n.")
    .with(scatter_signature)
    .string_attr("reduce", "max", "\"min\" or \"max\"")
    .output("out", "T", scatter_rows(), "(dim_size, f)")
    .output("arg", DType::Int64, scatter_rows(), "(dim_size, f) the row of src each value came from; n if none")
    .cpu(scatter_reduce_arg_kernel)
    .backward("arg_reduce_backward");

OPBRIDGE_OP(segment_coo)
    .doc("Reduces the rows of src that a sorted index sends to each output row (torch_scatter's segment_coo): sum, "
         "mean, min or max, an output row no row reaches 0.")
    .with(scatter_signature)
    .string_attr("reduce", "sum", "\"sum\", \"mean\", \"min\" or \"max\"")
    .output("out", "T", scatter_rows(), "(dim_size, f)")
    .cpu(segment_coo_kernel)
    .backward("scatter_reduce_backward");  // the same groups as scatter_reduce's

OPBRIDGE_OP(segment_coo_arg)
    .doc("segment_coo's min or max with the row of each value (torch_scatter's segment_coo with reduce min or max, "
         "and its arg_out): an output row no row reaches is 0 with row n.")
    .with(scatter_signature)
    .string_attr("reduce", "max", "\"min\" or \"max\"")
    .output("out", "T", scatter_rows(), "(dim_size, f)")
    .output("arg", DType::Int64, scatter_rows(), "(dim_size, f) the row of src each value came from; n if none")
    .cpu(segment_coo_arg_kernel)
    .backward("arg_reduce_backward");

}  // namespace opbridge
