// The one definition of an operator. Everything else — the PyTorch schema, the Meta kernel,
// the ONNX schema, the ONNX Runtime custom op, the export rules — is derived from an OpSpec by
// generic code. Ops are written with OpBuilder (see op.h) and land in the registry.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "opbridge/dtype.h"
#include "opbridge/tensor_view.h"

namespace opbridge {

class KernelContext;

// ---- attributes -----------------------------------------------------------------------------
// Float attributes are float32 on the wire (ONNX AttributeProto.f); the PyTorch adapter rounds
// its double to float32 too, so eager and ONNX Runtime compute with the same value.
enum class AttrKind : int8_t { Int, Float, Ints, Floats, String, Bool };
using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::vector<double>, std::string, bool>;
std::string_view attr_kind_name(AttrKind k);  // "int", "float", "int[]", ...
AttrKind attr_kind_of(const AttrValue& v);

struct AttrSpec {
  std::string name;
  AttrKind kind;
  std::optional<AttrValue> default_value;  // nullopt: required
  std::string doc;
  // An int attribute that models compute from input sizes (FPS's npoint = N // 4): PyTorch types
  // it SymInt, so torch.export keeps the size symbolic, and an ONNX node may give it as an int64
  // scalar input after the op's own inputs ("<name>_value") instead of the attribute.
  bool symbolic = false;
};

// ---- dimension expressions (shape rules) ---------------------------------------------------
// A tiny expression tree over input dimensions, int attributes and constants. It is data, not
// code, so the same rule is evaluated on concrete sizes (kernels, ONNX Runtime) and on symbolic
// sizes (PyTorch's Meta kernel under torch.export), see shape_infer.h.
struct DimNode;
struct DimExpr {
  DimExpr() = default;
  explicit DimExpr(std::shared_ptr<const DimNode> n) : node(std::move(n)) {}
  // An integer is a constant: shape::dims({dim("x", 0), 3}) (as constant(3)).
  DimExpr(int64_t v);  // NOLINT(google-explicit-constructor)
  DimExpr(int v) : DimExpr(static_cast<int64_t>(v)) {}  // NOLINT(google-explicit-constructor)
  std::shared_ptr<const DimNode> node;
  std::string str() const;
};
struct DimNode {
  enum class Kind : int8_t { Const, Dim, Attr, AttrAt, Add, Sub, Mul, FloorDiv, Data };
  explicit DimNode(Kind k) : kind(k) {}
  Kind kind;
  int64_t value = 0;                // Const: the value; Dim: the axis; AttrAt: the element
  std::vector<std::string> inputs;  // Dim: first present of these inputs (optional fallbacks)
  std::string name;                 // Attr, AttrAt: the attribute; Data: the size's name ("": its own)
  DimExpr lhs, rhs;                 // binary ops
};

DimExpr dim(std::string input, int64_t axis);
// Axis `axis` of the first of `inputs` that is present: for optional inputs with a fallback,
// e.g. dim_of_first({"new_xyz", "xyz"}, 0).
DimExpr dim_of_first(std::vector<std::string> inputs, int64_t axis);
DimExpr attr(std::string name);
DimExpr attr_at(std::string name, int64_t index);
DimExpr constant(int64_t v);
// A size only the kernel knows (it depends on input values: Resize's run-time scales, the number
// of neighbour pairs found). It stands alone as an output dimension. The kernel allocates such an
// output itself (KernelContext::allocate_output); under torch.export and torch.compile the size is
// an unbacked SymInt, in an exported ONNX model a symbolic dimension. Outputs that name the same
// size (data_dependent("pairs")) share it: one symbol in PyTorch, and the kernel must give them
// the same value; an unnamed one is a size of its own.
DimExpr data_dependent(std::string name = "");
// The placeholder for a data-dependent size in concrete shapes, until the kernel allocates.
inline constexpr int64_t kDataDependentDim = -1;
DimExpr operator+(DimExpr a, DimExpr b);
DimExpr operator-(DimExpr a, DimExpr b);
DimExpr operator*(DimExpr a, DimExpr b);
DimExpr operator/(DimExpr a, DimExpr b);  // floor division
inline DimExpr operator+(DimExpr a, int64_t b) { return a + constant(b); }
inline DimExpr operator-(DimExpr a, int64_t b) { return a - constant(b); }
inline DimExpr operator*(DimExpr a, int64_t b) { return a * constant(b); }
inline DimExpr operator/(DimExpr a, int64_t b) { return a / constant(b); }

// lhs == rhs (or >=, >, <=, <) must hold, else `what` is the error. Checked on concrete sizes in eager
// and ONNX Runtime; PyTorch's Meta kernel checks what its symbolic sizes decide (== always, an
// inequality when both sides are known), so a bad attribute fails at export already.
struct DimCheck {
  enum class Rel : int8_t { Eq, Ge, Gt, Le, Lt };
  DimExpr lhs, rhs;
  std::string what;
  Rel rel = Rel::Eq;
  std::string str() const;  // "k >= 1"
};
inline DimCheck operator==(DimExpr a, DimExpr b) { return {std::move(a), std::move(b), {}, DimCheck::Rel::Eq}; }
inline DimCheck operator==(DimExpr a, int64_t b) { return std::move(a) == constant(b); }
inline DimCheck operator>=(DimExpr a, DimExpr b) { return {std::move(a), std::move(b), {}, DimCheck::Rel::Ge}; }
inline DimCheck operator>=(DimExpr a, int64_t b) { return std::move(a) >= constant(b); }
inline DimCheck operator>(DimExpr a, DimExpr b) { return {std::move(a), std::move(b), {}, DimCheck::Rel::Gt}; }
inline DimCheck operator>(DimExpr a, int64_t b) { return std::move(a) > constant(b); }
inline DimCheck operator<=(DimExpr a, DimExpr b) { return {std::move(a), std::move(b), {}, DimCheck::Rel::Le}; }
inline DimCheck operator<=(DimExpr a, int64_t b) { return std::move(a) <= constant(b); }
inline DimCheck operator<(DimExpr a, DimExpr b) { return {std::move(a), std::move(b), {}, DimCheck::Rel::Lt}; }
inline DimCheck operator<(DimExpr a, int64_t b) { return std::move(a) < constant(b); }

struct ShapeRule {
  enum class Kind : int8_t { Broadcast, Same, Dims } kind = Kind::Dims;
  std::vector<std::string> inputs;  // Broadcast / Same: the inputs combined
  std::vector<DimExpr> dims;        // Dims: one expression per output axis
  std::string str() const;
};
namespace shape {
// numpy broadcasting of the named inputs.
ShapeRule broadcast(std::vector<std::string> inputs);
// All named inputs must have exactly the same shape; the output has it too.
ShapeRule same(std::vector<std::string> inputs);
ShapeRule dims(std::vector<DimExpr> dims);
}  // namespace shape

// ---- inputs, outputs, export ----------------------------------------------------------------
struct TypeConstraint {
  std::string name;  // "T"; outputs with a fixed dtype get one of their own
  std::vector<DType> allowed;
};

struct InputSpec {
  std::string name;
  std::string type;  // a TypeConstraint name
  std::string doc;
  bool optional = false;
  int rank = -1;     // -1: any rank
};

struct OutputSpec {
  std::string name;
  std::string type;
  std::string doc;
  ShapeRule shape;
  bool data_dependent() const;  // some dimension is data_dependent()
};

// How the exporters write the op into an ONNX graph. An op with a CPU kernel is exported as its
// own node (by default in its library's domain, run by the library's ONNX Runtime custom op)
// unless a rule below applies; an op without one needs a rule or a function body.
//
// A rule writes the op as another node, from ai.onnx opset `min_opset` on:
//   Standard  a standard ai.onnx op (DeformConv from 19, Resize from 13);
//   OpbridgeOp the own node of an opbridge op: of this library, or of another opbridge library
//             named by its PyTorch namespace ("<namespace>::<op>"), resolved by the export glue
//             once both are loaded. This is how an existing PyTorch op of another library
//             (torchvision's, torch_cluster's) is exported as an opbridge node;
//   Node      a node of any other domain that some runtime implements (ONNX Runtime's
//             com.microsoft contrib ops, a vendor runtime's ops), spelled as given.
// Inputs and attributes are mapped by name, so the two signatures need not agree. A rule may
// state the dtypes its target takes in the runtime (target_types); for others the op's own node
// is written instead.
struct ExportInput {
  std::string name;  // an input of this op; "" writes an empty (omitted) slot
  std::string when;  // a bool attribute of this op; the input is written only when it is true
};
struct ExportAttr {
  std::string name;               // the target op's attribute
  std::vector<std::string> from;  // this op's attributes, concatenated (scalars and lists) ...
  std::optional<AttrValue> value; // ... or a constant
  AttrKind kind = AttrKind::Int;  // filled in by validate_spec
};
struct ExportRule {
  enum class Target : int8_t { Standard, OpbridgeOp, Node };
  Target target = Target::Standard;
  std::string op_type;            // Standard, Node: the ONNX op type; OpbridgeOp: the op's snake_case name
  std::string library;            // OpbridgeOp: the op's PyTorch namespace ("": this library)
  std::string domain;             // Node: the ONNX domain
  int min_opset = 1;              // ai.onnx opset version from which the rule applies
  std::vector<ExportInput> inputs;  // empty: this op's inputs, in order (filled in by resolve_export)
  std::vector<ExportInput> conditions;  // input_when(input, flag), applied to `inputs` by resolve_export
  std::vector<ExportAttr> attrs;    // empty: this op's attributes as they are
  bool maps_attrs = false;          // true once an attribute mapping is given (even to none)
  // Type constraint of this op -> the dtypes the target takes for it in the runtime; empty: all.
  std::vector<TypeConstraint> target_types;
  // Set when the target is much slower in ONNX Runtime than the op's own kernel: the rule is
  // then written only for portable models (opbridge.export(..., portable=True)); this says why.
  std::string portable_only;
  // The node the rule writes: ("", op_type) for ai.onnx, (domain, op_type) for Node. An opbridge
  // op's node is found by the export glue, which sees every loaded library.
  std::string target_domain, target_type;
  // OpbridgeOp: "<namespace>::<op>", the op whose own node is written.
  std::string opbridge_op() const;
};

struct ExportSpec {
  std::string onnx_name;          // the op's own ONNX type: CamelCase of the op name unless set
  std::string onnx_domain;        // its domain: the library's unless set
  int onnx_version = 0;           // the domain version of its schema: the library's unless set
  std::vector<ExportRule> rules;  // by ascending min_opset
  // An ONNX function (FunctionProto, in the library's domain) instead of a kernel: the body in
  // ONNX's textual syntax (onnx.parser), over the op's input and output names.
  std::string function_body;
  int function_opset = 0;         // ai.onnx opset the body needs at least
};

// ---- Python-level operators ----------------------------------------------------------------
// An operator that model code calls in this op's place: an autograd.Function over a compiled
// extension (often CUDA-only or not installed), a module's function, a class's method. Inside
// opbridge.substitutions() — which opbridge.export enters — its calls run this op instead (see
// OpBuilder::replaces). Its parameters, in order and without ctx or self, bind this op's inputs
// and attributes by name; "" marks one the op does not need (a CUDA kernel's batching step).
struct PythonOperator {
  std::string target;               // "package.module.Name", or "package.module.Class.method"
  std::vector<std::string> params;  // per parameter of the target: an input or attribute of this op, or ""
  // Attributes the target's semantics fix (a copy of a kernel that breaks ties its own way).
  std::vector<std::pair<std::string, AttrValue>> fixed;
  // The op's outputs the target returns, in order (one: that tensor alone); empty: all of them.
  std::vector<std::string> returns;
};

// ---- the kernel -----------------------------------------------------------------------------
// A kernel is a function whose parameters after the KernelContext are the op's signature in its
// order: inputs, attributes, outputs (see OpBuilder::cpu in op.h). What each parameter takes,
// recorded from its C++ type and checked against the spec when the op registers, so that no
// kernel can read an argument the op does not have, or read one as the wrong kind.
enum class ParamKind : int8_t { Input, OptionalInput, Output, Int, Float, Bool, String, Ints, Floats };
std::string_view param_type_name(ParamKind k);  // the C++ parameter type: "const TensorView&", "int64_t", ...

struct Kernel {
  using Fn = void (*)();  // the kernel function, its type erased
  Fn fn = nullptr;
  void (*call)(Fn fn, KernelContext& ctx) = nullptr;  // passes the bound arguments to fn
  std::vector<ParamKind> params;

