#!/usr/bin/env bash
# Runs every test: set-up first (idempotent, fast when nothing changed), then the C++ tests
# (CTest: kernels, registry, the Python-free ONNX Runtime consumer), then pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh -k dual_residual
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
echo "[opbridge] C++ tests (ctest)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
echo "[opbridge] Python tests (pytest)"
.venv/bin/python -m pytest -q "$@"
