"""opbridge.export: either PyTorch exporter with opbridge's rules, the ONNX checker, dynamic
axes by name, and the installed ONNX Runtime's judgement of the model."""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import Any, Callable, Sequence

import onnx
import onnxruntime as ort
import torch

from .._library.errors import OpbridgeError
from .._library.kinds import positional, tensor_leaves
from .._runtime.inspect import cannot_run
from .._runtime.second_size import prove
from .._runtime.verify import random_outputs
from .dynamo import DEFAULT_DYNAMO_OPSET, cia_ops_collected_once, reused_torchlib_registry, translation_table
from .functions import add_functions
from .graph_inputs import check_dynamic_axes, check_dynamic_shapes, check_inputs, dynamic_shapes_from_axes, modules_of
from .examples import KeywordsBound, distinct_examples
from .failures import op_errors
from .isolation import hidden_here, isolated
from .naming import name_outputs
from .optimizer import optimize as optimize_program
from .rules import ExportOptions
from .repairs import agree_input_types, squeeze_only_ones
from .substitution import substitutions
from .torchscript import claim_existing_ops, custom_opsets, options_requested, torchscript_exporter_available
from .traced_sizes import traced_sizes

EXPORTERS = ("dynamo", "torchscript")
DEFAULT_TORCHSCRIPT_OPSET = 17
# The dynamo exporter writes ai.onnx opset 18 or newer (onnxscript converts down no further).
MIN_DYNAMO_OPSET = 18


def default_opset(exporter: str) -> int:
    """The ai.onnx opset `export` writes when none is given."""
    return DEFAULT_DYNAMO_OPSET if exporter == "dynamo" else DEFAULT_TORCHSCRIPT_OPSET


