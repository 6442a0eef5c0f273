"""dynamo=True: a translation function per op for torch.onnx.export's `custom_translation_table`,
emitting the chosen node through onnxscript (the schema registered by _schemas gives a custom
node its output count). Built per export call, for its opset; nothing here names an op."""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import onnx_ir
import onnxscript
import torch

from .._library.kinds import ATTR_KINDS, DTYPES
from .._library.manifest import OpInfo
from .._library.registry import all_ops
from .held import holding
from .rules import ExportOptions, choose_target, domain_version, input_dtypes, map_call, split_args

# The standard ops opbridge exports to are written with this opset's onnxscript bindings; the
# exporter converts the model to the requested opset afterwards.
STANDARD_OPSET_VERSION = 20
# What torch.onnx.export(dynamo=True) writes when no opset is given.
DEFAULT_DYNAMO_OPSET = 20


_DTYPE_NAMES = {d.onnx: d.name for d in DTYPES.values()}


def _dtype(value) -> str | None:
    """The dtype name of a traced value (an onnx_ir value: its dtype is a TensorProto type)."""
    dtype = getattr(value, "dtype", None)
    return None if dtype is None else _DTYPE_NAMES.get(int(dtype))


def _int64(value):
    """A symbolic attribute's graph value as the int64 scalar the node takes."""
    if _dtype(value) in (None, "int64"):
        return value
    return onnxscript.values.Opset("", STANDARD_OPSET_VERSION).Cast(value, to=DTYPES["int64"].onnx)


def _translation(op: OpInfo, options: ExportOptions) -> Callable:
    def translate(*args, **kwargs):
        inputs, attrs = split_args(op, args, dict(kwargs))
        target = choose_target(op, options, input_dtypes(op, [None if v is None else _dtype(v) for v in inputs]))
        # A symbolic attribute arrives as a graph value where torch.export kept the size it was
        # computed from symbolic (a SymInt): map_call makes it the node's input.
        attrs = {k: _int64(v) if isinstance(v, onnx_ir.Value) else v for k, v in attrs.items()}
        inputs, onnx_attrs = map_call(op, target, inputs, attrs, lambda v: v is None,
                                      lambda v: isinstance(v, onnx_ir.Value))
        version = max(STANDARD_OPSET_VERSION, options.opset) if target.standard else domain_version(target)
        emit = getattr(onnxscript.values.Opset(target.domain, version), target.op_type)
        return emit(*inputs, **{k: ATTR_KINDS[kind].onnxscript_value(k, v) for k, (kind, v) in onnx_attrs.items()})

    # The exporter matches the torch op's arguments to this signature.
    P = inspect.Parameter
    params = [P(i.name, P.POSITIONAL_OR_KEYWORD, default=None if i.optional else P.empty) for i in op.inputs]
    params += [P(a.name, P.POSITIONAL_OR_KEYWORD, default=a.default if a.has_default else P.empty)
               for a in op.attributes]
    # Python forbids a required parameter after a defaulted one; such attributes get a None
    # default, and the ONNX checker reports them if really missing.
    seen_default = False
    for k, p in enumerate(params):
        seen_default |= p.default is not P.empty
        if seen_default and p.default is P.empty:
            params[k] = p.replace(default=None)
    translate.__signature__ = inspect.Signature(params)
    translate.__name__ = f"opbridge_{op.name}"
    translate.__qualname__ = translate.__name__
    return translate


def translation_table(ops: list[OpInfo] | None = None, *, opset: int = DEFAULT_DYNAMO_OPSET,
                      custom_nodes: bool = False, portable: bool = False) -> dict[torch._ops.OpOverload, Callable]:
    """custom_translation_table entries for every loaded op (or the given ones) whose PyTorch op
    exists in this process, for a model of ai.onnx `opset` (rules are chosen by it: pass the
    opset_version given to torch.onnx.export). opbridge.export does all this, and also adds the
    FunctionProtos of function ops (add_functions) and runs the checker."""
    options = ExportOptions(opset, custom_nodes, portable)
    return {op.overload: _translation(op, options) for op in (all_ops() if ops is None else ops) if op.available}


