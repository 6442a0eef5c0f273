"""The README's example runs as written."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs(tmp_path, capsys):
    text = (ROOT / "README.md").read_text()
    example = text.split("## Example", 1)[1]
    code = re.search(r"```python\n(.*?)```", example, re.S).group(1)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert out.count("ok") >= 4 and "MISMATCH" not in out
    assert "(9, 8)" in out
    assert (tmp_path / "block_dynamo.onnx").exists() and (tmp_path / "block_torchscript.onnx").exists()
