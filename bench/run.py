"""Runs the benchmarks and prints one table of medians and ratios, plus a JSON file.

    bench/run.sh                      # set-up, benchmark-only dependencies, every benchmark
    bench/run.sh --only knn_query     # one module (bench/bench_knn_query.py)
    bench/run.sh --quick              # smaller sizes, for a smoke run

Ratios are peer time / opbridge time (above 1: opbridge is faster): for benchmarks timed in
interleaved rounds, the median of the per-round ratios with its 25th-75th percentile spread;
otherwise a ratio of medians. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# OpenMP threads (torch's, pykdtree's) sleep as soon as a parallel region ends instead of spinning,
# as ONNX Runtime's do in every benchmark session (spinning off): otherwise a row runs in the wake
# of the previous row's spinning threads, which on 2 cores slowed it by up to 15%. Read once, when
# each OpenMP runtime starts: so before anything imports torch. An explicit setting is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from common import Row, progress  # noqa: E402


def modules() -> list[str]:
    return sorted(p.stem[len("bench_"):] for p in HERE.glob("bench_*.py"))


def table(rows: list[Row]) -> str:
    bw = max([len("benchmark")] + [len(r.benchmark) for r in rows])
    iw = max([len("implementation")] + [len(r.impl) for r in rows])
    lines = [f"{'benchmark':<{bw}} {'implementation':<{iw}} {'median ms':>10} {'min ms':>9} {'ratio':>20}"]
    for r in rows:
        first = _first(rows, r.benchmark)
        spread = r.ratio_spread
        if r is first:
            ratio = "subject"
        elif spread:  # interleaved rounds: the median of per-round ratios, and their spread
            ratio = f"{spread[0]:.2f}x [{spread[1]:.2f}-{spread[2]:.2f}]"
        else:
            ratio = f"{r.median_ms / first.median_ms:.2f}x"
        lines.append(f"{r.benchmark:<{bw}} {r.impl:<{iw}} {r.median_ms:>10.3f} {r.min_ms:>9.3f} {ratio:>20}"
                     + (f"  ({r.note})" if r.note else ""))
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _first(rows: list[Row], benchmark: str) -> Row:
    return next(r for r in rows if r.benchmark == benchmark)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated benchmark modules: " + ", ".join(modules()))
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    ap.add_argument("--json", default=str(HERE / "results.json"), help="where to write the results")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else modules()
    unknown = sorted(set(names) - set(modules()))
    if unknown:
        ap.error(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(modules())})")
    rows: list[Row] = []
    failed: list[str] = []
    for name in names:
        progress(f"{name} ...")
        try:
            rows += importlib.import_module(f"bench_{name}").run(args.quick)
        except Exception:  # noqa: BLE001 - one benchmark's failure (a wrong answer) keeps the others' rows
            progress(f"{name} FAILED:\n{traceback.format_exc()}")
            failed.append(name)
    print(table(rows))
    print("ratio = time / the first row of its benchmark (opbridge); above 1: opbridge is faster. Rows timed in "
          "interleaved rounds give the median of per-round ratios [25th-75th percentile]; others a ratio of medians")
    import torch

    out = {
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "cpu": _cpu_name(),
                    "torch_threads": torch.get_num_threads(), "omp_wait_policy": os.environ["OMP_WAIT_POLICY"]},
        "quick": args.quick,
        "results": [
            {"benchmark": r.benchmark, "impl": r.impl, "median_ms": r.median_ms, "min_ms": r.min_ms,
             "ratio_to_opbridge": r.ratio_spread[0] if r.ratio_spread else r.median_ms / _first(rows, r.benchmark).median_ms,
             "ratio_p25_p75": list(r.ratio_spread[1:]) if r.ratio_spread else None,
             "round_ratios": r.round_ratios, "times_ms": r.times_ms, "note": r.note}
            for r in rows
        ],
    }
    Path(args.json).write_text(json.dumps(out, indent=2))
    progress(f"wrote {args.json}")
    if failed:
        progress(f"failed: {', '.join(failed)} (tracebacks above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