def export(
    model: torch.nn.Module,
    args: tuple,
    f: str | os.PathLike | None = None,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: dict[str, dict[int, str] | list[int]] | None = None,
    dynamic_shapes: Any = None,
    kwargs: dict[str, Any] | None = None,
    custom_nodes: bool = False,
    portable: bool = False,
    extra_translations: dict[Any, Callable] | None = None,
    check: bool = True,
    check_runtime: bool = True,
    prove_dynamic: bool = True,
    check_args: tuple | None = None,
    check_kwargs: dict[str, Any] | None = None,
    allow_unused_inputs: bool = False,
    optimize: bool = True,
    verbose: bool = False,
) -> onnx.ModelProto:
    """Exports `model` with opbridge's rules using either PyTorch exporter, runs the ONNX checker
    with full shape inference, saves to `f` if given, and returns the model.

    model is a torch.nn.Module, or for the dynamo exporter a torch.export.ExportedProgram (its
    shapes are its own; it can be exported any number of times, with other options each time).

    args are the positional arguments (a tuple; a dict among them, the last one too, is an argument
    like any other) and kwargs the keyword arguments: opbridge.verify takes the same. A trailing
    empty dict, torch.onnx.export's "no keyword arguments", is accepted and dropped.
    input_names name the model's tensor inputs in order (positional, then keyword arguments).
    dynamic_axes: {"input name": {axis: "dim name"}} (or [axis, ...]); those axes stay symbolic in
    the ONNX model, and export fails if the exported graph fixes one of them (the dynamo
    exporter also refuses a model that specializes on such a size; the TorchScript exporter
    cannot tell). For inputs nested in containers, the dynamo exporter also takes
    torch.export's own `dynamic_shapes`.

    Ops with an export rule to a standard ONNX op (e.g. a deformable convolution as ai.onnx DeformConv
    from opset 19) use it when the opset allows; custom_nodes=True keeps opbridge's own custom
    nodes instead, for runtimes that lack the standard op. Where a standard op runs much slower in
    ONNX Runtime than opbridge's kernel (bicubic Resize), the op's own node is written unless
    portable=True asks for the standard op (a model that needs no opbridge library for it). Ops
    exported as ONNX functions get their FunctionProto added to the model.

    The model gets the lowest IR version its opset imports need, so `opset` alone decides which
    runtimes can load it (e.g. opset 20 or lower for ONNX Runtime 1.17).

    extra_translations ({torch op overload: onnxscript function}) adds your own translations for
    the dynamo exporter, merged with opbridge's (yours win for the same op); a custom-domain node
    they write needs a schema (opbridge.declare_node). The TorchScript exporter takes symbolics
    registered with torch.onnx.register_custom_op_symbolic instead.

    The outputs of opbridge's nodes are named as the op's definition names them (unless
    output_names names them). With check_runtime (the default), the model is judged against the
    installed ONNX Runtime and the loaded op libraries as `opbridge inspect` judges it, and one
    OpbridgeError lists every node they cannot run, with what to do; pass check_runtime=False
    when exporting for another runtime.

    With prove_dynamic and check_runtime (the defaults) the exported model runs in ONNX Runtime at
    the example and must agree with eager there: an output wrong beyond rounding (a relative error
    of 1e-2, or any integer, shape or dtype that differs) is an OpbridgeError naming it, whether or
    not an axis is dynamic. Dynamic axes are proven: the model runs
    eagerly and in ONNX Runtime at the example's size and at a second size of every axis the graph
    declares dynamic, and a disagreement or a failure there is an OpbridgeError naming the axes,
    the sizes, the outputs and what in the graph holds an example size. The second inputs are
    check_args / check_kwargs when given (the same structure as args / kwargs, other sizes), else
    derived from the example (twice the size first; see opbridge._runtime.second_size). Where no
    second size runs eagerly, a warning (UnprovenWarning) says the axes are not proven.

    Every tensor of the call must be an input of the exported graph: one the graph does not take
    (the model read it as a Python number, the TorchScript trace fixing its value, or an extension
    call the trace cannot see uses it) is an OpbridgeError naming it; allow_unused_inputs=True makes
    it a warning, for inputs the model ignores on purpose.

    Python-level operators with a substitution rule (opbridge.substitute) are traced as their
    replacements: see opbridge.substitutions.

    The exporters' own output stays hidden unless verbose, but for the TorchScript trace's
    TracerWarnings (a tensor read as a Python number or bool: a value fixed to the example), issued
    once per line of the model's code when the export succeeds. A Python condition on data fails the dynamo exporter with
    an OpbridgeError naming the line.

    optimize: each exporter's constant folding, and for dynamo onnxscript's rewrite rules unless
    they would change a value (`d + 1e-8` taken for `d`: then a warning; see _export/optimizer.py).
    """
    if exporter not in EXPORTERS:
        raise OpbridgeError(f"exporter must be one of {', '.join(EXPORTERS)}, got '{exporter}'")
    args = positional(args)
    ExportOptions(opset or 1, custom_nodes, portable)  # refuses a contradictory choice up front
    if extra_translations and exporter != "dynamo":
        raise OpbridgeError("extra_translations are onnxscript translations for the dynamo exporter; for the "
                            "TorchScript exporter register a symbolic with torch.onnx.register_custom_op_symbolic")
    args, kwargs = distinct_examples(args, kwargs)
    call = (model, args, kwargs)  # the call as given: the checks below run it
    names = list(input_names) if input_names else None
    outs = list(output_names) if output_names else None
    if exporter == "dynamo":
        if opset is not None and opset < MIN_DYNAMO_OPSET:
            raise OpbridgeError(f"the dynamo exporter writes opset {MIN_DYNAMO_OPSET} or newer, got opset={opset}; "
                                "use exporter='torchscript' for older opsets")
        if dynamic_shapes is None:
            dynamic_shapes = dynamic_shapes_from_axes(model, args, kwargs, names, dynamic_axes)
        if isinstance(model, torch.export.ExportedProgram):
            _reusable(model)
        opset = opset or DEFAULT_DYNAMO_OPSET
        table = translation_table(opset=opset, custom_nodes=custom_nodes, portable=portable)
        table.update(extra_translations or {})
        with isolated(verbose), op_errors(), _missing_ops(), _undeclared_nodes(), substitutions(*modules_of(model)), \
                reused_torchlib_registry(), cia_ops_collected_once():
            program = torch.onnx.export(model, _torch_args(args), kwargs=kwargs, dynamo=True,
                                        custom_translation_table=table, optimize=False,
                                        opset_version=opset,
                                        input_names=names, output_names=outs, dynamic_shapes=dynamic_shapes,
                                        verbose=verbose)
        if optimize:
            optimize_program(program)
        proto = program.model_proto
        squeeze_only_ones(proto)
        if dynamic_shapes is not None:
            check_dynamic_shapes(proto, model, args, kwargs, dynamic_shapes)
        caught = []
    else:
        if not torchscript_exporter_available():
            raise OpbridgeError(
                f"torch {torch.__version__} has no TorchScript-based ONNX exporter (dynamo=False); "
                "use exporter='dynamo'"
            )
        if dynamic_shapes is not None:
            raise OpbridgeError("dynamic_shapes is for the dynamo exporter; the TorchScript exporter takes dynamic_axes")
        if isinstance(model, torch.export.ExportedProgram):
            raise OpbridgeError("an ExportedProgram is exported by the dynamo exporter; the TorchScript exporter "
                                "traces a torch.nn.Module (pass program.module() to trace its graph)")
        if kwargs:
            # The TorchScript exporter passes everything positionally: bind keywords here.
            model, args = KeywordsBound(model, args, kwargs), tuple(tensor_leaves((args, kwargs)))
        buf = io.BytesIO()
        claim_existing_ops()
        with isolated(verbose, native_output=True) as caught, op_errors(), _missing_ops(), \
                options_requested(custom_nodes, portable), traced_sizes(), substitutions(*modules_of(model)):
            torch.onnx.export(model, _torch_args(args), buf, dynamo=False, do_constant_folding=optimize,
                              opset_version=opset or DEFAULT_TORCHSCRIPT_OPSET, custom_opsets=custom_opsets(),
                              input_names=names, output_names=outs, dynamic_axes=dynamic_axes, verbose=verbose)
        proto = onnx.load_from_string(buf.getvalue())
        agree_input_types(proto)
    add_functions(proto)
    name_outputs(proto, keep=set(outs or ()))
    _lowest_ir_version(proto)
    if dynamic_axes:
        check_dynamic_axes(proto, dynamic_axes)
    if check:
        onnx.checker.check_model(proto, full_check=True)
    if check_runtime:
        problems = cannot_run(proto)
        if problems:
            raise OpbridgeError(f"the exported model cannot run in ONNX Runtime {ort.__version__} with the loaded op "
                                "libraries:\n  " + "\n  ".join(problems) + "\n(export with check_runtime=False for "
                                "another runtime)")
    check_inputs(proto, *call, names, exporter, allow_unused_inputs,
                 [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)])
    if prove_dynamic and check_runtime:
        with substitutions(*modules_of(call[0])):  # the model runs eagerly as it was traced
            prove(*call, proto, check_args=check_args, check_kwargs=check_kwargs, input_names=names,
                  exporter=exporter, rtol=1e-5, atol=1e-6, random=set(random_outputs(proto)),
                  example_must_agree=True, quiet_eager=hidden_here)
    if f is not None:
        onnx.save(proto, os.fspath(f))
    return proto


