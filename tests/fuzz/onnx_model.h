// A one-node ONNX model, written straight into protobuf wire format (ModelProto, GraphProto,
// NodeProto, ValueInfoProto, AttributeProto, TensorProto): the fuzzer needs models that the
// ONNX tooling would refuse to write (wrong attribute kinds, omitted required inputs, extra
// outputs), and ONNX Runtime's Model Editor API cannot be used for custom ops (it resolves the
// graph before the session options' custom-op domains are registered).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opbridge::fuzz {

// AttributeProto.AttributeType values.
enum class OnnxAttrType : int { Float = 1, Int = 2, String = 3, Tensor = 4, Floats = 6, Ints = 7, Strings = 8 };

struct OnnxAttr {
  std::string name;
  OnnxAttrType type = OnnxAttrType::Int;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
};

struct OnnxValueInfo {
  std::string name;
  int elem_type = 1;           // TensorProto.DataType
  bool has_shape = false;      // false: rank unknown
  std::vector<int64_t> dims;   // when has_shape
};

struct OnnxNodeModel {
  std::string op_type, domain, node_name = "fuzz_node";
  std::vector<std::string> node_inputs;   // "" for an omitted input
  std::vector<std::string> node_outputs;
  std::vector<OnnxAttr> attrs;
  std::vector<OnnxValueInfo> graph_inputs, graph_outputs;
  int domain_version = 1;
  int ai_onnx_opset = 17;
};

// The serialized ModelProto.
std::string serialize(const OnnxNodeModel& m);

}  // namespace opbridge::fuzz
