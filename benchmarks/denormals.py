"""Subnormal floats in attention on CPU: what they cost a training step, and what flush-to-zero gives back.

    python -m benchmarks.denormals                  # one differential-attention core, logits from mild to peaked
    python -m benchmarks.denormals --run outputs/study/cluttered/runs/diff_lr0.008_seed0   # a trained cluttered ViT

A softmax row whose logits spread by more than about 87 (float32) gives some keys a probability below the smallest
normal float (1.2e-38): ``exp`` returns subnormal numbers there, down to about 103 below the row's maximum, and
x86 CPUs compute with subnormals many times slower than with normal floats. Attention that training has made
peaked (a high learning rate, long training) can put a large share of its probabilities there, in the forward
pass and in the backward pass through them. ``torch.set_flush_denormal(True)`` makes the CPU treat subnormals as
zero (they are below 1.2e-38, so a probability changes by less than that).

Without ``--run``: random ``q``, ``k`` and ``v`` (normal, ``q`` and ``k`` times ``--spreads``, so the logits' sd is
about the spread squared) through :func:`diffzoo.kernels.diff_attention` on each backend, forward and backward.
With ``--run``: a cluttered-digits run's trained ViT (its ``config.yaml`` and ``model.safetensors``) on one
training batch, forward and backward, on the backend the recipe trains with. Each setting is timed with flush-to-
zero off and on in alternation (off, on, off, on, ...), so load from other processes hits both alike; the table
gives the median of ``--repeats`` timings of each and the ratio off / on with its range over the repeats.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32


def subnormal_fraction(p: torch.Tensor) -> float:
    """The share of the probabilities ``p`` that is subnormal: nonzero and below :data:`TINY`."""
    return ((p > 0) & (p < TINY)).float().mean().item()


def timed_pair(step: Callable[[], None], repeats: int, iters: int) -> tuple[list[float], list[float]]:
    """Seconds per ``step()`` with flush-to-zero off and on, ``repeats`` times each, in alternation (one warm-up
    call per setting first). Leaves flush-to-zero as it found it."""
    was = torch.set_flush_denormal(False)  # returns whether the CPU supports it, not the previous state
    if not was:
        raise SystemExit("this CPU cannot flush subnormals to zero (torch.set_flush_denormal returned False)")
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            step()
        for _ in range(repeats):
            for flush in (False, True):
                torch.set_flush_denormal(flush)
                start = time.perf_counter()
                for _ in range(iters):
                    step()
                times[flush].append((time.perf_counter() - start) / iters)
    finally:
        torch.set_flush_denormal(False)
    return times[False], times[True]


def row(label: str, fraction: float, off: list[float], on: list[float]) -> str:
    ratios = [a / b for a, b in zip(off, on)]
    return (f"| {label} | {100 * fraction:.2f} | {1e3 * statistics.median(off):.1f} | {1e3 * statistics.median(on):.1f} "
            f"| {statistics.median(off) / statistics.median(on):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


HEADER = ("| {what} | subnormal probabilities (%) | ms, flush off | ms, flush on | off / on (range over repeats) |\n"
          "|---|---|---|---|---|")


def layer_rows(spreads: list[float], backends: list[str], n: int, heads: int, dim: int, batch: int, repeats: int,
               iters: int, seed: int) -> list[str]:
    """The table's rows for one differential-attention core per (spread, backend)."""
    from diffzoo.kernels import attention_maps, diff_attention

    rows = []
    for spread in spreads:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(batch, 2 * heads, n, dim, generator=g) * spread
        k = torch.randn(batch, 2 * heads, n, dim, generator=g) * spread
        v = torch.randn(batch, heads, n, 2 * dim, generator=g)
        fraction = subnormal_fraction(attention_maps(q, k))  # both maps of every head (q1 k1 and q2 k2)
        for backend in backends:
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            lam = torch.tensor(0.8, requires_grad=True)

            def step(leaves: list[torch.Tensor] = leaves, lam: torch.Tensor = lam, backend: str = backend) -> None:
                out = diff_attention(*leaves, lam, backend=backend)
                out.square().mean().backward()

            off, on = timed_pair(step, repeats, iters)
            rows.append(row(f"spread {spread:g}, `{backend}`", fraction, off, on))
    return rows


