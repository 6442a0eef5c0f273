#!/usr/bin/env bash
# The main job on a fresh clone: set everything up, build, then run the end-to-end demo
# (export with both exporters, check, run in ONNX Runtime, compare with PyTorch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
