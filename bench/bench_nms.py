"""nms: opbridge's Nms node against ONNX Runtime's own ai.onnx NonMaxSuppression, both in ONNX
Runtime, on the same boxes: 1 000, 5 000 and 20 000 boxes, spread (x1, y1 uniform in a 1000 x
1000 image, widths and heights 16 to 256: most boxes kept) and clustered (n / 20 objects, each
with 20 boxes jittered by up to 15 % of its size: most suppressed), uniform scores, IoU threshold
0.5 and 0.7, float32.
NonMaxSuppression gets its (1, N, 4) / (1, 1, N) layout, max_output_boxes_per_class = N and no
score threshold; both keep the same boxes (checked before timing). One thread each (neither
kernel threads), ONNX Runtime's thread spinning off, interleaved rounds; the ratios are medians of
per-round ratios.

    .venv/bin/python bench/bench_nms.py [--quick]      (or bench/run.sh --only nms)
"""

from __future__ import annotations

import numpy as np

from common import Row, interleaved, one_node_model, ort_session, progress

SUBJECT = "opbridge Nms (ONNX Runtime)"


def scene(n: int, seed: int, clustered: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    objects = n // 20 if clustered else n
    xy = rng.uniform(0, 1000, (objects, 2))
    wh = rng.uniform(16, 256, (objects, 2))
    if clustered:
        xy, wh = np.repeat(xy, 20, 0), np.repeat(wh, 20, 0)
        xy = xy + rng.uniform(-0.15, 0.15, (n, 2)) * wh
        wh = wh * rng.uniform(0.85, 1.15, (n, 2))
    return np.concatenate([xy, xy + wh], 1).astype(np.float32), rng.uniform(0, 1, n).astype(np.float32)


def run(quick: bool) -> list[Row]:
    sizes = (1000, 5000) if quick else (1000, 5000, 20000)
    rounds = 5 if quick else 21
    rows: list[Row] = []
    for n, clustered, thr in [(n, c, t) for n in sizes for c in (False, True) for t in (0.5, 0.7)]:
        boxes, scores = scene(n, n, clustered)
        own = one_node_model("Nms", {"boxes": boxes, "scores": scores}, {"inds": (np.int64, ["kept"])},
                             {"iou_threshold": thr}, domain="opbridge")
        std = one_node_model("NonMaxSuppression",
                             {"b": boxes[None], "s": scores[None, None], "max_out": np.array([n], np.int64),
                              "iou": np.array([thr], np.float32)}, {"selected": (np.int64, ["kept", 3])})
        s_own = ort_session(own, threads=1, spinning=False)
        s_std = ort_session(std, threads=1, with_opbridge=False, spinning=False)
        f_own = {"boxes": boxes, "scores": scores}
        f_std = {"b": boxes[None], "s": scores[None, None], "max_out": np.array([n], np.int64),
                 "iou": np.array([thr], np.float32)}
        kept = s_own.run(None, f_own)[0]
        theirs = s_std.run(None, f_std)[0][:, 2]
        if not np.array_equal(kept, theirs):
            raise AssertionError(f"n={n} iou={thr}: the two keep different boxes ({len(kept)} vs {len(theirs)})")
        name = f"nms {n} {'clustered' if clustered else 'spread'} boxes, iou {thr}: {len(kept)} kept"
        progress(name)
        rows += interleaved(name, {
            SUBJECT: lambda s=s_own, f=f_own: s.run(None, f),
            "ONNX Runtime NonMaxSuppression": lambda s=s_std, f=f_std: s.run(None, f),
        }, rounds=rounds)
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for row in run(parser.parse_args().quick):
        spread = row.ratio_spread
        ratio = "" if row.impl == SUBJECT else f"  x{spread[0]:.2f} (IQR {spread[1]:.2f}-{spread[2]:.2f})"
        print(f"{row.benchmark:55s} {row.impl:32s} {row.median_ms:9.3f} ms{ratio}")
