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
using KernelFn = void (*)(KernelContext&);

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
};

// ---- dimension expressions (shape rules) ---------------------------------------------------
// A tiny expression tree over input dimensions, int attributes and constants. It is data, not
// code, so the same rule is evaluated on concrete sizes (kernels, ONNX Runtime) and on symbolic
// sizes (PyTorch's Meta kernel under torch.export), see shape_infer.h.
struct DimNode;
struct DimExpr {
  std::shared_ptr<const DimNode> node;
  std::string str() const;
};
struct DimNode {
  enum class Kind : int8_t { Const, Dim, Attr, AttrAt, Add, Sub, Mul, FloorDiv };
  explicit DimNode(Kind k) : kind(k) {}
  Kind kind;
  int64_t value = 0;                // Const: the value; Dim: the axis; AttrAt: the element
  std::vector<std::string> inputs;  // Dim: first present of these inputs (optional fallbacks)
  std::string attr;                 // Attr, AttrAt
  DimExpr lhs, rhs;                 // binary ops
};

DimExpr dim(std::string input, int64_t axis);
// Axis `axis` of the first of `inputs` that is present: for optional inputs with a fallback,
// e.g. dim_of_first({"new_xyz", "xyz"}, 0).
DimExpr dim_of_first(std::vector<std::string> inputs, int64_t axis);
DimExpr attr(std::string name);
DimExpr attr_at(std::string name, int64_t index);
DimExpr constant(int64_t v);
DimExpr operator+(DimExpr a, DimExpr b);
DimExpr operator-(DimExpr a, DimExpr b);
DimExpr operator*(DimExpr a, DimExpr b);
DimExpr operator/(DimExpr a, DimExpr b);  // floor division
inline DimExpr operator+(DimExpr a, int64_t b) { return a + constant(b); }
inline DimExpr operator-(DimExpr a, int64_t b) { return a - constant(b); }
inline DimExpr operator*(DimExpr a, int64_t b) { return a * constant(b); }
inline DimExpr operator/(DimExpr a, int64_t b) { return a / constant(b); }

// lhs == rhs must hold, else `what` is the error.
struct DimCheck {
  DimExpr lhs, rhs;
  std::string what;
};
inline DimCheck operator==(DimExpr a, DimExpr b) { return {std::move(a), std::move(b), {}}; }
inline DimCheck operator==(DimExpr a, int64_t b) { return {std::move(a), constant(b), {}}; }

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
};

// How the exporters write the op into an ONNX graph.
struct ExportSpec {
  enum class Kind : int8_t {
    Custom,    // a node of the library's domain, run by the opbridge ONNX Runtime library
    Standard,  // a standard ai.onnx op (e.g. an ATen op with a missing or replaced mapping)
  } kind = Kind::Custom;
  std::string onnx_domain;  // Custom: the library's domain; Standard: "" (ai.onnx)
  std::string onnx_name;    // Custom: CamelCase of the op name unless set
  int since_version = 1;    // Custom: the op's version in its domain; Standard: minimum opset
};

struct OpSpec {
  std::string name;        // snake_case; the PyTorch name inside the library's namespace
  std::string doc;
  std::string torch_op;    // set for ops PyTorch already has ("aten::<name>"): nothing is defined
  std::vector<TypeConstraint> types;
  std::vector<InputSpec> inputs;
  std::vector<AttrSpec> attrs;
  std::vector<OutputSpec> outputs;
  std::vector<DimCheck> checks;
  ExportSpec export_as;
  KernelFn cpu_kernel = nullptr;

  const TypeConstraint& type(const std::string& name) const;
  int input_index(std::string_view name) const;  // -1 when absent
  int attr_index(std::string_view name) const;
  bool defines_torch_op() const { return torch_op.empty(); }
  std::string qualified_name() const;  // "<namespace>::<name>" or torch_op
};

// "knn_query" -> "KnnQuery": the rule that names every custom ONNX op.
std::string camel_case(std::string_view snake);

}  // namespace opbridge