def _reusable(program: torch.export.ExportedProgram) -> None:
    """Exporting a program decomposes it, which leaves a data-dependent size it made pending in the
    program's shape environment; a second export of the same program then fails
    (PendingUnbackedSymbolNotFound). Nothing is pending between exports: clear it."""
    for node in program.graph.nodes:
        env = getattr(getattr(node.meta.get("val"), "fake_mode", None), "shape_env", None)
        if env is not None:
            getattr(env, "pending_fresh_unbacked_symbols", []).clear()
            return


def _torch_args(args: tuple) -> tuple:
    """torch.onnx.export reads a trailing dict in args as keyword arguments: a dict that is the
    last positional argument gets the empty dict after it that says "no keywords"."""
    return (*args, {}) if args and isinstance(args[-1], dict) else args


def _lowest_ir_version(proto: onnx.ModelProto) -> None:
    """Lowers the model's IR version to the lowest its opset imports need (ONNX's own table): the
    dynamo exporter writes its newest IR version (10 at opset 20), which runtimes that run opset
    20 may refuse (ONNX Runtime 1.17 reads IR 9 at most). Fields a newer IR version added (node
    metadata) are unknown to such runtimes and ignored; the checker still judges the model."""
    needed = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    proto.ir_version = min(proto.ir_version, needed)




@contextlib.contextmanager
def _undeclared_nodes():
    """A translation that writes a custom-domain node with no ONNX schema fails deep inside
    onnxscript ("No schema registered ..."); this names the node and the fix in one line."""
    try:
        yield
    except Exception as e:
        cur, seen = e, set()
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            m = re.search(r"No schema registered for '([^']+)' version '(\d+)' and domain '([^']+)'", str(cur))
            if m:
                op_type, version, domain = m.groups()
                raise OpbridgeError(
                    f"a translation writes {domain}::{op_type} (domain version {version}), which has no ONNX schema: "
                    f"declare it first, e.g. opbridge.declare_node('{domain}', '{op_type}', inputs=[...], "
                    f"outputs=[...], version={version})") from e
            cur = cur.__cause__ or cur.__context__
        raise


_SUBSTITUTE = ("substitute the Python function that calls it (opbridge.substitute; importing opbridge.compat adds "
               "rules for torch_cluster's and torch_scatter's functions, docs/compat.md)")


@contextlib.contextmanager
def _missing_ops():
    """An op that neither exporter nor a loaded opbridge library can write fails deep inside the
    exporter (a dispatch error, an unsupported-operator error); this names the op and the ways
    to give it a translation, in one line."""
    try:
        yield
    except OpbridgeError:
        raise
    except Exception as e:
        cur, seen = e, set()
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            text = str(cur)
            m = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)\.(\w+)', overload='(\w+)'\)>", text)
            if m:
                ns, name, overload = m.groups()
                raise OpbridgeError(
                    f"{ns}::{name}: no ONNX translation (the dynamo exporter has none and no loaded opbridge library "
                    f"defines one): pass extra_translations={{torch.ops.{ns}.{name}.{overload}: <onnxscript "
                    "function>}, give the op rules in an opbridge library (docs/authoring.md), or "
                    + _SUBSTITUTE) from e
            m = re.search(r"operator with unrecognized namespace (\w+::\w+)|Exporting the operator '(\w+::\w+)' "
                          r"to ONNX opset version (\d+) is not supported", text)
            if m:
                op = m.group(1) or m.group(2)
                # The dynamo exporter is advice only where it has a translation for the op.
                dynamo = any(k.name().split(".")[0] == op for k in translation_table())
                raise OpbridgeError(
                    f"{op}: no ONNX symbolic for the TorchScript exporter" + (f" at opset {m.group(3)}" if m.group(3)
                                                                              else "")
                    + f": register one with torch.onnx.register_custom_op_symbolic('{op}', ...), give the op rules in "
                    "an opbridge library (docs/authoring.md), " + ("use the dynamo exporter, which translates it, "
                                                                   if dynamo else "") + "or " + _SUBSTITUTE) from e
            cur = cur.__cause__ or cur.__context__
        raise
