#!/usr/bin/env bash
# Runs the tests, set-up first (idempotent, fast when nothing changed):
#   scripts/test.sh                 the C++ tests (CTest: kernels, registry, the Python-free ONNX
#                                   Runtime consumer), then pytest on every core (pytest-xdist),
#                                   all but the tests marked `environments`;
#   scripts/test.sh --environments  the tests that make whole Python environments with pip and
#                                   build or run in them (the wheel, ONNX Runtime releases, real
#                                   models' packages); CI runs them after the first;
#   scripts/test.sh --all           both.
# Extra arguments go to pytest, e.g. scripts/test.sh -k dual_residual (-n 0: one process).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
what=main
case "${1:-}" in
  --environments) what=environments; shift ;;
  --all) what=all; shift ;;
esac
scripts/setup.sh
# Workers share the cores: OpenMP threads that spin after each parallel region (libgomp's
# default) took the other worker's time; passive ones sleep (measured: 9 min against 10).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# The op libraries the tests build as a user's project would (tests/python/extra_library): kept
# in build/ between runs, where Ninja brings them up to date, instead of built afresh per run.
export OPBRIDGE_TEST_EXTRA_BUILD=${OPBRIDGE_TEST_EXTRA_BUILD:-$root/build/test-extra-library}
# --dist loadscope: a test class (an op's suite) or module stays on one worker, with its fixtures.
pytest=(.venv/bin/python -m pytest -q -n auto --dist loadscope)
if [ "$what" != environments ]; then
  echo "[opbridge] building the C++ tests (not part of the set-up's build)"
  cmake --build build --target opbridge_tests -j "${OPBRIDGE_JOBS:-$(nproc)}"
  echo "[opbridge] C++ tests (ctest)"
  ctest --test-dir build --output-on-failure -j "$(nproc)"
  echo "[opbridge] Python tests (pytest)"
  "${pytest[@]}" -m "not environments" "$@"
fi
if [ "$what" != main ]; then
  echo "[opbridge] Python tests that make environments (pytest -m environments)"
  "${pytest[@]}" -m environments "$@"
fi
