// What an op file includes: the builder that writes an OpSpec, the kernel context, and the
// registration macro. See docs/adding-an-op.md.
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>
#include <string>
#include <utility>

#include "opbridge/kernel_context.h"
#include "opbridge/op_spec.h"
#include "opbridge/registry.h"

namespace opbridge {

// An export rule (see ExportRule): ExportTo("DeformConv", 19).attr("pads", {"padding", "padding"}).
class ExportTo {
 public:
  // A standard ai.onnx op, from `min_opset` on.
  ExportTo(std::string onnx_type, int min_opset);
  // The own node of an opbridge op, from `min_opset` on: "<op>" (an op of this library) or
  // "<namespace>::<op>" (an op of any opbridge library, by its PyTorch namespace).
  static ExportTo opbridge_op(std::string op_name, int min_opset = 1);
  // A node `op_type` of another domain that a runtime implements, e.g. node("com.microsoft",
  // "BiasGelu") for ONNX Runtime's contrib op, or a vendor runtime's op.
  static ExportTo node(std::string domain, std::string op_type, int min_opset = 1);
  // The target takes this op's type constraint `type` in these dtypes only (in ONNX Runtime);
  // for other dtypes the op's own node is written instead. E.g. for a standard op that ONNX
  // Runtime implements for float32 only: .target_types("T", {DType::Float32}).
  ExportTo& target_types(std::string type, std::initializer_list<DType> dtypes);
  // The target runs much slower in ONNX Runtime than this op's own kernel (`why`, with figures):
  // exports for ONNX Runtime keep the op's own node, and the rule is written only for a portable
  // model (opbridge.export(..., portable=True)), which runs without opbridge's library.
  ExportTo& portable_only(std::string why);
  // The target's inputs in order, as this op's input names; "" for an empty slot.
  ExportTo& inputs(std::vector<std::string> names);
  // Writes `input` only when this op's bool attribute `flag` is true (else an empty slot).
  ExportTo& input_when(std::string input, std::string flag);
  // Target attribute `name` = this op's attributes `from`, concatenated into a list when several.
  ExportTo& attr(std::string name, std::vector<std::string> from);
  ExportTo& attr_int(std::string name, int64_t v);
  ExportTo& attr_float(std::string name, double v);
  ExportTo& attr_string(std::string name, std::string v);
  ExportRule build() &&;

  // Out of line, like every member above (core/src/op.cc): each op's source then compiles calls
  // only, not its own copy of the builder and the spec's members.
  ExportTo(const ExportTo&);
  ExportTo(ExportTo&&) noexcept;
  ExportTo& operator=(const ExportTo&);
  ExportTo& operator=(ExportTo&&) noexcept;
  ~ExportTo();

 private:
  ExportTo& add(ExportAttr a);
  ExportRule rule_;
};

class OpBuilder {
 public:
  explicit OpBuilder(std::string name);
  // Out of line, like every member below but the templates (core/src/op.cc): each op's source
  // then compiles calls only, not its own copy of the builder and the spec's members.
  OpBuilder(const OpBuilder&);
  OpBuilder(OpBuilder&&) noexcept;
  OpBuilder& operator=(const OpBuilder&);
  OpBuilder& operator=(OpBuilder&&) noexcept;
  ~OpBuilder();

