"""What an export says when it fails or fixes a value: the exporters' own errors, unwrapped to the
op, the Python-level operator or the line of the model that caused them; the TorchScript trace's
warnings, once per line."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch

from .._library.errors import OpbridgeError, exception_chain
from .._library.registry import libraries
from .foreign import failed_in_package
from .substitution import substitution_rules

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour codes in the dynamo exporter's messages


@contextlib.contextmanager
def op_errors():
    """An error raised inside an autograd.Function no substitution rule covers names it and where
    the model calls it (unsubstituted). An op's own error ("<ns>::<op>: reason") or
    opbridge's, raised while an exporter traces the model, is re-raised as itself, not under layers of exporter errors; another failure the dynamo
    exporter wraps ("Failed to ... Next steps:") becomes its step, node and root cause, in a line."""
    try:
        yield
    except OpbridgeError:
        raise
    except Exception as e:
        why = unsubstituted(e)
        if why:
            raise OpbridgeError(why) from e
        call = failed_in_package(e)
        if call is not None:
            raise OpbridgeError(
                f"the model calls {call.entry}" + (f" at {call.where}" if call.where else "") + ", which hands "
                f"tensors to compiled code the exporter cannot trace (in {call.inner}). No substitution rule covers "
                "it. Add one that computes it on opbridge's or PyTorch's ops:\n" + call.advice()) from e
        namespaces = {lib.torch_namespace for lib in libraries()}
        cur, seen, node, root = e, set(), "", e
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            first = (_ANSI.sub("", str(cur)).strip().splitlines() or [""])[0]
            m = re.match(r"(\w+)::\w+: ", first)
            if isinstance(cur, OpbridgeError) or (m and m.group(1) in namespaces):
                raise OpbridgeError(str(cur) if isinstance(cur, OpbridgeError) else first) from e
            m = re.match(r"Error when translating node .*?target=([\w.:]+)", first)
            node = node or (f" (translating {m.group(1)})" if m else "")
            root = cur if cur is root.__cause__ else root  # the root cause: __cause__ links only
            cur = cur.__cause__ or cur.__context__
        if not isinstance(e, torch.onnx.errors.OnnxExporterError) or e.__cause__ is None:
            raise  # not a wrapper: the TorchScript exporter raises the cause itself
        step = re.split(r"\.(?:\s|$)", _ANSI.sub("", str(e)).strip())[0]
        cause = (_ANSI.sub("", str(root)).strip().splitlines() or [""])[0]
        raise OpbridgeError(f"{step}{node}: {type(root).__name__}" + (f": {cause}" if cause else "")
                            + _data_dependent(root)) from e


def _data_dependent(root: BaseException) -> str:
    """For torch.export's refusal of a Python condition on a value read from the data
    (GuardOnDataDependentSymNode): where the model asks it, and the ways out; "" otherwise."""
    if "DataDependent" not in type(root).__name__:
        return ""
    text = _ANSI.sub("", str(root))
    m = re.search(r'The following call raised this error:\s*File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)', text)
    where = f" at {m.group(1)}:{m.group(2)} in {m.group(3)} (`{m.group(4).strip()}`)" if m else ""
    return (f"\nThe model's Python code{where} depends on a value computed from the inputs (a size or a "
            f"number read from a tensor), which torch.export cannot trace. The TorchScript exporter records "
            f"the path these inputs take: export with exporter='torchscript' (and verify it at other inputs), "
            f"or change the condition (torch._check(...) to state what holds, torch.cond for a real branch).")


_TORCH_DIR = str(Path(torch.__file__).parent)  # frames of PyTorch's own code


def unsubstituted(error: BaseException) -> str | None:
    """When `error` (or an exception it wraps) was raised inside an autograd.Function's forward
    that no rule covers, what to say: the Function, where it is defined, where the model called
    it, and how to add a rule. None otherwise."""
    for cur, frames in exception_chain(error):
        for k in range(len(frames) - 1, -1, -1):  # the innermost Function forward
            ctx = frames[k].f_locals.get("ctx") if frames[k].f_code.co_name == "forward" else None
            cls = getattr(ctx, "_forward_cls", None)
            if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
                continue
            target = f"{cls.__module__}.{cls.__qualname__}"
            if target in {r.target for r in substitution_rules()}:
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
    return None
