#!/usr/bin/env bash
# Sets up everything opbridge needs on a fresh Debian machine, then builds it:
#   Debian build packages -> .venv (pinned Python deps) -> ONNX Runtime SDK -> CMake build
#   -> the op libraries and CMake package installed into the Python package (python/opbridge/_sdk)
#   -> the package installed editable (pyproject.toml).
# Running it again is fast and changes nothing when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { echo "[opbridge] $*"; }

# 1. Debian packages (only when one is missing).
apt_pkgs=(cmake ninja-build g++ ccache libgtest-dev libgmock-dev libeigen3-dev libcli11-dev nlohmann-json3-dev openssl npm python3-venv graphviz)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come from another installation (e.g. a Node.js build already on PATH).
if command -v npm >/dev/null; then missing=("${missing[@]/npm}"); fi
# Debian's python3 has the venv module but not ensurepip (python3-venv), which venv needs.
if command -v python3 >/dev/null && python3 -c 'import ensurepip' >/dev/null 2>&1; then missing=("${missing[@]/python3-venv}"); fi
read -r -a missing <<<"${missing[*]:-}"
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. Python virtual environment with the pinned dependencies.
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  say "creating .venv"
  rm -rf .venv  # a half-made one (e.g. from a failed earlier run) is replaced
  python3 -m venv .venv
  rm -f .venv/.opbridge-requirements
fi
req_stamp=.venv/.opbridge-requirements
if ! cmp -s requirements.txt "$req_stamp"; then
  say "installing Python dependencies (requirements.txt)"
  .venv/bin/python -m pip install -q -r requirements.txt
  cp requirements.txt "$req_stamp"
fi
py=.venv/bin/python

# 3. ONNX Runtime C/C++ SDK (skipped when ONNXRUNTIME_ROOT points at an official release).
ort_root=${ONNXRUNTIME_ROOT:-$root/third_party/onnxruntime}
if [ -z "${ONNXRUNTIME_ROOT:-}" ]; then
  scripts/fetch_ort_sdk.sh "$ort_root"
fi

# 4. Configure, build and install the C++ side. The install tree lands inside the Python
#    package (python/opbridge/_sdk): op libraries, headers and the CMake package for users.
torch_prefix=$($py -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
jobs=${OPBRIDGE_JOBS:-$(nproc)}
# Configure when never configured (or a configure failed), or when ONNXRUNTIME_ROOT changed.
# OpenVINO's CMake package comes with the `openvino` wheel (requirements.txt).
ov_dir=$($py -c 'import openvino, os; print(os.path.join(os.path.dirname(openvino.__file__), "cmake"))' 2>/dev/null || true)
cached_ort=$(sed -n 's/^ONNXRUNTIME_ROOT:PATH=//p' build/CMakeCache.txt 2>/dev/null || true)
cached_ov=$(sed -n 's/^OpenVINO_DIR:[A-Z]*=//p' build/CMakeCache.txt 2>/dev/null || true)
case $cached_ov in *NOTFOUND) cached_ov= ;; esac
if [ ! -f build/build.ninja ] || [ "$cached_ort" != "$ort_root" ] || [ "$cached_ov" != "$ov_dir" ]; then
  say "configuring (build/, ONNX Runtime from $ort_root${ov_dir:+, OpenVINO from $ov_dir})"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DONNXRUNTIME_ROOT="$ort_root" \
    ${ov_dir:+-DOpenVINO_DIR="$ov_dir"} \
    -DCMAKE_INSTALL_PREFIX="$root/python/opbridge/_sdk" >/dev/null
fi
say "building (build/, $jobs jobs)"
start=$(date +%s)
cmake --build build -j "$jobs"
cmake --install build >/dev/null
say "build done in $(( $(date +%s) - start ))s"

# 5. The Python package, editable: the python/ directory on the venv's path and the `opbridge`
#    and `opbridge-run` commands, from pyproject.toml (scikit-build-core; no CMake run here, the
#    build above is the one). No isolated build: it would download another torch. Reinstalled
#    when pyproject.toml changed, so that new metadata reaches existing checkouts too.
#    (`pip install --no-build-isolation .` is the other route: it builds and installs a copy.)
py_stamp=.venv/.opbridge-pyproject
if ! $py -c 'import opbridge' >/dev/null 2>&1 || ! cmp -s pyproject.toml "$py_stamp"; then
  say "installing the opbridge Python package (editable)"
  $py -m pip install -q --no-build-isolation --no-deps -e . -Cwheel.cmake=false -Ceditable.mode=inplace
  cp pyproject.toml "$py_stamp"
fi
say "ready: . .venv/bin/activate"
