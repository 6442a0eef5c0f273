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
(`self.sample_fn = sample`) point to the target's dispatcher; all of it is restored when the last
block in the process ends.

The dispatcher runs the replacement for calls made on a thread inside a block that applies the
rule (the innermost block on the thread decides, its only= included) and the original everywhere
else: another thread calling the target during an export gets the original, and a copy of a model
made inside a block (it holds the dispatcher) runs the original outside one. A torch.jit.trace made
inside a block records the original, with a warning, since the trace outlives the block; the
traces opbridge.export makes (its block is entered inside isolation.isolated) record the
replacement, and so do torch.export's (a program made in a block is what opbridge.export takes).
The dispatcher reads only a threading.local and plain attributes, so dynamo traces through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import threading
import types
import warnings
from typing import Callable, Iterable, Iterator

import torch

from .._library.errors import OpbridgeError
from .._library.manifest import OpInfo, PythonOperator
from .._library.registry import libraries
from .held import hold, is_held, release


@dataclasses.dataclass(frozen=True)
class Substitution:
    """Calls of `target` ("package.module.Name", or "package.module.Class.method") run
    `replacement` with the same arguments while substitutions() is active."""

    target: str
    replacement: Callable
    doc: str = ""


_RULES: dict[str, Substitution] = {}
_COMPAT = "opbridge.compat."  # the drop-in modules (opbridge.compat.install)


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
        # The op as model code reaches it (torch.ops.<ns>.<op>), so that a rule on the op itself
        # (symbolic attributes under the TorchScript trace, traced_sizes.py) applies here too.
        namespace, name = op.qualified_name.split("::")

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
            return entry.call(op, getattr(getattr(torch.ops, namespace), name), inputs, named)

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


class _Installed:
    """A target's dispatcher, standing in the target's place (and wherever a module or a given
    model holds the target) while any substitutions() block in the process uses it. On the thread
    of a block that applies the rule it runs the replacement; everywhere else, the original."""

    def __init__(self, rule: Substitution, original, call: Callable, bind: Callable[[Callable], Callable]):
        self.target, self.rule, self.original, self.call, self.bind = rule.target, rule, original, call, bind
        self.replacement = bind(rule.replacement)
        self.users = 0  # blocks using it
        self.owner: object = None
        self.name = ""
        self.own_value: object = None  # what stands at owner.name (a staticmethod for a Function's apply)
        self.alias: object = None  # what a module's or a model's attribute bound to the target gets
        entry = self

        def dispatch(*args, **kwargs):
            if _serves(entry.target):
                return entry.replacement(*args, **kwargs)
            return entry.call(*args, **kwargs)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(dispatch, attr, getattr(original, attr))
            except (AttributeError, TypeError):
                pass
        self.dispatcher = dispatch


@dataclasses.dataclass(eq=False)
class _Frame:
    """A substitutions() block on this thread."""

    targets: frozenset
    export: bool  # entered by opbridge.export: its traces record the replacements
    warned: set


_LOCK = threading.RLock()  # the process-wide bindings below
_INSTALLED: dict[str, _Installed] = {}  # target -> its dispatcher, while a block uses it


_THREAD = threading.local()  # .frames: this thread's blocks, innermost last


def _serves(target: str) -> bool:
    """Whether a call of `target` here runs its replacement: on a thread inside a block that
    applies the rule (the innermost block decides), unless a torch.jit.trace that is not
    opbridge.export's is recording (the trace outlives the block: it records the original)."""
    frames = getattr(_THREAD, "frames", None)
    if not frames:
        return False
    frame = frames[-1]
    if target not in frame.targets:
        return False
    if frame.export or torch._C._get_tracing_state() is None:
        return True
    if target not in frame.warned:
        frame.warned.add(target)
        warnings.warn(f"substitutions(): a torch.jit.trace made inside the block records {target} as the model "
                      f"defines it, not its substitution, since the trace outlives the block; opbridge.export "
                      f"applies the substitutions to its own trace", stacklevel=3)
    return False


def _install(rule: Substitution) -> _Installed | None:
    """The dispatcher for a rule whose target's module is imported (None otherwise, or where an
    opbridge.compat module stands under the package's name)."""
    found = _resolve(rule.target)
    if found is None:
        return None
    owner, name, obj = found
    if (getattr(obj, "__module__", None) or "").startswith(_COMPAT):
        return None  # an opbridge.compat module installed under the package's name: already opbridge's ops
    if _is_function_class(obj):
        sig = _signature(obj.forward)  # apply(*args) takes forward's parameters after ctx
        sig = sig and sig.replace(parameters=list(sig.parameters.values())[1:])
        entry = _Installed(rule, obj.apply, obj.apply,
                           lambda r: r.bound_to(sig, drop_first=False) if isinstance(r, _OpCall) else r)
        entry.owner, entry.name = obj, "apply"
        entry.own_value, entry.alias = staticmethod(entry.dispatcher), entry.dispatcher
        return entry
    if isinstance(obj, torch._ops.OpOverloadPacket):  # a rule for torch.ops.<namespace>.<op>
        entry = _Installed(rule, obj, obj, lambda r: r)
        entry.owner, entry.name = owner, name
        entry.own_value = entry.alias = _OpStandIn(obj, entry.dispatcher)
        return entry
    static = inspect.getattr_static(owner, name)
    wrapper = type(static) if isinstance(static, (staticmethod, classmethod)) else None
    func = static.__func__ if wrapper is not None else static
    # A class's function is a method (self first), as a classmethod's (cls first).
    self_first = wrapper is classmethod or (isinstance(owner, type) and wrapper is None)
    entry = _Installed(rule, obj, func if wrapper is classmethod else obj,
                       lambda r: r.bound_to(_signature(func), drop_first=self_first) if isinstance(r, _OpCall) else r)
    entry.owner, entry.name = owner, name
    entry.own_value = wrapper(entry.dispatcher) if wrapper is not None else entry.dispatcher
    entry.alias = entry.own_value.__get__(None, owner) if wrapper is classmethod else entry.dispatcher
    return entry