def run_rows(run: Path, repeats: int, iters: int) -> list[str]:
    """The table's row for a trained cluttered-digits ViT: one training batch, forward and backward."""
    import yaml

    from diffzoo.analysis.maps import record_attention
    from diffzoo.data.cluttered import ClutteredDigitsDataModule
    from diffzoo.study.runs import latest_log_dir
    from diffzoo.tasks.cluttered import VariantImageTask
    from diffzoo.weights.io import read_weights

    folder = run if (run / "config.yaml").is_file() or not any(run.glob("version_*")) else latest_log_dir(run)
    if not (folder / "config.yaml").is_file() or not (folder / "model.safetensors").is_file():
        raise SystemExit(f"--run {run}: no config.yaml and model.safetensors there or in a version_N folder of it "
                         "(a finished run of python -m recipes.cluttered_digits)")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    m, d = config["model"], config["data"]
    data = ClutteredDigitsDataModule(**{k: d[k] for k in ("k", "canvas", "fragment", "num_val", "num_test",
                                                          "batch_size", "seed", "align") if k in d})
    data.setup("fit")
    torch.manual_seed(0)  # the loader's shuffle: the same batch on every call
    x, y = next(iter(data.train_dataloader()))
    task = VariantImageTask(attn=m["attn"], size=m["size"], patch_size=m["patch_size"], num_classes=data.num_classes,
                            in_chans=data.in_chans, img_size=data.img_size)
    task.model.load_state_dict(read_weights(folder / "model.safetensors", what="--run weights"))
    with torch.no_grad(), record_attention(task.model) as rec:  # every layer's softmax maps, diffzoo's or timm's
        task(x)
    fraction = statistics.mean(subnormal_fraction(p) for layer in rec
                               for p in ((layer.attn1, layer.attn2) if layer.differential else (layer.attn,)))

    def step() -> None:
        task.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(task(x), y).backward()

    off, on = timed_pair(step, repeats, iters)
    return [row(f"`{folder}` (batch {len(x)})", fraction, off, on)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.denormals", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="a finished cluttered-digits run folder (default: none, "
                                                          "the layer table)")
    p.add_argument("--spreads", type=float, nargs="+", default=[1.0, 4.0, 6.0, 8.0],
                   help="layer table: factors on q and k (logit sd about their square; default: %(default)s)")
    p.add_argument("--backends", nargs="+", default=["reference", "sdpa", "blockwise"],
                   help="layer table: backends (default: %(default)s)")
    p.add_argument("--n", type=int, default=256, help="layer table: sequence length (default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="layer table: differential heads (default: %(default)s)")
    p.add_argument("--dim", type=int, default=32, help="layer table: head width (default: %(default)s)")
    p.add_argument("--batch", type=int, default=4, help="layer table: batch (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timings of each setting (default: %(default)s)")
    p.add_argument("--iters", type=int, default=3, help="steps per timing (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0, help="layer table: seed of q, k, v (default: %(default)s)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
          f"thread(s), load average {load:.2f} at the start; forward + backward, median of {args.repeats} timings "
          f"of {args.iters} steps each\n")
    if args.run is not None:
        print(HEADER.format(what="trained model"))
        rows = run_rows(args.run, args.repeats, args.iters)
    else:
        print(HEADER.format(what=f"diff_attention, B={args.batch}, H={args.heads}, N={args.n}, d={args.dim}"))
        rows = layer_rows(args.spreads, args.backends, args.n, args.heads, args.dim, args.batch, args.repeats,
                          args.iters, args.seed)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
