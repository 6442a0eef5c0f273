// The registry of every op compiled into this shared library. Op files fill it by static
// registration (OPBRIDGE_OP in op.h); adapters and the manifest read it. Core is linked into
// each op library with hidden visibility, so every library has a registry of its own.
#pragma once

#include <string>
#include <vector>

#include "opbridge/op_spec.h"

namespace opbridge {

// Who this library is: the PyTorch namespace and the ONNX domain its custom ops live in.
// Defined once per op library by OPBRIDGE_LIBRARY (the CMake function generates it).
struct LibraryInfo {
  const char* name;            // the library target name, e.g. "opbridge"
  const char* torch_namespace; // torch.ops.<torch_namespace>.<op>
  const char* onnx_domain;     // ONNX domain of the custom nodes
  int onnx_domain_version;
};
const LibraryInfo& this_library();

class Registry {
 public:
  // Validates the spec (names resolve, constraints are well formed, export rules fit their
  // targets) and adds it. A spec that fails validation is recorded in errors() and left out:
  // adapters report it at load time. A rule naming another op of this library is resolved when
  // that op registers, whichever comes first.
  void add(OpSpec spec);
  const std::vector<OpSpec>& ops() const { return ops_; }
  const OpSpec* find(std::string_view name) const;
  // Every problem found so far, and every export rule whose library op never registered.
  std::vector<std::string> errors() const;
  // For adapters that find a problem while deriving their ops (reported by the loaders).
  void add_error(std::string e) { errors_.push_back(std::move(e)); }

 private:
  void resolve_library_rules(OpSpec& op);

  std::vector<OpSpec> ops_;
  std::vector<std::string> errors_;
};

Registry& registry();

// Throws Error naming the problem when the spec is inconsistent; used by Registry::add.
void validate_spec(const OpSpec& spec);
// Fills what the export mapping derives (the op's ONNX name, rule order, mapped attribute kinds,
// standard-op targets).
void resolve_export(OpSpec& spec);
void check_export(const OpSpec& spec);

// The JSON contract between the C++ side and the Python export glue (see manifest.cc): the
// library, then every op with its ONNX name, types, inputs, attributes, outputs and export
// mapping. It only writes what the registry validated.
std::string manifest_json();

}  // namespace opbridge

#define OPBRIDGE_LIBRARY(NAME, TORCH_NAMESPACE, ONNX_DOMAIN, VERSION)             \
  const ::opbridge::LibraryInfo& ::opbridge::this_library() {                    \
    static const ::opbridge::LibraryInfo info{NAME, TORCH_NAMESPACE, ONNX_DOMAIN, VERSION}; \
    return info;                                                                 \
  }