def _release(used: list[_Installed], held: list) -> None:
    release(held)
    for entry in used:
        entry.users -= 1
        if entry.users == 0 and _INSTALLED.get(entry.target) is entry:
            del _INSTALLED[entry.target]
    used.clear()


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


_METHOD = id(types.MethodType)  # compared as ids: a metaclass's __eq__ never runs


def _rebind(spaces: list, entries: list[_Installed], held: list) -> None:
    """Every attribute of `spaces` (modules, nn.Module instances) bound to one of the originals
    (a function, or a bound method such as a Function's apply) now holds its dispatcher; one that
    another block bound already is held for this one too. One pass over every module's
    attributes for all the rules: it runs on every export. Values are matched by identity and
    type, never with their own __eq__ or __getattr__ (torch.ops' namespaces, in sys.modules,
    resolve any attribute asked for)."""
    by_id, by_method, bound = {}, {}, set()  # bound: the dispatchers' ids
    for e in entries:
        by_id[id(e.original)] = e.alias
        bound.add(id(e.alias))
        if isinstance(e.original, types.MethodType):
            by_method[(id(e.original.__func__), id(e.original.__self__))] = e.alias
    wanted = bound.union(by_id)
    for space in spaces:
        attrs = getattr(space, "__dict__", None)
        if not isinstance(attrs, dict):
            continue
        # Most namespaces hold none of these values: the same test by identity (and for methods by
        # type), done in C over the values first. A Python loop over every attribute of every module
        # was a fifth of a one-op model's export.
        values = attrs.values()
        if wanted.isdisjoint(map(id, values)) and not (by_method and _METHOD in map(id, map(type, values))):
            continue
        for key, value in list(attrs.items()):
            alias = by_id.get(id(value))
            if alias is None and by_method and type(value) is types.MethodType:
                alias = by_method.get((id(value.__func__), id(value.__self__)))
            if alias is not None:
                hold(space, key, lambda _, v=alias: v, held)
            elif id(value) in bound and is_held(space, key):
                hold(space, key, lambda _, v=value: v, held)


@contextlib.contextmanager
def substitutions(*models, only: Iterable[str] | None = None) -> Iterator[list[str]]:
    """Applies the registered substitutions (or those whose targets `only` names) for the block,
    on this thread: the model runs eagerly on opbridge's ops where it calls them (even where the
    original extension is missing or CUDA-only), and opbridge.export traces them. Yields the
    targets applied (rules whose modules are not imported do nothing). `models`
    (torch.nn.Modules; opbridge.export passes its model) also have their submodules' attributes
    that hold an operator rebound (`self.sample_fn = furthest_point_sample` in a constructor).

    Other threads keep calling the originals. A nested block applies its own rules (its only=
    included) until it ends; then the outer block's apply again. A copy of the model made inside
    the block (copy.deepcopy) holds the dispatchers, which run the originals outside any block; a
    torch.jit.trace made inside a block records the originals, with a warning (opbridge.export's own
    traces record the replacements)."""
    from .isolation import exporting_here  # isolation imports this module's dependants

    rules = _rules()
    if only is not None:
        wanted = list(only)
        unknown = sorted(set(wanted) - set(rules))
        if unknown:
            raise OpbridgeError(f"substitutions(only=...): no rule for {', '.join(unknown)}")
        rules = {t: rules[t] for t in dict.fromkeys(wanted)}
    instances = [m for model in models for m in model.modules()]
    used: list[_Installed] = []
    held: list = []
    with _LOCK:
        try:
            for rule in rules.values():
                entry = _INSTALLED.get(rule.target)
                if entry is None:
                    entry = _install(rule)
                    if entry is None:
                        continue
                    _INSTALLED[rule.target] = entry
                elif entry.rule is not rule and entry.rule.replacement is not rule.replacement:
                    entry.rule, entry.replacement = rule, entry.bind(rule.replacement)  # substitute() again
                entry.users += 1
                used.append(entry)
                hold(entry.owner, entry.name, lambda _: entry.own_value, held)
            if used:
                _rebind([*sys.modules.values(), *instances], used, held)
        except BaseException:
            _release(used, held)
            raise
    applied = [e.target for e in used]
    frames = _THREAD.__dict__.setdefault("frames", [])
    frame = _Frame(frozenset(applied), exporting_here(), set())
    frames.append(frame)
    try:
        yield applied
    finally:
        frames.remove(frame)
        with _LOCK:
            _release(used, held)
