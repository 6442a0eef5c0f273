"""Substitution of Python-level operators, so a model exports and runs with its code untouched.

Model code rarely calls a TORCH_LIBRARY op. It calls an autograd.Function over a compiled
extension (pointnet2_ops' sampling and grouping, mmcv's ModulatedDeformConv2dFunction) or a plain
function (mmcv.ops.modulated_deform_conv2d), often one whose extension is CUDA-only or missing.
No dispatcher rule sees those calls: a rule here is keyed on the operator's qualified name and
gives a replacement written on opbridge's ops, taking the same arguments. An op's definition
declares the operators it replaces (OpBuilder::replaces: the target's parameters bound to the op's
inputs and attributes); `substitute` adds a rule from Python, and wins over a definition's rule
for the same target.

Inside `substitutions()` (opbridge.export enters it) every rule whose module is imported is
applied: the target's own binding (an autograd.Function's `apply`, a module's function, a class's
method), every module global bound to it in any imported module (`sample = Sampling.apply`,
`from package.ops import sample`) and every attribute bound to it in the models the block is given
(`self.sample_fn = sample`) point to the replacement; all of it is restored when the block ends.
The bindings are process-wide for the block's length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import threading
import types
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from .._library.errors import OpbridgeError
from .._library.manifest import OpInfo, PythonOperator
from .._library.registry import libraries


@dataclasses.dataclass(frozen=True)
class Substitution:
    """Calls of `target` ("package.module.Name", or "package.module.Class.method") run
    `replacement` with the same arguments while substitutions() is active."""

    target: str
    replacement: Callable
    doc: str = ""


_RULES: dict[str, Substitution] = {}
_TORCH_DIR = str(Path(torch.__file__).parent)  # frames of PyTorch's own code
_COMPAT = "opbridge.compat."  # the drop-in modules (opbridge.compat.install)
_LOCK = threading.RLock()
_DEPTH = [0]  # nested substitutions() blocks apply the rules once


def substitute(target: str, replacement: Callable | None = None, *, doc: str = ""):
    """Registers a substitution: inside `opbridge.substitutions()` and `opbridge.export`, calls of
    `target` (the qualified name of an autograd.Function subclass, a function, or a class's method)
    run `replacement` with the same arguments. A later rule for the same target replaces the
    earlier one. Also a decorator: @opbridge.substitute("pkg.mod.Function")."""
    if not isinstance(target, str) or target.count(".") < 1:
        raise OpbridgeError(f"substitute: the target is a qualified name such as 'package.module.Function', "
                            f"got {target!r}")

    def register(fn: Callable) -> Callable:
        if not callable(fn):
            raise OpbridgeError(f"substitute({target!r}): the replacement must be callable, got {fn!r}")
        _RULES[target] = Substitution(target, fn, doc or (inspect.getdoc(fn) or "").split("\n")[0])
        return fn

    return register if replacement is None else register(replacement)


class _OpCall:
    """The replacement an op's definition declares: calls of the target, bound by the target's
    own signature (read when the rule is applied), call the op."""

    def __init__(self, op: OpInfo, entry: PythonOperator):
        self.op, self.entry = op, entry

    def __repr__(self) -> str:
        return f"{self.op.qualified_name}({', '.join(p or '_' for p in self.entry.params)})"

    def bound_to(self, signature: inspect.Signature | None, drop_first: bool) -> Callable:
        """The callable installed in the target's place: `signature` is the target's (None: not
        readable, arguments by position only); drop_first skips a method's self."""
        op, entry = self.op, self.entry
        overload = op.overload

        def call(*args, **kwargs):
            if signature is not None:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                values = list(bound.arguments.values())
            elif kwargs:
                raise OpbridgeError(f"{entry.target}: its signature cannot be read, so {op.qualified_name} takes its "
                                    f"arguments by position only (got {', '.join(kwargs)} by name)")
            else:
                values = list(args)
            named = dict(entry.fixed)
            named.update((name, v) for name, v in zip(entry.params, values[1:] if drop_first else values) if name)
            inputs = [named.pop(i.name, None) for i in op.inputs]  # what is left are attributes
            return overload(*inputs, **named)

        call.__name__ = call.__qualname__ = entry.target.rsplit(".", 1)[-1]
        call.__doc__ = f"{entry.target}, substituted by opbridge: {self!r}"
        return call


def _declared() -> dict[str, Substitution]:
    """The rules the loaded libraries' op definitions declare, by target (a later library's rule
    for the same target wins)."""
    return {p.target: Substitution(p.target, _OpCall(op, p), f"{op.qualified_name} ({op.library.name})")
            for lib in libraries() for op in lib.ops for p in op.replaces}


def _rules() -> dict[str, Substitution]:
    return {**_declared(), **_RULES}  # a rule from substitute() wins


def substitution_rules() -> list[Substitution]:
    """Every substitution: those the op definitions declare, then those registered with
    substitute() (which replace a declared one for the same target)."""
    return list(_rules().values())


def _signature(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _resolve(target: str):
    """(owner, attribute name, object) for a target whose module is imported; None otherwise
    (a rule for a package the process never imported does nothing)."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        owner = module
        for name in parts[cut:-1]:
            owner = getattr(owner, name, None)
            if owner is None:
                return None
        obj = getattr(owner, parts[-1], None)
        return None if obj is None else (owner, parts[-1], obj)
    return None


def _is_function_class(obj) -> bool:
    return isinstance(obj, type) and issubclass(obj, torch.autograd.Function)


class _Bindings:
    """The attributes changed, to be restored in reverse order."""

    def __init__(self):
        self.changed: list[tuple[object, str, bool, object]] = []  # (owner, name, had own attribute, old value)

    def set(self, owner, name: str, value) -> None:
        own = name in vars(owner)
        self.changed.append((owner, name, own, vars(owner).get(name)))
        setattr(owner, name, value)

    def restore(self) -> None:
        for owner, name, own, old in reversed(self.changed):
            if own:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self.changed.clear()


def _apply(rule: Substitution, bindings: _Bindings) -> tuple[object, Callable] | None:
    """Points the target's own binding at the replacement: (the original callable, what now
    stands in its place), or None when the target's module is not imported."""
    found = _resolve(rule.target)
    if found is None:
        return None
    owner, name, obj = found
    if (getattr(obj, "__module__", None) or "").startswith(_COMPAT):
        return None  # an opbridge.compat module installed under the package's name: already opbridge's ops
    replacement = rule.replacement
    if _is_function_class(obj):
        if isinstance(replacement, _OpCall):  # apply(*args) takes forward's parameters after ctx
            sig = _signature(obj.forward)
            sig = sig and sig.replace(parameters=list(sig.parameters.values())[1:])
            replacement = replacement.bound_to(sig, drop_first=False)
        original = obj.apply
        bindings.set(obj, "apply", staticmethod(replacement))
        return original, replacement
    if isinstance(obj, torch._ops.OpOverloadPacket):  # a rule for torch.ops.<namespace>.<op>
        replacement = _OpStandIn(obj, replacement)
    static = inspect.getattr_static(owner, name)
    if isinstance(replacement, _OpCall):  # a class's function is a method (self first), as a classmethod's
        func = static.__func__ if isinstance(static, (staticmethod, classmethod)) else static
        self_first = isinstance(static, classmethod) or (isinstance(owner, type) and not isinstance(static, staticmethod))
        replacement = replacement.bound_to(_signature(func), drop_first=self_first)
    bindings.set(owner, name, replacement if not isinstance(static, (staticmethod, classmethod))
                 else type(static)(replacement))
    return obj, replacement


class _OpStandIn:
    """Stands in for a TORCH_LIBRARY op (torch.ops.ns.op) whose calls are substituted: calls run
    the replacement, and everything else (its overloads, .default, its schema) is the op's, as
    PyTorch's own walks over the op namespaces expect."""

    def __init__(self, op, replacement: Callable):
        self._op, self._replacement = op, replacement

    def __call__(self, *args, **kwargs):
        return self._replacement(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._op, name)


def _rebind(spaces: list, pairs: Iterable[tuple[object, Callable]], bindings: _Bindings) -> None:
    """Every attribute of `spaces` (modules, nn.Module instances) bound to one of the originals
    (a function, or a bound method such as a Function's apply) now holds its replacement. One
    pass over every module's attributes for all the rules: it runs on every export. Values are
    matched by identity and type, never with their own __eq__ or __getattr__ (torch.ops'
    namespaces, in sys.modules, resolve any attribute asked for)."""
    by_id, by_method = {}, {}
    for original, replacement in pairs:
        by_id[id(original)] = replacement
        if isinstance(original, types.MethodType):
            by_method[(id(original.__func__), id(original.__self__))] = replacement
    if not by_id:
        return
    for space in spaces:
        attrs = getattr(space, "__dict__", None)
        if not isinstance(attrs, dict):
            continue
        for key, value in list(attrs.items()):
            replacement = by_id.get(id(value))
            if replacement is None and by_method and type(value) is types.MethodType:
                replacement = by_method.get((id(value.__func__), id(value.__self__)))
            if replacement is not None:
                bindings.set(space, key, replacement)


_ACTIVE: dict[str, tuple[object, Callable]] = {}  # target -> (original, replacement) while a block runs


@contextlib.contextmanager
def substitutions(*models, only: Iterable[str] | None = None) -> Iterator[list[str]]:
    """Applies the registered substitutions (or those whose targets `only` names) for the block:
    the model runs eagerly on opbridge's ops where it calls them (even where the original
    extension is missing or CUDA-only), and exports with them. Yields the targets applied (rules
    whose modules are not imported do nothing). `models` (torch.nn.Modules; opbridge.export
    passes its model) also have their submodules' attributes that hold an operator rebound
    (`self.sample_fn = furthest_point_sample` in a constructor). Nested blocks apply the rules
    once (a nested block's models still get theirs)."""
    instances = [m for model in models for m in model.modules()]
    with _LOCK:
        nested = _DEPTH[0] > 0
        rules = {} if nested else _rules()
        wanted = None if only is None else set(only)
        unknown = sorted(wanted - set(rules)) if wanted is not None and not nested else []
        if unknown:
            raise OpbridgeError(f"substitutions(only=...): no rule for {', '.join(unknown)}")
        bindings, applied = _Bindings(), []
        _DEPTH[0] += 1
        try:
            if nested:
                _rebind(instances, _ACTIVE.values(), bindings)
            for rule in rules.values():
                got = _apply(rule, bindings) if wanted is None or rule.target in wanted else None
                if got is not None:
                    _ACTIVE[rule.target] = got
                    applied.append(rule.target)
            if applied:
                _rebind([*sys.modules.values(), *instances], [_ACTIVE[t] for t in applied], bindings)
            yield applied
        finally:
            _DEPTH[0] -= 1
            bindings.restore()
            if not nested:
                _ACTIVE.clear()


def unsubstituted(error: BaseException) -> str | None:
    """When `error` (or an exception it wraps) was raised inside an autograd.Function's forward
    that no rule covers, what to say: the Function, where it is defined, where the model called
    it, and how to add a rule. None otherwise."""
    seen, cur = set(), error
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = []
        tb = cur.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for k in range(len(frames) - 1, -1, -1):  # the innermost Function forward
            ctx = frames[k].f_locals.get("ctx") if frames[k].f_code.co_name == "forward" else None
            cls = getattr(ctx, "_forward_cls", None)
            if not _is_function_class(cls):
                continue
            target = f"{cls.__module__}.{cls.__qualname__}"
            if target in _rules():
                return None
            callers = [f for f in frames[:k] if not f.f_code.co_filename.startswith(_TORCH_DIR)]
            call = f" at {callers[-1].f_code.co_filename}:{callers[-1].f_lineno}" if callers else ""
            where = f"{frames[k].f_code.co_filename}:{frames[k].f_code.co_firstlineno}"
            return (f"the model calls the Python-level operator {target} (an autograd.Function, its forward at {where})"
                    f"{call}; it failed with {type(cur).__name__}: {str(cur).strip().splitlines()[0] if str(cur).strip() else ''}"
                    f"\nNo substitution rule covers it. Add one that computes it on opbridge's or PyTorch's ops, with "
                    f"the arguments of its forward (without ctx):\n  @opbridge.substitute({target!r})\n  def "
                    f"{cls.__name__.lower()}(...): ...\nor declare it in an op's definition with "
                    f"OpBuilder::replaces (docs/authoring.md).")
        cur = cur.__cause__ or cur.__context__
    return None