@contextlib.contextmanager
def reused_torchlib_registry():
    """torch.onnx.export(dynamo=True) fills a fresh ONNXRegistry from torchlib on every call, which
    reads and parses the Python source of ~500 torchlib functions: about 1.2 s, most of a small
    model's export. What it holds depends only on the opset and on which of torchlib's target ops
    exist, so within this context it is filled once per set of such ops, every opset's functions
    kept, and each export gets a copy with lists of its own, cleaned for its opset by the
    registry's own rule (the export registers its custom translation table into that copy).
    Where this torch lays out its exporter otherwise, nothing changes."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry as cls
    except ImportError:
        cls = None
    current = getattr(cls, "__dict__", {}).get("from_torchlib")
    cleanup = getattr(cls, "__dict__", {}).get("_cleanup_registry_based_on_opset_version")
    if not isinstance(current, classmethod) or cleanup is None:
        yield
        return

    def patched(saved):
        def from_torchlib(registry_cls, opset_version=None):
            # Ops registered later (torchvision's) change which torchlib functions find their
            # target: which of torchlib's targets exist is the key (ops of other namespaces, a
            # test's or a library's, leave the registry as it is).
            key = (registry_cls, _torchlib_targets())
            filled = _TORCHLIB_REGISTRIES.get(key)
            if filled is None:
                _TORCHLIB_REGISTRIES.clear()  # the targets changed: older fills are stale
                # Filled through a subclass that keeps every opset's functions (nothing patched).
                unfiltered = type("UnfilteredRegistry", (registry_cls,),
                                  {"_cleanup_registry_based_on_opset_version": lambda self: None})
                filled = _TORCHLIB_REGISTRIES[key] = saved.__func__(unfiltered)
            copy = registry_cls.__new__(registry_cls)
            copy.__dict__.update(filled.__dict__)
            copy.functions = {target: list(decomps) for target, decomps in filled.functions.items()}
            if opset_version is not None:
                copy._opset_version = opset_version
            copy._cleanup_registry_based_on_opset_version()
            return copy

        return classmethod(from_torchlib)

    with holding(cls, "from_torchlib", patched):
        yield


_TORCHLIB_REGISTRIES: dict = {}


def _torchlib_targets() -> frozenset:
    """The operators torchlib has functions for that exist in this process (names with overload)."""
    from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 - ops registers them

    named = {name.split(".")[0] for name in registration.default_registry}
    return frozenset(n for n in torch._C._dispatch_get_all_op_names() if n.split(".")[0] in named)


@contextlib.contextmanager
def cia_ops_collected_once():
    """torch.export's decompositions (twice per dynamo export) ask torch for every valid
    CompositeImplicitAutograd op (torch._export.utils._collect_all_valid_cia_ops), which has the
    dispatcher look up each such op in torch.ops once per op namespace (about 30 of them): 0.1 s,
    up to a third of a one-op model's export. The lookup only makes Python objects for ops that
    lack them, so within this context it runs once per call, before the same walk over the
    namespaces with torch's own tests; nothing is kept between calls (an op registered in between
    counts). Where this torch lays out its export otherwise, nothing changes."""
    try:
        from torch._export import utils
        from torch.export import decomp_utils, exported_program
    except ImportError:
        yield
        return
    needed = ("_materialize_cpp_cia_ops", "_collect_all_valid_cia_ops_for_aten_namespace", "_is_preservable_cia_op")
    if not all(hasattr(utils, n) for n in needed) or not hasattr(torch.ops, "_dir"):
        yield
        return

    def patched(original):  # only where the module calls torch's own
        return _valid_cia_ops if original is getattr(utils, "_collect_all_valid_cia_ops", None) else original

    with contextlib.ExitStack() as stack:
        for m in (exported_program, decomp_utils):
            if "_collect_all_valid_cia_ops" in vars(m):
                stack.enter_context(holding(m, "_collect_all_valid_cia_ops", patched))
        yield


def _valid_cia_ops() -> set:
    """The set torch._export.utils._collect_all_valid_cia_ops returns: aten's from torch's own cache,
    and of every other namespace torch.ops holds, each op overload torch deems a preservable
    CompositeImplicitAutograd op, after the dispatcher's CompositeImplicitAutograd ops have been
    looked up in torch.ops once (not once per namespace)."""
    from torch._export import utils

    utils._materialize_cpp_cia_ops()
    ops = set()
    for name in list(torch.ops._dir):
        if name == "aten":
            ops |= utils._collect_all_valid_cia_ops_for_aten_namespace()
            continue
        namespace = getattr(torch.ops, name)
        if isinstance(namespace, torch._ops._OpNamespace):
            ops.update(op for packet in namespace for op in getattr(namespace, packet).op_overloads()
                       if utils._is_preservable_cia_op(op))
    return ops
