"""Per-call overhead of an opbridge custom node in ONNX Runtime: a chain of opbridge::Foo nodes
(x + y, the smallest custom op) against the same chain of ai.onnx Add nodes (ONNX Runtime's own
kernel), on 1-element float32 tensors, where the arithmetic is nothing and the time is the
runtime's and the adapter's per-node work. One node and a chain of 100, one intra-op thread,
interleaved rounds (each round times a block of runs of each model). The subject is the Foo
chain; a ratio above 1 means Add is slower, below 1 that the custom node costs more. The same
chains run in OpenVINO too (libopbridge_ov.so), against OpenVINO's own Add.

Also the cost of the library to every session: creating a session of a one-node ai.onnx model with
libopbridge_ort.so registered in its options, against the same session without it (ONNX Runtime
builds the kernel definitions of every registered custom op for each session).
"""

from __future__ import annotations

import statistics


import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

import opbridge
from common import Row, interleaved, ort_session, progress


def _chain(op_type: str, domain: str, length: int, size: int | str = 1):
    """`size`: the tensors' one dimension, a number or a name (a size the model leaves dynamic)."""
    nodes = [helper.make_node(op_type, ["x" if i == 0 else f"t{i}", "y"], [f"t{i + 1}" if i + 1 < length else "z"],
                              domain=domain) for i in range(length)]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [size]) for n in ("x", "y", "z")]
    imports = [helper.make_opsetid("", 19)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph(nodes, f"{op_type}_chain", io[:2], io[2:]), opset_imports=imports,
                             ir_version=10)


def run(quick: bool) -> list[Row]:
    feeds = {"x": np.array([1.5], np.float32), "y": np.array([0.25], np.float32)}
    rows: list[Row] = []
    block = 50 if quick else 500
    for length in (1, 100):
        name = f"per-call overhead: a chain of {length} node(s) on 1-element float32 tensors, 1 thread, {block} runs"
        progress(name)
        ours = ort_session(_chain("Foo", "opbridge", length), threads=1, spinning=False)
        theirs = ort_session(_chain("Add", "", length), threads=1, spinning=False)
        want = feeds["x"] + length * feeds["y"]
        for s in (ours, theirs):
            np.testing.assert_allclose(s.run(None, feeds)[0], want)

        def blockwise(sess):
            def call():
                for _ in range(block):
                    sess.run(None, feeds)
            return call

        rows += interleaved(name, {"opbridge::Foo chain (ONNX Runtime)": blockwise(ours),
                                   "ai.onnx Add chain (ONNX Runtime's kernel)": blockwise(theirs)},
                            rounds=5 if quick else 25)
        foo, add = rows[-2], rows[-1]
        per_node = (foo.median_ms - add.median_ms) / block / length * 1e3
        inverse = statistics.median(1 / r for r in add.round_ratios)
        add.note = (f"the Foo chain takes {inverse:.2f}x this chain's time (median per round); "
                    f"{per_node * 1e3:.0f} ns more per node")
    rows += _openvino(quick, feeds, block)
    rows += _session_creation(quick)
    return rows


def _openvino(quick: bool, feeds: dict, block: int) -> list[Row]:
    """The same chains in OpenVINO's CPU plugin (float32, one infer request each), on one thread and
    every core. The plugin runs an opbridge node through its Reference node (evaluate()), and fuses
    the Add chain into one generated kernel (a Subgraph); with SNIPPETS_MODE DISABLE each Add
    stays a node of its own (Eltwise), the per-node peer. Last, the 100-node chains with the size
    left dynamic in the model (as opbridge's exports leave their batch and count sizes), where the
    plugin infers every node's output shape on every run."""
    import os

    from bench_openvino import ov_runner, thread_label

    rows: list[Row] = []
    cases = [(length, threads, 1) for length in (1, 100) for threads in (1, os.cpu_count() or 1)] + [(100, 1, "n")]
    for length, threads, size in cases:
        sizes = "" if size == 1 else ", the size dynamic in the model"
        name = (f"per-call overhead in OpenVINO: a chain of {length} node(s) on 1-element float32 tensors{sizes}, "
                f"{thread_label(threads)}, {block} runs")
        progress(name)
        foo, add = _chain("Foo", "opbridge", length, size), _chain("Add", "", length, size)
        runners = {"opbridge::Foo chain (OpenVINO, libopbridge_ov.so)": ov_runner(foo, threads),
                   "ai.onnx Add chain (OpenVINO, fused)": ov_runner(add, threads),
                   "ai.onnx Add chain (OpenVINO, a node per Add)": ov_runner(add, threads, SNIPPETS_MODE="DISABLE")}
        for runner in runners.values():
            np.testing.assert_allclose(runner(feeds), feeds["x"] + length * feeds["y"])

        def blockwise(runner):
            def call():
                for _ in range(block):
                    runner(feeds)
            return call

        rows += interleaved(name, {impl: blockwise(runner) for impl, runner in runners.items()},
                            rounds=5 if quick else 25)
        subject = rows[-3]
        for peer in rows[-2:]:
            per_node = (subject.median_ms - peer.median_ms) / block / length * 1e6
            peer.note = (f"the Foo chain takes {statistics.median(1 / r for r in peer.round_ratios):.2f}x "
                         f"this chain's time (median per round); {per_node:.0f} ns more per node")
    return rows


def _session_creation(quick: bool) -> list[Row]:
    model = _chain("Add", "", 1).SerializeToString()
    name = "session creation: a one-node ai.onnx model, 20 sessions"
    progress(name)
    options = {}
    for with_library in (True, False):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        if with_library:
            so.register_custom_ops_library(str(opbridge.builtin.ort_path))
        options[with_library] = so

    def create(so):
        def call():
            for _ in range(20):
                ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        return call

    rows = interleaved(name, {"with libopbridge_ort.so registered": create(options[True]),
                              "plain ONNX Runtime": create(options[False])}, rounds=5 if quick else 15)
    inverse = statistics.median(1 / r for r in rows[-1].round_ratios)
    rows[-1].note = f"with the library a session takes {inverse:.1f}x this one's time to create (median per round)"
    return rows
