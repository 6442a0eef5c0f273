#!/usr/bin/env python3
"""OpenMMLab's model zoos on opbridge: one config per folder of the configs the mmdet 3.3.0 wheel
(or, with --package mmdet3d, the mmdet3d 1.4.0 wheel) ships, each built with random weights and run
eagerly, then exported (mmdet: the TorchScript exporter; mmdet3d: the dynamo exporter, which keeps
writes made through views that mmdet3d's voxel encoders make) and compared with ONNX Runtime, by the
tests' runner in the environment the tests make (mmcv-lite 2.1.0, mmengine 0.10.7):
tests/python/mmdet_models.py (one 320x320 image, tensor mode) or tests/python/mmdet3d_models.py
(a random LiDAR cloud, the model from raw points).

    .venv/bin/python scripts/mmdet_sweep.py [--package mmdet|mmdet3d] [--results FILE]
        [--only FOLDER ...] [--again] [--table [--earlier FILE]]

Resumable: each model's report is appended to the results file (one JSON line,
build/<package>_sweep.jsonl by default) as it finishes, and a folder already there is skipped, so the
sweep can stop and go on across sessions. --again runs the folders --only names even if they are
there (after a fix); a folder's last report is the one that counts. --table prints the summary docs/models.md shows. A
model gets 15 minutes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import envs  # noqa: E402  the tests' environments
import test_mmdet  # noqa: E402  its requirements
import test_mmdet3d  # noqa: E402

# Per package: its environment, the runner, what the export is, and the configs whose name is
# the folder's plainest model (when the folder has one; else the first config by name that is
# not a _base_ file).
PACKAGES = {
    "mmdet": {"environment": ("mmdet-3.3.0", test_mmdet.MMDET), "runner": "mmdet_models.py",
              "export": "tensor mode", "exporter": "torchscript", "preferred": ("r50_fpn_1x_coco", "r50_fpn_1x", "r50", "1x_coco")},
    "mmdet3d": {"environment": ("mmdet3d-1.4.0", test_mmdet3d.MMDET3D), "runner": "mmdet3d_models.py",
                "export": "from raw points", "exporter": "dynamo", "preferred": ("kitti-3d-car", "kitti-3d-3class", "nus-3d", "kitti")},
}


def pick(folder: Path, preferred: tuple[str, ...]) -> Path | None:
    configs = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    for want in preferred:
        for config in configs:
            if want in config.stem:
                return config
    return configs[0] if configs else None


def _matches(exported: dict) -> bool:
    return exported["max_rel_diff"] < 1e-4 and not exported["integer_mismatches"] and \
        exported.get("differing_rows", 0) <= 2  # the bar tests/python/test_mmdet.py sets


def stage(report: dict, exporter: str = "torchscript") -> str:
    """The last stage a model passed: build, predict, export, match (or nothing)."""
    exported = report.get(exporter)
    if isinstance(exported, dict):
        return "match" if _matches(exported) else "export"
    if report.get("predict") == "ok":
        return "predict"
    return "build" if report.get("build") == "ok" else "none"


def _reports(results: Path) -> dict[str, dict]:
    last = {}  # by folder: the last report counts (--again appends a newer one)
    for line in results.read_text().splitlines():
        if line.strip():
            report = json.loads(line)
            last[report["config"].split("/")[0]] = report
    return last


def table(results: Path, earlier: Path | None = None, export: str = "tensor mode", exporter: str = "torchscript") -> str:
    """The summary; folders `results` lacks are taken from `earlier` (a results file of an
    earlier sweep, run before later fixes), marked so."""
    last = _reports(results)
    if earlier is not None:
        for folder, report in _reports(earlier).items():
            last.setdefault(folder, {**report, "earlier": True})
    reports = list(last.values())
    order = ("none", "build", "predict", "export", "match")
    reached = collections.Counter(order.index(stage(r, exporter)) for r in reports)
    at_least = {name: sum(n for i, n in reached.items() if i >= order.index(name)) for name in order[1:]}
    from_earlier = sum(bool(r.get("earlier")) for r in reports)
    lines = [f"{len(reports)} configs{f' ({from_earlier} from the earlier run)' if from_earlier else ''}: "
             f"{at_least['build']} build, {at_least['predict']} predict eagerly, "
             f"{at_least['export']} export ({'TorchScript' if exporter == 'torchscript' else 'dynamo'} exporter, {export}), {at_least['match']} match eager "
             "in ONNX Runtime. Those that match: " +
             ", ".join(f"`{r['config'].split('/')[0]}`" + (" (earlier run)" if r.get("earlier") else "")
                       for r in sorted(reports, key=lambda r: r["config"])
                       if stage(r, exporter) == "match") + ".", ""]
    in_openvino = [r[exporter]["openvino"] for r in reports if stage(r, exporter) == "match" and "openvino" in r[exporter]]
    if in_openvino:
        lines += [f"OpenVINO: of the {len(in_openvino)} that match and were also run in OpenVINO (reports from before "
                  f"the runner ran it have none), {sum(isinstance(o, dict) and _matches(o) for o in in_openvino)} match "
                  "there too.", ""]
    lines += ["The others:", "",
             "| config | reached | why not further | missing mmcv._ext functions |", "|---|---|---|---|"]
    for r in sorted(reports, key=lambda r: r["config"]):
        s = stage(r, exporter)
        why = ""
        if s == "match":
            continue
        if s != "match":
            key = {"none": "build", "build": "predict", "predict": exporter, "export": exporter}[s]
            value = r.get(key, "")
            why = (value if isinstance(value, str) else f"max relative difference {value['max_rel_diff']:.2g}, "
                   f"{value['integer_mismatches']} unequal integers, {value.get('differing_rows', 0)} differing rows")
            why = " ".join(why.split())[:200].replace("|", "\\|") if why else ""
        lines.append(f"| {r['config']} | {s}{' (earlier run)' if r.get('earlier') else ''} | {why} | "
                     f"{', '.join(r.get('missing', []))} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", choices=sorted(PACKAGES), default="mmdet")
    parser.add_argument("--results", type=Path, help="default: build/<package>_sweep.jsonl")
    parser.add_argument("--only", nargs="*", help="configs folders to run (default: all)")
    parser.add_argument("--again", action="store_true", help="run the --only folders even if already done")
    parser.add_argument("--table", action="store_true", help="print the summary table and stop")
    parser.add_argument("--earlier", type=Path, help="with --table: an earlier run's results, for the folders "
                        "the results file lacks")
    args = parser.parse_args()
    package = PACKAGES[args.package]
    args.results = args.results or ROOT / "build" / f"{args.package}_sweep.jsonl"
    if args.table:
        print(table(args.results, args.earlier, package["export"], package["exporter"]))
        return
    python = envs.python_with(*package["environment"], on_top=True)
    configs = Path(subprocess.run([str(python), "-c", f"import {args.package}, pathlib; "
                                   f"print(pathlib.Path({args.package}.__file__).parent / '.mim' / 'configs')"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    done = set()
    if args.again and not args.only:
        parser.error("--again re-runs the folders --only names")
    if args.results.is_file() and not args.again:
        done = {json.loads(line)["config"].split("/")[0] for line in args.results.read_text().splitlines() if line}
    folders = [f for f in sorted(configs.iterdir()) if f.is_dir() and not f.name.startswith("_")
               and (not args.only or f.name in args.only)]
    todo = [f for f in folders if f.name not in done]
    print(f"{len(folders)} folders, {len(folders) - len(todo)} already in {args.results}, {len(todo)} to run",
          flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    for i, folder in enumerate(todo, 1):
        config = pick(folder, package["preferred"])
        if config is None:
            report = {"config": f"{folder.name}/", "build": "no config in the folder"}
        else:
            relative = str(config.relative_to(configs))
            start = time.monotonic()
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "report.json"
                try:
                    subprocess.run([str(python), str(ROOT / "tests" / "python" / package["runner"]), relative,
                                    str(out), package["exporter"]], capture_output=True, text=True, timeout=900,
                                   env={**os.environ, "PYTHONPATH": str(ROOT / "tests" / "python")})
                    report = json.loads(out.read_text()) if out.is_file() else \
                        {"config": relative, "build": "the runner died without a report"}
                except subprocess.TimeoutExpired:
                    report = {"config": relative, "build": "did not finish in 15 minutes"}
            report["seconds"] = round(time.monotonic() - start, 1)
        with args.results.open("a") as f:
            f.write(json.dumps(report) + "\n")
        print(f"[{i}/{len(todo)}] {report['config']}: {stage(report, package['exporter'])} ({report.get('seconds', 0)} s)", flush=True)
    print(table(args.results, export=package["export"], exporter=package["exporter"]))


if __name__ == "__main__":
    main()
