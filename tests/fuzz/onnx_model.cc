#include "onnx_model.h"

#include <cstring>

namespace opbridge::fuzz {
namespace {

// Protobuf wire format: a key is (field << 3) | wire type; 0 varint, 2 length-delimited, 5 fixed32.
class Writer {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire) { varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
  void int_field(int field, int64_t v) {  // int32/int64/enum: negative values as 10-byte varints
    key(field, 0);
    varint(static_cast<uint64_t>(v));
  }
  void bytes_field(int field, const std::string& v) {
    key(field, 2);
    varint(v.size());
    out_ += v;
  }
  void float_field(int field, float v) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &v, 4);
    out_.append(b, 4);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

std::string attribute(const OnnxAttr& a) {
  // AttributeProto: name 1, f 2, i 3, s 4, t 5, floats 7, ints 8, strings 9, type 20.
  Writer w;
  w.bytes_field(1, a.name);
  switch (a.type) {
    case OnnxAttrType::Float: w.float_field(2, a.f); break;
    case OnnxAttrType::Int: w.int_field(3, a.i); break;
    case OnnxAttrType::String: w.bytes_field(4, a.s); break;
    case OnnxAttrType::Tensor: {  // TensorProto: dims 1, data_type 2, raw_data 9 — a float scalar
      Writer t;
      t.int_field(2, 1);
      std::string raw(4, '\0');
      std::memcpy(raw.data(), &a.f, 4);
      t.bytes_field(9, raw);
      w.bytes_field(5, t.str());
      break;
    }
    case OnnxAttrType::Floats:
      for (float f : a.floats) w.float_field(7, f);
      break;
    case OnnxAttrType::Ints:
      for (int64_t i : a.ints) w.int_field(8, i);
      break;
    case OnnxAttrType::Strings:
      for (const std::string& s : a.strings) w.bytes_field(9, s);
      break;
  }
  w.int_field(20, static_cast<int>(a.type));
  return w.str();
}

std::string value_info(const OnnxValueInfo& v) {
  // ValueInfoProto: name 1, type 2; TypeProto: tensor_type 1; Tensor: elem_type 1, shape 2;
  // TensorShapeProto: dim 1; Dimension: dim_value 1.
  Writer tensor;
  tensor.int_field(1, v.elem_type);
  if (v.has_shape) {
    Writer shape;
    for (int64_t d : v.dims) {
      Writer dim;
      dim.int_field(1, d);
      shape.bytes_field(1, dim.str());
    }
    tensor.bytes_field(2, shape.str());
  }
  Writer type;
  type.bytes_field(1, tensor.str());
  Writer w;
  w.bytes_field(1, v.name);
  w.bytes_field(2, type.str());
  return w.str();
}

}  // namespace

std::string serialize(const OnnxNodeModel& m) {
  // NodeProto: input 1, output 2, name 3, op_type 4, attribute 5, domain 7.
  Writer node;
  for (const std::string& s : m.node_inputs) node.bytes_field(1, s);
  for (const std::string& s : m.node_outputs) node.bytes_field(2, s);
  node.bytes_field(3, m.node_name);
  node.bytes_field(4, m.op_type);
  for (const OnnxAttr& a : m.attrs) node.bytes_field(5, attribute(a));
  node.bytes_field(7, m.domain);
  // GraphProto: node 1, name 2, input 11, output 12.
  Writer graph;
  graph.bytes_field(1, node.str());
  graph.bytes_field(2, "fuzz");
  for (const OnnxValueInfo& v : m.graph_inputs) graph.bytes_field(11, value_info(v));
  for (const OnnxValueInfo& v : m.graph_outputs) graph.bytes_field(12, value_info(v));
  // ModelProto: ir_version 1, producer_name 2, graph 7, opset_import 8 (domain 1, version 2).
  Writer model;
  model.int_field(1, 8);
  model.bytes_field(2, "opbridge_fuzz");
  model.bytes_field(7, graph.str());
  for (auto [domain, version] : {std::pair<std::string, int>{"", m.ai_onnx_opset}, {m.domain, m.domain_version}}) {
    Writer opset;
    opset.bytes_field(1, domain);
    opset.int_field(2, version);
    model.bytes_field(8, opset.str());
  }
  return model.str();
}

}  // namespace opbridge::fuzz
