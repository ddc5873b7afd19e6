"""Training throughput (images/s, forward + backward + AdamW step) of differential vs softmax ViT-S/16.

    python -m benchmarks.vit_throughput [--batch 16] [--iters 5] [--threads N] [--backend blockwise]

Both models are built in one process and timed in alternation (ABAB...), so load from other processes
hits both alike; the ratio ``diff / softmax`` of the median images/s is the headline number.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import timm
import torch

import diffzoo.models  # noqa: F401
from diffzoo.kernels import use_backend
from diffzoo.layers import count_parameters


def step_time(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds for one forward + backward + optimizer step."""
    t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="small_patch16_224")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--iters", type=int, default=5, help="timed steps per model (after 1 warm-up step)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--backend", default=None, help="diffzoo attention backend (default: automatic)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224)
    y = torch.randint(0, 1000, (args.batch,))
    models = {k: timm.create_model(f"{k}_{args.size}") for k in ("softvit", "diffvit")}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    with use_backend(args.backend) if args.backend else _null():
        for k in models:
            step_time(models[k], opts[k], x, y)  # warm-up
        for _ in range(args.iters):
            for k in models:
                times[k].append(step_time(models[k], opts[k], x, y))
    ips = {k: args.batch / statistics.median(v) for k, v in times.items()}
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; batch {args.batch}, {args.iters} timed steps each, backend {args.backend or 'auto'}")
    for k, m in models.items():
        print(f"{k}_{args.size}: {count_parameters(m):,} params, {ips[k]:.2f} images/s "
              f"(step median {statistics.median(times[k]):.3f} s, min {min(times[k]):.3f} s)")
    print(f"ratio diff/softmax: {ips['diffvit'] / ips['softvit']:.3f}")


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
