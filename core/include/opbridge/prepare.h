// The generic front half of every kernel call, shared by all adapters: check dtypes and
// attributes against the spec, then derive each output's dtype and shape from the spec's rules.
#pragma once

#include <optional>
#include <vector>

#include "opbridge/op_spec.h"
#include "opbridge/tensor_view.h"

namespace opbridge {

// Picks one dtype per type constraint from the present inputs; throws on a dtype outside the
// constraint or on two inputs of one constraint that disagree. Returns one dtype per
// constraint (a constraint no present input names keeps its first allowed dtype).
std::vector<DType> resolve_types(const OpSpec& op, const std::vector<std::optional<DType>>& input_dtypes);
std::vector<DType> output_dtypes(const OpSpec& op, const std::vector<DType>& resolved);
// The same, into `out` (its storage reused).
void resolve_types(const OpSpec& op, const std::vector<std::optional<DType>>& input_dtypes, std::vector<DType>& out);
void output_dtypes(const OpSpec& op, const std::vector<DType>& resolved, std::vector<DType>& out);

// Fills defaults, rejects missing required attributes and wrong kinds. `given[i]` is the value
// the caller found for op.attrs[i], if any.
std::vector<AttrValue> resolve_attrs(const OpSpec& op, std::vector<std::optional<AttrValue>> given);

struct PreparedCall {
  std::vector<DType> output_dtypes;
  std::vector<Shape> output_shapes;
  // Working storage: a PreparedCall reused from call to call allocates nothing once warm.
  std::vector<std::optional<DType>> input_dtypes;
  std::vector<const Shape*> input_shapes;
  std::vector<DType> resolved;
  // The key of the last call that passed: a call of the same op with the same input dtypes,
  // shapes and attributes has that call's output dtypes and shapes, so the rules are not run
  // again. ONNX Runtime runs a node (and a chain of like nodes) with the same shapes run after
  // run: for a small op the rules were a fifth of the adapter's per-call work.
  const OpSpec* last_op = nullptr;
  std::vector<std::optional<DType>> last_dtypes;
  std::vector<Shape> last_shapes;  // an absent input's is empty (its dtype says it is absent)
  std::vector<AttrValue> last_attrs;
};

// inputs[i] is nullptr for an absent optional input. Throws Error (without the op's name).
PreparedCall prepare_call(const OpSpec& op, const std::vector<const TensorView*>& inputs,
                          const std::vector<AttrValue>& attrs);
// The same, into `call`, reusing its storage.
void prepare_call(const OpSpec& op, const std::vector<const TensorView*>& inputs, const std::vector<AttrValue>& attrs,
                  PreparedCall& call);

}  // namespace opbridge
