#!/usr/bin/env bash
# Every benchmark, side by side with its peers: set-up, the benchmark-only dependencies
# (bench/requirements.txt), then bench/run.py with any arguments given here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
.venv/bin/python -m pip install -q -r bench/requirements.txt
exec .venv/bin/python bench/run.py "$@"
