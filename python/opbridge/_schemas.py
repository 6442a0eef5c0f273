"""ONNX op schemas for a library's own nodes, generated from its manifest, so that onnx.checker
(full_check) and onnxscript know every custom node. Registered without Python shape-inference
callbacks, which have crashed upstream."""

from __future__ import annotations

from onnx import defs

from ._kinds import ATTR_KINDS, DTYPES
from ._manifest import AttributeSpec, Library, OpInfo


def _attribute(a: AttributeSpec) -> defs.OpSchema.Attribute:
    kind = ATTR_KINDS[a.kind]
    if a.has_default:
        return defs.OpSchema.Attribute(a.name, kind.attribute_proto(a.name, a.default), a.doc)
    return defs.OpSchema.Attribute(a.name, kind.schema_type, a.doc, required=True)


def schema_for(op: OpInfo) -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    opt = defs.OpSchema.FormalParameterOption
    inputs = [P(i.name, i.type, i.doc, param_option=opt.Optional if i.optional else opt.Single) for i in op.inputs]
    outputs = [P(o.name, o.type, o.doc) for o in op.outputs]
    constraints = [(t.name, [DTYPES[d].onnx_type for d in t.dtypes], "") for t in op.types]
    return defs.OpSchema(
        op.onnx_type,
        op.onnx_domain,
        op.since_version,
        op.doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=[_attribute(a) for a in op.attributes],
    )


def register_schemas(lib: Library) -> None:
    for op in lib.ops:
        if not op.has_own_node:
            continue
        if defs.has(op.onnx_type, op.since_version, op.onnx_domain):
            continue  # registered by an earlier load in this process
        defs.register_schema(schema_for(op))
