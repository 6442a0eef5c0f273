#!/usr/bin/env bash
# Every benchmark, side by side with its peers: set-up, the benchmark-only dependencies
# (bench/requirements.txt), then bench/run.py with any arguments given here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
.venv/bin/python -m pip install -q -r bench/requirements.txt
# Open3D (knn_query's peer, in bench/.open3d-venv, made by the benchmark) loads libusb-1.0.
if ! ldconfig -p | grep -q libusb-1.0.so.0; then
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q libusb-1.0-0 >/dev/null || echo "[bench] could not install libusb-1.0-0: Open3D will be skipped" >&2
  else echo "[bench] Open3D needs the libusb-1.0-0 Debian package (sudo apt-get install libusb-1.0-0); it will be skipped" >&2; fi
fi
exec .venv/bin/python bench/run.py "$@"
