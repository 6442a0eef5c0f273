#!/usr/bin/env bash
# Builds the optional test oracles that PyPI ships as source only, torch_scatter and torch_cluster,
# against the torch in .venv, and installs them there; the tests that compare with them
# (ops/segment_reduce, ops/furthest_point_sampling, ops/ball_query) then run instead of skipping.
# Each compiles against torch's headers: about 10-15 minutes apiece on 2 cores, so neither
# scripts/setup.sh nor CI runs this. The wheels are cached per torch version in
# $OPBRIDGE_ORACLES (default ~/.cache/opbridge/oracles): a second run only installs them.
# Run scripts/setup.sh first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { echo "[opbridge] $*"; }
py=.venv/bin/python
[ -x "$py" ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }

packages=(torch-scatter==2.1.2 torch-cluster==1.6.3)
torch_version=$($py -c 'import torch; print(torch.__version__)')
cache=${OPBRIDGE_ORACLES:-$HOME/.cache/opbridge/oracles}/torch-$torch_version
mkdir -p "$cache"
for spec in "${packages[@]}"; do
  name=${spec%%==*}; version=${spec##*==}
  wheel=$(ls "$cache"/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    say "building $spec against torch $torch_version (compiles against torch's headers: minutes)"
    start=$(date +%s)
    # --no-build-isolation: the build must see .venv's torch, the one the extension links to.
    MAX_JOBS=${OPBRIDGE_JOBS:-$(nproc)} $py -m pip wheel -q --no-deps --no-build-isolation --no-binary "$name" \
      "$spec" -w "$cache"
    say "built $spec in $(( $(date +%s) - start )) s"
    wheel=$(ls "$cache"/"${name//-/_}"-"$version"-*.whl | head -n1)
  fi
  say "installing $(basename "$wheel")"
  $py -m pip install -q --no-deps --force-reinstall "$wheel"
done
# torch_cluster imports scipy (its nearest()); the version the benchmarks pin.
scipy=$(grep -E '^scipy==' bench/requirements.txt)
$py -m pip install -q "$scipy"
$py -c 'import torch_scatter, torch_cluster; print("[opbridge] oracles:", "torch_scatter", torch_scatter.__version__,
"torch_cluster", torch_cluster.__version__)'
