"""Where each built-in op lives: shared by the tests that check every op has its test and doc."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def op_homes() -> dict[str, str]:
    """Op name -> its folder under ops/: the folder whose <folder>.cc defines it (a family of ops,
    such as an op and its backward op, lives, is tested and is documented in one folder)."""
    homes = {}
    for source in sorted(ROOT.glob("ops/*/*.cc")):
        if source.stem == source.parent.name:
            for name in re.findall(r"OPBRIDGE_OP\((\w+)\)", source.read_text()):
                homes[name] = source.parent.name
    return homes
