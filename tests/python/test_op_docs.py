"""Each op's doc states its PyTorch signature exactly as PyTorch prints it: the doc is checked
against the schema the torch adapter generated, so it cannot drift from the definition."""

import re
from pathlib import Path

import pytest

import opbridge
from op_layout import op_homes

ROOT = Path(__file__).resolve().parents[2]
OPS = [op for op in opbridge.builtin.ops if op.defines_torch_op]


# An op is documented with its family (the op it differentiates, the ops of its folder).
DOC_OF = op_homes()


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_doc_signature_is_pytorchs(op):
    text = (ROOT / "docs" / "ops" / f"{DOC_OF.get(op.name, op.name)}.md").read_text()
    schema = str(op.overload._schema)
    # Signatures sit in backticks and may wrap over lines (fenced code blocks are not inline code).
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    quoted = [" ".join(q.split()) for q in re.findall(r"`([^`]+)`", text)]
    assert schema in quoted, f"docs/ops/{op.name}.md does not state PyTorch's signature `{schema}`"


REPLACING = [op for op in opbridge.builtin.ops if op.replaces]


@pytest.mark.parametrize("op", REPLACING, ids=[op.name for op in REPLACING])
def test_doc_names_every_python_operator_the_op_replaces(op):
    doc = f"docs/ops/{DOC_OF.get(op.name, op.name)}.md"
    text = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
    quoted = {" ".join(q.split()) for q in re.findall(r"`([^`]+)`", text)}
    missing = [p.target for p in op.replaces if p.target not in quoted]
    assert not missing, f"{doc} does not name the substitution targets of {op.name}: {missing}"
