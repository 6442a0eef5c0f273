"""Large eager outputs reuse the memory of earlier ones (adapters/torch/output_cache.h): measured
by page faults, not time. A reused block never aliases a live tensor, whatever keeps memory of an
earlier output alive (views, resize_, set_, autograd, threads, torch.compile, fork), and the
memory held stays bounded. Cases that need a cache size of their own, or a fork, run in a fresh
process: the cache's size is read once per process."""

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge  # noqa: F401  (torch.ops.opbridge)

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


# ---- a cached output never aliases a live tensor ----------------------------------------------
# The tests below run ops in ways that keep memory of earlier outputs alive past their tensors
# (views, resize_, set_, autograd, threads, torch.compile, fork) and check two things after every
# call: the new output's bytes overlap no live tensor's, and every live tensor still holds the
# values computed for it independently by torch's own ops (my_add(a, b) = 2a + b and
# dual_residual(x, y, 0.5) = (x/2 - y, y/2 - x) round once, as torch does: equal bits). A
# cache that handed out a block still in use would fail both: the overlap at once, the values
# once the new output is written.

MiB = 1 << 20
ops = torch.ops.opbridge


def randn(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def span(x) -> tuple[int, int]:
    """The bytes [start, end) of the memory x keeps: a tensor's whole storage, a storage's, a numpy
    array's data, or (start, end) itself."""
    if isinstance(x, tuple):
        return x
    if isinstance(x, np.ndarray):
        start = x.__array_interface__["data"][0]
        return start, start + x.nbytes
    s = x if isinstance(x, torch.UntypedStorage) else x.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def assert_apart(new, live) -> None:
    """`new`, a fresh output, shares no byte with anything in `live`."""
    lo, hi = span(new)
    for other in live:
        a, b = span(other)
        assert max(lo, a) >= min(hi, b), f"a new output's bytes [{lo:#x}, {hi:#x}) overlap live [{a:#x}, {b:#x})"


def shown(x) -> torch.Tensor:
    """A copy of the values x shows (a storage's as bytes)."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy())
    if isinstance(x, torch.UntypedStorage):
        return torch.empty(0, dtype=torch.uint8).set_(x).clone()
    return x.clone()


class Live:
    """Tensors (or arrays, storages) kept alive, each with the values it must keep showing."""

    def __init__(self):
        self.items: list[tuple[object, torch.Tensor]] = []

    def add(self, x, expected: torch.Tensor, fresh: bool = True) -> None:
        if fresh:
            assert_apart(x, [y for item in self.items for y in item])
        assert torch.equal(shown(x), expected)
        self.items.append((x, expected))

    def check(self) -> None:
        for i, (x, expected) in enumerate(self.items):
            assert torch.equal(shown(x), expected), f"live tensor {i} of {len(self.items)} changed"

    def keep(self, first: int, most_recent: int) -> None:
        """Drops all but the first `first` and the `most_recent` last ones (in their order)."""
        del self.items[first : max(first, len(self.items) - most_recent)]


def churn(live: Live, rng: random.Random, calls: int, sizes: list[int], first: int = 0) -> None:
    """`calls` calls of my_add on `sizes` elements (each call picks one), adding each output to
    `live` and freeing some: the cache hands blocks back and forth. The first `first` entries of
    `live` stay; after each call every live entry is checked."""
    for _ in range(calls):
        n = rng.choice(sizes)
        seed = rng.randrange(1 << 30)
        a, b = randn(n, seed), randn(n, seed + 1)
        live.add(ops.my_add(a, b), 2 * a + b)
        live.keep(first, rng.randint(0, 3))
        live.check()


VIEWS = {
    "slice": lambda y: y[3:-5],
    "view": lambda y: y.view(-1, 128),
    "transpose": lambda y: y.view(-1, 128).t(),
    "numpy": lambda y: y.numpy(),
    "storage": lambda y: y.untyped_storage(),
}


@pytest.mark.parametrize("kind", VIEWS)
def test_what_outlives_an_output_keeps_its_memory(kind):
    # The block goes back when the storage dies, not the tensor: a view, a numpy array, or the
    # storage itself keeps it. Had it gone back with the tensor, the next output of that size
    # (the first call below) would get it and overwrite what the view shows.
    n = MiB // 2  # 2 MiB of output
    a, b = randn(n, 1), randn(n, 2)
    y = ops.my_add(a, b)
    kept = VIEWS[kind](y)
    expected = shown(VIEWS[kind](2 * a + b))
    del y
    live = Live()
    live.add(kept, expected, fresh=False)
    # Sizes the freed block fits (at most twice the request), then ones it does not.
    churn(live, random.Random(kind), 24, [n, n, 3 * n // 4, n // 2 + 1, 2 * n, MiB // 4], first=1)
    assert torch.equal(shown(kept), expected)


def test_resized_set_and_in_place_outputs_keep_their_values():
    n = MiB // 2
    a, b = randn(n, 1), randn(n, 2)
    ref, swapped = 2 * a + b, 2 * b + a
    live = Live()
    # resize_ larger moves the data to a new block of the same allocator; the old one goes back.
    grown = ops.my_add(a, b)
    grown.resize_(3 * n)
    grown[n:] = 7.0
    live.add(grown, torch.cat([ref, torch.full((2 * n,), 7.0)]))
    # resize_ smaller keeps the block, as does growing the storage itself (a copy, then the old
    # one goes back).
    shrunk = ops.my_add(a, b)
    shrunk.resize_(n // 3)
    live.add(shrunk, ref[: n // 3])
    stored = ops.my_add(a, b)
    stored.untyped_storage().resize_(8 * n)
    live.add(stored, ref)
    # set_ onto another tensor: the output's block goes back; onto another output's storage,
    # whose tensor then dies: that block stays, with this tensor.
    elsewhere = ops.my_add(a, b)
    elsewhere.set_(torch.arange(n, dtype=torch.float32))
    live.add(elsewhere, torch.arange(n, dtype=torch.float32), fresh=False)
    adopter, donor = ops.my_add(a, b), ops.my_add(b, a)
    adopter.set_(donor)
    del donor
    live.add(adopter, swapped, fresh=False)
    # In place: the block holds what was written last.
    scaled = ops.my_add(a, b)
    scaled.add_(1.5).mul_(3.0)
    live.add(scaled, (ref + 1.5) * 3.0)
    copied = ops.my_add(a, b)
    copied.copy_(b)
    live.add(copied, b)
    written = ops.my_add(a, b)
    torch.sub(a, b, out=written)
    live.add(written, a - b)
    doubled = ops.my_add(a, b)
    doubled.copy_(ops.my_add(doubled, doubled))  # an output as the op's input, then its target
    live.add(doubled, 3 * ref)
    live.check()
    churn(live, random.Random(0), 30, [n, n, 3 * n, n // 3, n // 2 + 1, 4 * n], first=len(live.items))
    live.check()


def saved_span(z: torch.Tensor) -> tuple[int, int]:
    """The bytes of the tensor (y * y).sum() saved for backward (mul's operand), without
    keeping a reference to it."""
    return span(z.grad_fn.next_functions[0][0]._saved_self)


def test_outputs_saved_for_backward_survive_later_calls():
    # y = my_add(a, b) is then only held by autograd (mul saves its operands); calls in between
    # that take and free blocks of y's size must leave it alone: d/da (y*y).sum() = 4y and
    # d/db = 2y, from y computed independently. Several graphs wait at once, and backward (whose
    # gradients are cached outputs too) runs in an order other than the order they were made.
    n = MiB // 2
    rng = random.Random(0)
    live = Live()
    graphs = []
    for g in range(4):
        a, b = randn(n, 10 + g).requires_grad_(), randn(n, 20 + g).requires_grad_()
        y = ops.my_add(a, b)
        z = (y * y).sum()
        del y
        graphs.append((a, b, z, 2 * a.detach() + b.detach()))
        churn(live, rng, 6, [n, n, 3 * n // 4, 2 * n])
    order = [2, 0, 3, 1]
    for k, i in enumerate(order):
        for j in order[k:]:  # nothing live shares the bytes of a tensor saved for backward
            assert_apart(saved_span(graphs[j][2]), [x for item in live.items for x in item])
        a, b, z, y = graphs[i]
        z.backward()
        live.add(a.grad, 4 * y)
        live.add(b.grad, 2 * y)
        churn(live, rng, 6, [n, n, 2 * n], first=len(live.items))
    live.check()


def test_threads_calling_ops_at_once_get_their_own_memory():
    # 8 threads call my_add and dual_residual (two outputs) on their own inputs, each keeping a
    # rolling window of its outputs: an output's block handed to another thread while in use
    # would show as changed values there (or an overlap with the thread's own).
    errors: list[str] = []

    def calls(t: int) -> None:
        try:
            rng = random.Random(t)
            x_all, y_all = randn(MiB, 100 + t), randn(MiB, 200 + t)
            window: list[tuple[torch.Tensor, torch.Tensor]] = []
            for _ in range(25):
                m = rng.randint(MiB // 4, 3 * MiB // 4)  # 1 to 3 MiB per output
                at = rng.randrange(MiB - m)
                x, y = x_all[at : at + m], y_all[at : at + m]
                s = ops.my_add(x, y)
                r1, r2 = ops.dual_residual(x, y, 0.5)
                for new, expected in ((s, 2 * x + y), (r1, x * 0.5 - y), (r2, y * 0.5 - x)):
                    assert_apart(new, [w for item in window for w in item])
                    assert torch.equal(new, expected)
                    window.append((new, expected))
                for i, (w, expected) in enumerate(window):
                    assert torch.equal(w, expected), f"output {i} of {len(window)} changed"
                del window[: max(0, len(window) - rng.randint(0, 6))]
        except Exception as e:  # reported by the main thread
            errors.append(f"thread {t}: {e!r}")

    threads = [threading.Thread(target=calls, args=(t,), daemon=True) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "threads still calling after 300 s: a deadlock?"
    assert not errors, errors


def test_compiled_function_outputs_do_not_alias():
    # torch.compile (inductor): the op runs from the compiled code, next to inductor's own
    # buffers; outputs kept across calls must stay as eager computes them.
    def f(a, b):
        y = ops.my_add(a, b)
        return y, y - b

    compiled = torch.compile(f)
    n = MiB // 2
    inputs = [(randn(n, 2 * i), randn(n, 2 * i + 1)) for i in range(5)]
    rng = random.Random(0)
    live = Live()
    for i in range(30):
        a, b = inputs[i % len(inputs)]
        y, d = compiled(a, b)
        ey, ed = f(a, b)
        live.add(y, ey)
        live.add(d, ed)
        del ey, ed
        live.keep(0, rng.randint(0, 6))
        live.check()


def run_script(script: str, timeout: int, env: dict | None = None, args: list[str] = ()) -> str:
    """Runs `script` in a fresh Python; its stdout. A run past `timeout` seconds (a hang) fails."""
    full_env = {k: v for k, v in os.environ.items() if k != "OPBRIDGE_OUTPUT_CACHE_MB"}
    full_env.update(env or {})
    try:
        out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=full_env,
                             cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: no end after {timeout} s; stdout: {e.stdout!r}; stderr: {e.stderr!r}")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# DataLoader workers forked after the parent's calls: each starts with a copy of the parent's
# cache (blocks it holds, blocks its live outputs use); the workers' outputs come back through
# shared memory. Two epochs: two sets of workers.
DATALOADER = r"""
import torch, opbridge
from torch.utils.data import DataLoader, Dataset
ops, n = torch.ops.opbridge, 1 << 19  # 2 MiB outputs

def inputs(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)

class Calls(Dataset):
    def __len__(self):
        return 12
    def __getitem__(self, i):
        a, b = inputs(i)
        y = ops.my_add(a, b)
        return (i, y, *ops.dual_residual(a, y, 0.5))

held = [ops.my_add(*inputs(100 + k)) for k in range(4)]
del held[::2]  # their blocks wait in the cache
loader = DataLoader(Calls(), batch_size=None, num_workers=2, multiprocessing_context="fork")
for epoch in range(2):
    seen = set()
    for i, y, r1, r2 in loader:
        a, b = inputs(i)
        ref = 2 * a + b
        assert torch.equal(y, ref) and torch.equal(r1, a * 0.5 - ref) and torch.equal(r2, ref * 0.5 - a), i
        seen.add(i)
        mine = ops.my_add(b, a)  # the parent's cache, between the workers' results
        assert torch.equal(mine, 2 * b + a)
    assert seen == set(range(12)), seen
for k, h in zip((1, 3), held):
    assert torch.equal(h, 2 * inputs(100 + k)[0] + inputs(100 + k)[1])
print("ok")
"""


def test_dataloader_workers_forked_after_calls():
    assert run_script(DATALOADER, timeout=180).split()[-1] == "ok"


# Forks while another thread calls ops (its GIL released in the op): a child forked while that
# thread held the cache's lock would wait for it forever on its first large output. To make that
# likely, the cache first gets 8,000 decoys: kept 1 MiB blocks, fit for no request here, that
# every take scans under the lock (each block is taken by a storage grown from 0 bytes: address
# space, never written). Without the cache's fork handlers (block_cache.cc) a child hung in each
# of 5 runs, mostly within the first few forks, once at the 40th; 40 are made. Each child calls
# the op and checks the parent's live outputs; one not done within its deadline fails the test.
# The child runs one thread: GNU OpenMP cannot run a parallel region in a child forked after the
# parent ran one (PyTorch's own ops hang there too), which is why DataLoader workers run one too.
FORK_WHILE_CALLING = r"""
import os, sys, threading, time, torch, opbridge
ops = torch.ops.opbridge
torch.set_num_threads(1)  # the calling thread on one core, forks and children on the other
one = torch.randn(1 << 18)
decoys = []
for _ in range(8000):
    s = ops.my_add(one, one).untyped_storage()
    s.resize_(0)  # its block back to the cache, for the next call
    decoys.append(s)
for s in decoys:
    try:
        s.resize_(1 << 20)
    except RuntimeError:  # address space refused (strict overcommit): fewer decoys
        break
del decoys, s
x, y = torch.randn((1 << 18) + 1024), torch.randn((1 << 18) + 1024)  # 1 MiB + 4 KiB outputs
a, b = torch.randn(1 << 20), torch.randn(1 << 20)  # 4 MiB outputs
ref = 2 * a + b
held = [ops.my_add(a, b) for _ in range(3)]
del held[1]
stop = threading.Event()

def calls():
    while not stop.is_set():
        s = ops.my_add(x, y)
        r1, r2 = ops.dual_residual(x, y, 0.5)
        del s, r1, r2

thread = threading.Thread(target=calls)
thread.start()
try:
    for i in range(40):
        pid = os.fork()
        if pid == 0:
            ok = torch.equal(ops.my_add(a, b), ref) and all(torch.equal(h, ref) for h in held)
            os._exit(0 if ok else 1)
        deadline = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                sys.exit(f"child {i} hung")
            time.sleep(0.002)
        assert os.waitstatus_to_exitcode(done[1]) == 0, f"child {i}: wrong values"
finally:
    stop.set()
    thread.join()
print("ok")
"""


def test_fork_while_another_thread_calls_ops():
    # The decoys need a cap above their 8,000 MiB (of address space).
    assert run_script(FORK_WHILE_CALLING, timeout=300, env={"OPBRIDGE_OUTPUT_CACHE_MB": "16384"}).split()[-1] == "ok"


# 10,000 calls, 1 to 4 MiB of output each, with 0 to 4 of the latest outputs kept alive (a
# random choice each call, dropped in random order), and once a burst of 48 outputs alive at once:
# freed, they are far more than the cap, which decides how much of them stays. Blocks of 1 MiB
# and more are mapped on their own (MALLOC_MMAP_THRESHOLD_): glibc keeps freed heap memory
# resident, which would show in RSS as if the cache held it; so RSS here is what the cache and
# the live outputs hold. RSS is read after a first small call and every 100 calls; the run stops
# early once past the bound (a leak would otherwise take the machine's memory).
BOUNDED = r"""
import os, random, sys, torch, opbridge
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
bound = float(sys.argv[1])
rng, most = random.Random(0), 1 << 20  # float32 elements: 4 MiB
a, b = torch.randn(most), torch.randn(most)
ref = 2 * a + b
torch.ops.opbridge.my_add(a[:16], b[:16])  # loads what the first call needs
def call():
    n = rng.randint(most // 4, most)
    y = torch.ops.opbridge.my_add(a[:n], b[:n])
    assert torch.equal(y[-16:], ref[n - 16 : n])
    return y
live = []
before = peak = rss_mib()
for i in range(10_000):
    live.append(call())
    if i == 5_000:
        burst = [call() for _ in range(48)]
        del burst
    keep = rng.randint(0, 4)
    while len(live) > keep:
        live.pop(rng.randrange(len(live)))
    if i % 100 == 0:
        peak = max(peak, rss_mib())
        if peak - before > bound:
            break
print(f"{before:.1f} {peak:.1f} {rss_mib():.1f} {i + 1}")
"""


def test_memory_stays_bounded_under_varying_sizes():
    cap = 32
    # What may stay: the cache's cap, up to 5 live outputs (4 kept and the new one) on blocks of
    # up to twice their 4 MiB, and slack for PyTorch's and the allocator's own.
    bound = cap + 5 * 8 + 24
    out = run_script(BOUNDED, timeout=300, args=[str(bound)],
                     env={"OPBRIDGE_OUTPUT_CACHE_MB": str(cap), "MALLOC_MMAP_THRESHOLD_": str(MiB)})
    before, peak, after, calls = out.split()
    growth = max(float(peak), float(after)) - float(before)
    report = f"RSS before {before} MiB, peak {peak} MiB, after {after} MiB over {calls} calls; growth bound {bound} MiB"
    print(report)
    assert growth < bound, f"RSS grew {growth:.1f} MiB: {report}"
