"""Training-step time of ``torch.compile(model, fullgraph=True)`` against eager, on the default backend.

    python -m benchmarks.compile [--iters 15] [--threads 1] [--models vit lm]

For each model an eager copy and a compiled copy (same initial weights) each take a step of forward,
cross-entropy, backward and AdamW in alternation (eager, compiled, eager, ...), so load from other
processes hits both alike. The first step of each is a warm-up (for the compiled copy it includes the
compilation, reported separately). Prints a markdown table of median step times, the ratio of the
medians, the spread of the per-pair ratios, and the load average before and after.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import diffzoo.models  # noqa: F401  (registers the timm models)
from diffzoo.kernels import select_backend
from diffzoo.kernels.registry import Call
from diffzoo.models.lm import CausalLM

Batch = tuple[Tensor, Tensor]


def _vit() -> tuple[nn.Module, Batch, str]:
    model = timm.create_model("diffvit_nano_patch7_28", num_classes=10)
    batch = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    return model, batch, "diffvit_nano_patch7_28, batch 64 x 1 x 28 x 28"


def _lm() -> tuple[nn.Module, Batch, str]:
    model = CausalLM.from_preset("lm_tiny")
    tokens = torch.randint(0, 256, (8, 129))
    return model, (tokens[:, :-1], tokens[:, 1:]), "lm_tiny, batch 8 x 128 tokens"


MODELS: dict[str, Callable[[], tuple[nn.Module, Batch, str]]] = {"vit": _vit, "lm": _lm}


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _step(loss_fn: Callable[..., Tensor], model: nn.Module, opt: torch.optim.Optimizer, batch: Batch) -> float:
    """Seconds for one forward + loss + backward + optimizer step."""
    t = time.perf_counter()
    loss_fn(model, *batch).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def measure(name: str, iters: int) -> dict[str, object]:
    """Interleaved eager and compiled training steps of one model; times in milliseconds."""
    torch.manual_seed(0)
    eager, batch, label = MODELS[name]()
    compiled = copy.deepcopy(eager)
    compiled_loss = torch.compile(_loss, fullgraph=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (eager, compiled)]
    _step(_loss, eager, opts[0], batch)
    compile_s = _step(compiled_loss, compiled, opts[1], batch)  # traces and compiles forward and backward
    e_times, c_times = [], []
    for _ in range(iters):
        e_times.append(_step(_loss, eager, opts[0], batch) * 1e3)
        c_times.append(_step(compiled_loss, compiled, opts[1], batch) * 1e3)
    ratios = sorted(c / e for c, e in zip(c_times, e_times))
    return dict(
        label=label, compile_s=compile_s, eager=statistics.median(e_times), compiled=statistics.median(c_times),
        ratio=statistics.median(c_times) / statistics.median(e_times), ratio_lo=ratios[0], ratio_hi=ratios[-1],
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=15, help="timed steps per copy after one warm-up step")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["vit", "lm"])
    args = p.parse_args(argv)
    if args.iters < 1:
        p.error(f"--iters={args.iters} must be at least 1")
    torch.set_num_threads(args.threads)
    q = torch.empty(1, 2, 1, 1)
    backend = select_backend("diff", Call(q, q, q[:, :1], None, None, False, 0.0, True)).name
    load_before = os.getloadavg()
    rows = [measure(name, args.iters) for name in args.models]
    load_after = os.getloadavg()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; attention backend {backend}; "
        f"{args.iters} interleaved steps per copy after 1 warm-up; load average (1/5/15 min) "
        f"before {' '.join(f'{v:.2f}' for v in load_before)}, after {' '.join(f'{v:.2f}' for v in load_after)}"
    )
    print()
    print("| model | eager step (ms) | compiled step (ms) | compiled / eager | per-step ratio range | compile (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['label']} | {r['eager']:.1f} | {r['compiled']:.1f} | {r['ratio']:.2f} | "
            f"{r['ratio_lo']:.2f} - {r['ratio_hi']:.2f} | {r['compile_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
