"""What the second-size proof costs opbridge.export: each real model of docs/models.md exported with
its natural dynamic axis, with prove_dynamic on and off, in interleaved rounds (one export of each
per round, so a noisy machine slows both alike). Prints the median extra seconds per export and the
median of the per-round ratios with their spread.

Run it with the python of the model's environment (tests/python/envs.py makes them: e.g.
~/.cache/opbridge/envs/py311-transformers-5.23/bin/python), from the project root:

    <env python> bench/second_size_cost.py deformable_detr pyg_dgcnn [--rounds 3]

A model whose export is refused (or warns that an axis is not proven) says so instead of a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python"), os.path.join(HERE, "..", "tests", "python")]

import torch  # noqa: E402

import opbridge  # noqa: E402
import real_models  # noqa: E402
from opbridge._library.kinds import tensor_leaves  # noqa: E402

# The axis each model is deployed with dynamic: {flattened input index: {axis: name}}.
AXES = {
    "deformable_detr": {0: {0: "batch"}},
    "pointnet2_cls": {0: {1: "points"}, 1: {2: "points"}},
    "pointnet2_seg": {0: {1: "points"}, 1: {2: "points"}},
    "pyg_dgcnn": {0: {0: "points"}, 1: {0: "points"}},
    "pyg_pointnet2": {0: {0: "points"}, 1: {0: "points"}},
}


def _export(model, args, exporter: str, axes: dict, prove: bool) -> float:
    names = [f"in{i}" for i in range(len(tensor_leaves(args)))]
    dynamic = {names[i]: spec for i, spec in axes.items()}
    start = time.perf_counter()
    opbridge.export(model, args, exporter=exporter, input_names=names, dynamic_axes=dynamic, prove_dynamic=prove)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", choices=sorted(AXES))
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    print(f"{'model':<16} {'exporter':<12} {'export s':>9} {'+ proof s':>10} {'extra s':>8} {'ratio [spread]':>22}")
    for name in opts.models:
        model, args, *_ = real_models.MODELS[name]()
        for exporter in opbridge.EXPORTERS:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", opbridge.UnprovenWarning)
                    warnings.simplefilter("ignore", torch.jit.TracerWarning)
                    _export(model, args, exporter, AXES[name], True)  # warm-up (and refused or not)
                    plain, proven = [], []
                    for _ in range(opts.rounds):
                        plain.append(_export(model, args, exporter, AXES[name], False))
                        proven.append(_export(model, args, exporter, AXES[name], True))
            except Exception as e:  # noqa: BLE001 - the table says why
                print(f"{name:<16} {exporter:<12} {type(e).__name__}: {str(e).splitlines()[0][:150]}")
                continue
            ratios = sorted(p / q for p, q in zip(proven, plain))
            extra = statistics.median(p - q for p, q in zip(proven, plain))
            print(f"{name:<16} {exporter:<12} {statistics.median(plain):>9.2f} {statistics.median(proven):>10.2f} "
                  f"{extra:>8.2f} {statistics.median(ratios):>8.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]")


if __name__ == "__main__":
    main()
