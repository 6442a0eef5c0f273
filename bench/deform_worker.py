"""Runs one deform_conv2d implementation, forward or forward + backward, on request, for
bench_deform_conv2d_backward.py. Each implementation gets a process of its own: torchvision only
pairs with a torch build other than the project's, and two processes side by side must not spin
on each other's idle OpenMP threads (the benchmark starts both with OMP_WAIT_POLICY=PASSIVE).

    python deform_worker.py opbridge|torchvision CASE.pt THREADS

CASE.pt holds {"inputs": [input, weight, offset, bias, mask], "attrs": {...}, "grad": grad_out}.
Reads one command per line on stdin and answers one line on stdout:
  fwd      -> "ok"   one forward (no autograd)
  fwdbwd   -> "ok"   one forward and backward
  save P   -> "ok"   writes [output, grad_input, grad_weight, grad_offset, grad_bias, grad_mask] to P
  ping     -> "ok"   (the pipe's own round trip, to report)
"""

import sys

import torch
from worker_loop import serve


def implementation(name: str, attrs: dict):
    """deform_conv2d(input, weight, offset, bias, mask) of `name`, and its version string."""
    if name == "opbridge":
        import opbridge

        return (lambda x, w, off, b, m: torch.ops.opbridge.deform_conv2d(x, w, off, b, m, **attrs),
                f"opbridge {opbridge.__version__} (torch {torch.__version__})")
    import torchvision

    def run(x, w, off, b, m):
        return torchvision.ops.deform_conv2d(x, off, w, b, stride=tuple(attrs["stride"]),
                                             padding=tuple(attrs["padding"]), dilation=tuple(attrs["dilation"]),
                                             mask=m)

    return run, f"torchvision {torchvision.__version__} (torch {torch.__version__})"


def main() -> None:
    name, case_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    case = torch.load(case_path)
    torch.set_num_threads(threads)
    ts = [t.clone().requires_grad_() for t in case["inputs"]]
    go = case["grad"]
    op, version = implementation(name, case["attrs"])

    def forward_backward():
        for t in ts:
            t.grad = None
        y = op(*ts)
        y.backward(go)
        return y

    def no_grad_forward():
        with torch.no_grad():
            op(*ts)

    serve(version, {"fwd": lambda _: no_grad_forward(), "fwdbwd": lambda _: forward_backward(),
                    "save": lambda path: torch.save([forward_backward().detach()] + [t.grad for t in ts], path)})


if __name__ == "__main__":
    main()
