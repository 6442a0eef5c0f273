// One fuzz case: a node of one op (inputs with dtypes, shapes and values, attributes as the
// ONNX node holds them, the node's output count), generated from the op's spec alone — its
// type constraints, input ranks, attributes with defaults, shape rules and dimension checks —
// and a seed. No op is named here: every op with a kernel gets the same treatment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <opbridge/op_spec.h>

#include "onnx_model.h"

namespace opbridge::fuzz {

// ONNX TensorProto.DataType values the fuzzer writes (opbridge's six and a few it never takes).
namespace onnx_type {
inline constexpr int Float = 1, UInt8 = 2, Int8 = 3, UInt16 = 4, Int16 = 5, Int32 = 6, Int64 = 7, Bool = 9,
                     Float16 = 10, Double = 11, BFloat16 = 16;
}
int onnx_type_of(DType t);
std::optional<DType> dtype_of_onnx(int onnx_type);
size_t onnx_type_size(int onnx_type);
std::string onnx_type_name(int onnx_type);

struct InputCase {
  bool present = true;  // false: omitted (written as "" unless trailing inputs are left off)
  int onnx_type = onnx_type::Float;
  Shape shape;
  std::unique_ptr<std::byte[]> data;  // exactly numel * size bytes (new[0] for an empty tensor)
  size_t nbytes = 0;
  std::string values;                 // how the values were made, for the description
  int64_t numel() const;
  void allocate();                    // data for `shape` and `onnx_type`
};

struct Case {
  uint64_t seed = 0;
  const OpSpec* op = nullptr;
  std::vector<InputCase> inputs;       // the node's inputs: op.inputs in order, then any extra ones
  bool drop_trailing_omitted = false;  // omitted trailing inputs are left off the node, not ""
  std::vector<OnnxAttr> attrs;         // as written to the node
  int node_outputs = 0;
  std::vector<std::string> mutations;  // what makes the case unusual; empty: valid by construction
  bool structural = false;             // arity or dtypes changed: ONNX Runtime's own checks may refuse it
  bool from_forward = false;           // a backward op's inputs made by running its forward (valid)

  std::string describe() const;        // one line: op, inputs, attributes, mutations
  OnnxNodeModel model() const;
};

// The case for `seed` (every random choice comes from it).
Case generate_case(const OpSpec& op, uint64_t seed);

// The attributes as the ORT adapter reads them from the node, by spec attribute name; an entry
// the adapter would refuse (wrong kind) makes `error` non-empty. Attributes the spec does not
// know are ignored, as ONNX Runtime does.
struct ReadAttrs {
  std::map<std::string, AttrValue> given;
  std::string error;
};
ReadAttrs read_attrs(const Case& c);

}  // namespace opbridge::fuzz
