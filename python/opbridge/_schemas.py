"""ONNX op schemas for a library's custom ops, generated from its manifest, so that
onnx.checker (full_check) and onnxscript know every custom node. Registered without Python
shape-inference callbacks, which have crashed upstream."""

from __future__ import annotations

from onnx import AttributeProto, defs, helper

from ._library import Library, OpInfo

_ATTR_TYPES = {
    "int": defs.OpSchema.AttrType.INT,
    "bool": defs.OpSchema.AttrType.INT,
    "float": defs.OpSchema.AttrType.FLOAT,
    "str": defs.OpSchema.AttrType.STRING,
    "int[]": defs.OpSchema.AttrType.INTS,
    "float[]": defs.OpSchema.AttrType.FLOATS,
}


ATTRIBUTE_PROTO_TYPES = {
    "int": AttributeProto.INT,
    "bool": AttributeProto.INT,
    "float": AttributeProto.FLOAT,
    "str": AttributeProto.STRING,
    "int[]": AttributeProto.INTS,
    "float[]": AttributeProto.FLOATS,
}


def onnx_attribute_value(kind: str, value):
    """A manifest/Python attribute value as ONNX stores it (bools are ints)."""
    if kind == "bool":
        return int(bool(value))
    if kind == "float":
        return float(value)
    if kind == "float[]":
        return [float(v) for v in value]
    return value


def onnx_attribute(name: str, kind: str, value) -> AttributeProto:
    """An attribute of an opbridge kind as an AttributeProto, typed explicitly: make_attribute
    cannot tell what an empty list holds."""
    return helper.make_attribute(name, onnx_attribute_value(kind, value), attr_type=ATTRIBUTE_PROTO_TYPES[kind])


def _attribute(a: dict) -> defs.OpSchema.Attribute:
    if "default" in a:
        return defs.OpSchema.Attribute(a["name"], onnx_attribute(a["name"], a["kind"], a["default"]), a["doc"])
    return defs.OpSchema.Attribute(a["name"], _ATTR_TYPES[a["kind"]], a["doc"], required=True)


def schema_for(op: OpInfo) -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    opt = defs.OpSchema.FormalParameterOption
    inputs = [
        P(i["name"], i["type"], i["doc"], param_option=opt.Optional if i["optional"] else opt.Single)
        for i in op.inputs
    ]
    outputs = [P(o["name"], o["type"], o["doc"]) for o in op.outputs]
    constraints = [(name, types, "") for name, types in op.onnx_types.items()]
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


def register(lib: Library) -> None:
    for op in lib.ops:
        if not op.has_own_node:
            continue
        if defs.has(op.onnx_type, op.since_version, op.onnx_domain):
            continue  # registered by an earlier load in this process
        defs.register_schema(schema_for(op))