  explicit operator bool() const { return fn != nullptr; }
  void operator()(KernelContext& ctx) const { call(fn, ctx); }
};

struct OpSpec {
  std::string name;        // snake_case; the PyTorch name inside the library's namespace
  std::string doc;
  std::string existing_torch_op;  // set for ops PyTorch already has ("aten::<name>"): nothing is defined
  std::vector<TypeConstraint> types;
  std::vector<InputSpec> inputs;
  std::vector<AttrSpec> attrs;
  std::vector<OutputSpec> outputs;
  std::vector<DimCheck> checks;
  ExportSpec export_as;
  Kernel cpu_kernel;
  // The op of this library that computes the gradient (see OpBuilder::backward); "": none.
  std::string backward;
  // A bool attribute that, when true, makes the outputs random (OpBuilder::random_when): two calls
  // on the same inputs need not agree, so tools compare only their dtypes and shapes. "": none.
  std::string random_when;
  std::vector<PythonOperator> python_operators;  // what substitution routes here

  const TypeConstraint& type(const std::string& name) const;
  int input_index(std::string_view name) const;  // -1 when absent
  int attr_index(std::string_view name) const;
  // The attributes an ONNX node may give as inputs (AttrSpec::symbolic), by attribute index, in
  // order: the node's input op.inputs.size() + k carries symbolic_attrs()[k].
  std::vector<size_t> symbolic_attrs() const;
  bool defines_torch_op() const { return existing_torch_op.empty(); }
  bool has_data_dependent_output() const;
  // The validation-only op the torch adapter defines beside an op with a data-dependent output
  // ("_check_<name>"; "" for other ops): the generic Python fake kernel calls it (manifest).
  std::string check_op() const;
  std::string qualified_name() const;  // the PyTorch op: "<namespace>::<name>", or existing_torch_op
};

// "my_op" -> "MyOp": the rule that names every custom ONNX op.
std::string camel_case(std::string_view snake);

// Throws Error naming the problem when the spec is inconsistent; used by Registry::add.
void validate_spec(const OpSpec& spec);
// Fills what the export mapping derives (the op's ONNX name, rule order, mapped attribute kinds,
// the nodes of standard-op and other runtimes' targets).
void resolve_export(OpSpec& spec);
void check_export(const OpSpec& spec);

}  // namespace opbridge