  OpBuilder& doc(std::string d);
  // A named type variable: inputs and outputs that name it share one dtype at run time.
  OpBuilder& types(std::string name, std::initializer_list<DType> allowed);
  OpBuilder& input(std::string name, std::string type, std::string doc, int rank = -1);
  // Optional inputs come last; an absent one may be replaced by another input in shape rules
  // (dim_of_first({"new_xyz", "xyz"}, 0)) and is seen as absent by the kernel.
  OpBuilder& optional_input(std::string name, std::string type, std::string doc, int rank = -1);
  // Attributes, typed so that a literal default can never pick the wrong kind.
  OpBuilder& int_attr(std::string name, std::string doc);
  OpBuilder& int_attr(std::string name, int64_t def, std::string doc);
  // An int attribute that models compute from input sizes (npoint = N // 4): exported as a graph
  // value (a trailing input of the node) when the exporter sees it computed, so the model stays
  // right at every size; see AttrSpec::symbolic.
  OpBuilder& sym_int_attr(std::string name, std::string doc);
  OpBuilder& sym_int_attr(std::string name, int64_t def, std::string doc);
  OpBuilder& float_attr(std::string name, std::string doc);
  OpBuilder& float_attr(std::string name, double def, std::string doc);
  OpBuilder& ints_attr(std::string name, std::string doc);
  OpBuilder& ints_attr(std::string name, std::vector<int64_t> def, std::string doc);
  OpBuilder& floats_attr(std::string name, std::string doc);
  OpBuilder& floats_attr(std::string name, std::vector<double> def, std::string doc);
  OpBuilder& bool_attr(std::string name, bool def, std::string doc);
  OpBuilder& string_attr(std::string name, std::string def, std::string doc);
  OpBuilder& output(std::string name, std::string type, ShapeRule shape, std::string doc);
  // An output with a fixed dtype (e.g. int32 indices) gets a type constraint of its own.
  OpBuilder& output(std::string name, DType dtype, ShapeRule shape, std::string doc);
  OpBuilder& check(DimCheck c, std::string what);
  // The CPU kernel: void kernel(KernelContext& ctx, <the op's inputs, attributes and outputs, in
  // order>), each parameter typed by what it takes (see KernelParam in kernel_context.h):
  //   const TensorView& (input), const TensorView* (optional input, nullptr when absent),
  //   int64_t, double, bool, const std::string&, const std::vector<int64_t>&,
  //   const std::vector<double>& (attributes of those kinds), TensorView& (output).
  // A parameter of another type does not compile; one that does not fit the op's signature (too
  // many or too few, or the wrong kind at a position) fails when the library registers, naming
  // the op and the argument.
  template <typename... Args>
  OpBuilder& cpu(void (*kernel)(KernelContext&, Args...)) {
    return cpu_kernel(bind_kernel(kernel));
  }
  // The gradient: `op` is another op of this library whose arguments are named after this op's:
  // inputs grad_<output> (the incoming gradient of an output), <input> or <output> (a forward
  // value it needs, saved by autograd), attributes of the same name as this op's; outputs
  // grad_<input> for each input it differentiates (others get no gradient). A gradient of a
  // broadcast input's shape is summed down to it by the glue. Integer outputs are not
  // differentiable.
  OpBuilder& backward(std::string op);
  // The outputs are random when the bool attribute `attr` is true (e.g. a random start point):
  // checks that compare two runs, or two runtimes, compare dtypes and shapes only there.
  OpBuilder& random_when(std::string attr);
  // Adds what several ops declare alike (e.g. the attributes and checks an op shares with its
  // backward op): `declare(builder)` is called here, in the chain's order.
  template <typename Fn>
  OpBuilder& with(Fn&& declare) {
    declare(*this);
    return *this;
  }

  // Export as a standard ai.onnx op from `min_opset` on, inputs and attributes as they are; an
  // op with a kernel keeps its own node below that opset (and on request, see opbridge.export).
  OpBuilder& export_standard(std::string onnx_type, int min_opset);
  // Export as another op, with inputs and attributes mapped: see ExportTo.
  OpBuilder& export_as(ExportTo rule);
  // Export as an ONNX function in the library's domain, needing ai.onnx `min_opset`: the body is
  // ONNX textual syntax over the op's input and output names, e.g. "y = Relu (x)".
  OpBuilder& export_function(int min_opset, std::string body);
  // A Python-level operator that model code calls for this op, e.g.
  //   .replaces("package.ops.Pooling", {"size", "", "x"})
  // for `class Pooling(Function): def forward(ctx, size, step, x)`: each of the
  // target's parameters (without ctx or self) names the input or attribute it binds, or is ""
  // (not needed). `fixed` sets attributes to what the target's semantics pin down. See
  // PythonOperator; the target must return what this op returns, or the outputs named in
  // `returns` (one name: that tensor alone).
  OpBuilder& replaces(std::string target, std::vector<std::string> params,
                      std::vector<std::pair<std::string, AttrValue>> fixed = {},
                      std::vector<std::string> returns = {});
  // The op already exists in PyTorch ("aten::<name>", or another library's op): opbridge
  // defines nothing in PyTorch and only adds its export rules.
  OpBuilder& existing_torch_op(std::string qualified);
  // The op's own ONNX node: type `onnx_type` in `domain` (the library's if empty) at domain
  // version `version`, instead of CamelCase of the name in the library's domain; e.g. a node a
  // vendor runtime already implements ("cstDualResidual", "rknn_cst"). The ONNX Runtime library
  // registers the kernel under that name.
  OpBuilder& onnx_node(std::string onnx_type, std::string domain = "", int version = 1);

  OpSpec build() &&;

 private:
  OpBuilder& cpu_kernel(Kernel k);
  OpBuilder& attr(std::string name, AttrKind kind, std::optional<AttrValue> def, std::string doc, bool symbolic = false);
  OpSpec spec_;
};

struct OpRegistrar {
  OpRegistrar(OpBuilder& b);  // NOLINT: implicit by design
};

}  // namespace opbridge

#define OB_CONCAT_INNER(a, b) a##b
#define OB_CONCAT(a, b) OB_CONCAT_INNER(a, b)
// Registers an op when the library loads. init_priority makes every op registration run before
// the adapters' own static initialisers (which read the registry), whatever the link order.
#define OPBRIDGE_OP(NAME)                                                            \
  static ::opbridge::OpRegistrar OB_CONCAT(ob_op_registrar_, __COUNTER__)           \
      __attribute__((init_priority(200))) = ::opbridge::OpBuilder(#NAME)
