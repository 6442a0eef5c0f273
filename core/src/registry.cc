#include "opbridge/registry.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "opbridge/error.h"

namespace opbridge {

Registry& registry() {
  static Registry r;
  return r;
}

void Registry::add(OpSpec spec) {
  try {
    resolve_export(spec);
    validate_spec(spec);
    OB_CHECK(!find(spec.name), "op '", spec.name, "' is registered twice");
  } catch (const Error& e) {
    errors_.push_back("op '" + spec.name + "': " + e.what());
    std::fprintf(stderr, "opbridge: op '%s' left out: %s\n", spec.name.c_str(), e.what());
    return;
  }
  ops_.push_back(std::move(spec));
}

const OpSpec* Registry::find(std::string_view name) const {
  for (const OpSpec& op : ops_)
    if (op.name == name) return &op;
  return nullptr;
}

// ---- manifest -------------------------------------------------------------------------------
namespace {
class Json {
 public:
  std::string str() const { return os_.str(); }
  Json& raw(std::string_view s) { os_ << s; return *this; }
  Json& str(std::string_view s) {
    os_ << '"';
    for (char c : s) {
      switch (c) {
        case '"': os_ << "\\\""; break;
        case '\\': os_ << "\\\\"; break;
        case '\n': os_ << "\\n"; break;
        case '\t': os_ << "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            os_ << buf;
          } else {
            os_ << c;
          }
      }
    }
    os_ << '"';
    return *this;
  }
  Json& num(double v) {
    if (!std::isfinite(v)) return raw("null");  // JSON has no inf/nan (validate_spec rejects them)
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    os_ << buf;
    return *this;
  }
  Json& num(int64_t v) { os_ << v; return *this; }
  Json& key(std::string_view k) { return str(k).raw(":"); }

 private:
  std::ostringstream os_;
};

template <typename T, typename F>
void array(Json& j, const std::vector<T>& v, F&& each) {
  j.raw("[");
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) j.raw(",");
    each(v[i]);
  }
  j.raw("]");
}

void value(Json& j, const AttrValue& v) {
  switch (attr_kind_of(v)) {
    case AttrKind::Int: j.num(std::get<int64_t>(v)); break;
    case AttrKind::Float: j.num(std::get<double>(v)); break;
    case AttrKind::Ints: array(j, std::get<std::vector<int64_t>>(v), [&](int64_t x) { j.num(x); }); break;
    case AttrKind::Floats: array(j, std::get<std::vector<double>>(v), [&](double x) { j.num(x); }); break;
    case AttrKind::String: j.str(std::get<std::string>(v)); break;
    case AttrKind::Bool: j.raw(std::get<bool>(v) ? "true" : "false"); break;
  }
}
const char* export_kind(const OpSpec& op) {
  if (!op.export_as.function_body.empty()) return "function";
  return op.cpu_kernel ? "custom" : "standard";
}

// A rule that writes another op of this library must fit that op's signature: the ONNX schema
// registered for it would reject the node, and the two exporters would disagree on the kinds.
void check_library_target(const OpSpec& op, const ExportRule& r, const OpSpec& target) {
  auto fail = [&](const std::string& why) {
    registry().add_error("op '" + op.name + "': export rule to library op '" + target.name + "': " + why);
  };
  if (r.inputs.size() > target.inputs.size())
    fail("writes " + std::to_string(r.inputs.size()) + " inputs; the op has " + std::to_string(target.inputs.size()));
  auto check_attr = [&](const std::string& name, AttrKind kind) {
    int t = target.attr_index(name);
    if (t < 0) return fail("the op has no attribute '" + name + "'");
    if (target.attrs[t].kind != kind)
      fail("attribute '" + name + "' is " + std::string(attr_kind_name(target.attrs[t].kind)) + ", the rule writes " +
           std::string(attr_kind_name(kind)));
  };
  if (r.maps_attrs) {
    for (const ExportAttr& a : r.attrs) check_attr(a.name, a.kind);
  } else {
    for (const AttrSpec& a : op.attrs) check_attr(a.name, a.kind);
  }
}

