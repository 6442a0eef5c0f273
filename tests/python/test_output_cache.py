"""Large eager outputs reuse the memory of earlier ones (adapters/torch/output_cache.h): measured
by page faults, not time. Each case runs in a fresh process, as the cache's size is read once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# my_add on 4 M float32 (16 MiB out): the minor page faults of the output's first write, per call,
# after a warm-up call whose output is freed. A fresh 16 MiB block is 4096 pages.
PROBE = r"""
import resource, sys, torch, opbridge
a, b = torch.randn(4 << 20), torch.randn(4 << 20)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
del_first = torch.ops.opbridge.my_add(a, b); del del_first
counts = []
for _ in range(3):
    before = faults()
    out = torch.ops.opbridge.my_add(a, b)
    counts.append(faults() - before)
    assert torch.equal(out, 2 * a + b)
    del out
# A reused block is an ordinary resizable tensor storage.
out = torch.ops.opbridge.my_add(a, b)
out.resize_(8 << 20)
out[4 << 20:] = 1.0
assert torch.equal(out[: 4 << 20], 2 * a + b) and bool((out[4 << 20:] == 1).all())
print(max(counts))
"""


def probe(cache_mb: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "OPBRIDGE_OUTPUT_CACHE_MB"}
    if cache_mb is not None:
        env["OPBRIDGE_OUTPUT_CACHE_MB"] = cache_mb
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def fresh_pages_fault_one_by_one() -> bool:
    # With transparent huge pages always on, a fresh block faults in 2 MiB at a time.
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return not (thp.exists() and "[always]" in thp.read_text())


def test_large_outputs_reuse_freed_memory():
    assert probe(None) < 4096 // 8


@pytest.mark.parametrize("cache_mb", ["0", "8"])
def test_cache_off_or_smaller_than_the_output_keeps_nothing(cache_mb):
    # 0 turns the cache off; a cap below the block's 16 MiB drops it when freed.
    if not fresh_pages_fault_one_by_one():
        pytest.skip("transparent huge pages are always on here: fresh blocks fault in few large pages")
    assert probe(cache_mb) >= 4096 * 3 // 4
