"""Attributes of other packages' objects that opbridge rebinds for a block (substitution's
dispatchers, the dynamo export's patches of torch's exporter). Blocks on several threads share one
binding: the first in sets it, the last out puts back what was there. (Each saving and restoring
its own would let a later block save an earlier one's value as the original and leave it in place.)"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Iterator

_LOCK = threading.Lock()


@dataclasses.dataclass
class _Held:
    owner: object
    name: str
    own: bool  # the owner had the attribute itself (else it was inherited: deleted again)
    old: object
    count: int = 0  # blocks holding it


_HELD: dict[tuple[int, str], _Held] = {}  # (id(owner), name) -> the binding, while a block holds it


def hold(owner, name: str, make: Callable[[object], object], held: list) -> None:
    """owner.name = make(what it held) until the last block holding it releases it; `held` is the
    block's list of what it holds (a block holds each binding once)."""
    key = (id(owner), name)
    if key in held:
        return
    with _LOCK:
        h = _HELD.get(key)
        if h is None:
            attrs = vars(owner)
            h = _HELD[key] = _Held(owner, name, name in attrs, attrs.get(name))
            setattr(owner, name, make(h.old))
        h.count += 1
    held.append(key)


def is_held(owner, name: str) -> bool:
    return (id(owner), name) in _HELD


def release(held: list) -> None:
    """The block's bindings released, the last holder's putting back what was there."""
    with _LOCK:
        for key in reversed(held):
            h = _HELD[key]
            h.count -= 1
            if h.count == 0:
                del _HELD[key]
                if h.own:
                    setattr(h.owner, h.name, h.old)
                else:
                    delattr(h.owner, h.name)
    held.clear()


@contextlib.contextmanager
def holding(owner, name: str, make: Callable[[object], object]) -> Iterator[None]:
    """owner.name = make(original) for the block, shared with other threads' blocks."""
    held: list = []
    hold(owner, name, make, held)
    try:
        yield
    finally:
        release(held)