// "export": the op's own node (custom/function) and its rules, targets resolved to ONNX names.
void export_json(Json& j, const LibraryInfo& lib, const OpSpec& op) {
  const ExportSpec& ex = op.export_as;
  j.raw(",").key("export").raw("{").key("kind").str(export_kind(op));
  j.raw(",").key("domain").str(lib.onnx_domain);
  j.raw(",").key("op_type").str(ex.onnx_name);
  j.raw(",").key("since_version").num(int64_t{lib.onnx_domain_version});
  j.raw(",").key("rules");
  array(j, ex.rules, [&](const ExportRule& r) {
    std::string domain, type = r.op_type;
    if (r.library_op) {
      const OpSpec* target = registry().find(r.op_type);
      if (!target || !target->cpu_kernel) {
        registry().add_error("op '" + op.name + "': export rule names library op '" + r.op_type +
                             "', which this library does not define with a kernel");
        type = "";
      } else {
        domain = lib.onnx_domain;
        type = target->export_as.onnx_name;
        check_library_target(op, r, *target);
      }
    }
    j.raw("{").key("domain").str(domain).raw(",").key("op_type").str(type);
    j.raw(",").key("min_opset").num(int64_t{r.min_opset});
    j.raw(",").key("inputs");
    array(j, r.inputs, [&](const ExportInput& in) { j.raw("{").key("name").str(in.name).raw(",").key("when").str(in.when).raw("}"); });
    j.raw(",").key("attributes");
    if (!r.maps_attrs) {
      array(j, op.attrs, [&](const AttrSpec& a) {
        j.raw("{").key("name").str(a.name).raw(",").key("kind").str(attr_kind_name(a.kind));
        j.raw(",").key("from").raw("[").str(a.name).raw("]}");
      });
    } else {
      array(j, r.attrs, [&](const ExportAttr& a) {
        j.raw("{").key("name").str(a.name).raw(",").key("kind").str(attr_kind_name(a.kind));
        if (a.value) {
          j.raw(",").key("value");
          value(j, *a.value);
        } else {
          j.raw(",").key("from");
          array(j, a.from, [&](const std::string& f) { j.str(f); });
        }
        j.raw("}");
      });
    }
    j.raw("}");
  });
  if (!ex.function_body.empty()) {
    j.raw(",").key("function").raw("{").key("opset").num(int64_t{ex.function_opset});
    j.raw(",").key("body").str(ex.function_body).raw("}");
  }
  j.raw("}");
}
}  // namespace

std::string manifest_json() {
  const LibraryInfo& lib = this_library();
  Json j;
  j.raw("{").key("library").str(lib.name);
  j.raw(",").key("torch_namespace").str(lib.torch_namespace);
  j.raw(",").key("onnx_domain").str(lib.onnx_domain);
  j.raw(",").key("onnx_domain_version").num(int64_t{lib.onnx_domain_version});
  j.raw(",").key("ops");
  array(j, registry().ops(), [&](const OpSpec& op) {
    j.raw("{").key("name").str(op.name);
    j.raw(",").key("torch_op").str(op.qualified_name());
    j.raw(",").key("defines_torch_op").raw(op.defines_torch_op() ? "true" : "false");
    j.raw(",").key("doc").str(op.doc);
    j.raw(",").key("has_cpu_kernel").raw(op.cpu_kernel ? "true" : "false");
    export_json(j, lib, op);
    j.raw(",").key("types");
    array(j, op.types, [&](const TypeConstraint& t) {
      j.raw("{").key("name").str(t.name).raw(",").key("dtypes");
      array(j, t.allowed, [&](DType d) { j.str(dtype_name(d)); });
      j.raw(",").key("onnx");
      array(j, t.allowed, [&](DType d) { j.str(dtype_onnx_tensor_type(d)); });
      j.raw("}");
    });
    j.raw(",").key("inputs");
    array(j, op.inputs, [&](const InputSpec& in) {
      j.raw("{").key("name").str(in.name).raw(",").key("type").str(in.type);
      j.raw(",").key("optional").raw(in.optional ? "true" : "false");
      j.raw(",").key("rank").num(int64_t{in.rank}).raw(",").key("doc").str(in.doc).raw("}");
    });
    j.raw(",").key("attributes");
    array(j, op.attrs, [&](const AttrSpec& a) {
      j.raw("{").key("name").str(a.name).raw(",").key("kind").str(attr_kind_name(a.kind));
      if (a.default_value) {
        j.raw(",").key("default");
        value(j, *a.default_value);
      }
      j.raw(",").key("doc").str(a.doc).raw("}");
    });
    j.raw(",").key("outputs");
    array(j, op.outputs, [&](const OutputSpec& o) {
      j.raw("{").key("name").str(o.name).raw(",").key("type").str(o.type);
      j.raw(",").key("shape").str(o.shape.str()).raw(",").key("doc").str(o.doc);
      if (op.has_data_dependent_output()) {
        // What PyTorch's generic fake kernel needs: input dims, constants, fresh sizes.
        j.raw(",").key("fake_dims");
        array(j, o.shape.dims, [&](const DimExpr& e) {
          const DimNode& n = *e.node;
          if (n.kind == DimNode::Kind::Dim) {
            j.raw("{").key("inputs");
            array(j, n.inputs, [&](const std::string& s) { j.str(s); });
            j.raw(",").key("axis").num(n.value).raw("}");
          } else if (n.kind == DimNode::Kind::Const) {
            j.raw("{").key("const").num(n.value).raw("}");
          } else {
            j.raw("{").key("data_dependent").raw("true}");
          }
        });
      }
      j.raw("}");
    });
    j.raw(",").key("checks");
    array(j, op.checks, [&](const DimCheck& c) { j.str(c.str() + ": " + c.what); });
    j.raw("}");
  });
  // Last: writing the ops may find errors (an export rule naming a missing op).
  j.raw(",").key("errors");
  array(j, registry().errors(), [&](const std::string& e) { j.str(e); });
  j.raw("}");
  return j.str();
}

}  // namespace opbridge
