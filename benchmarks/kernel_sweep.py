"""Time every candidate launch configuration of the fused Triton kernels on this GPU, one kernel at a time.

    python -m benchmarks.kernel_sweep                       # N = 4096, d = 64 and 128, not causal
    python -m benchmarks.kernel_sweep --causal both --json sweep.json

The shipped tables (``diffzoo.kernels.triton_diff.CONFIGS``) are the lists the autotuner times on a device;
this sweep is how an entry earns its place there. For each kernel and head width it builds a grid of
``(BLOCK_M, BLOCK_N, warps, stages)`` around the shipped entries, then

1. **checks** every candidate in worker processes (which also compiles it, in parallel, into Triton's
   cache): a forward and backward with that configuration forced and the other two kernels on their
   pinned entries, against the same call with every kernel pinned (bf16; largest error relative to the
   largest magnitude, over the output and dq, dk, dv; a candidate fails above 2e-2). Candidates that do
   not fit the device (shared memory) are listed as such;
2. **times** the candidates that pass, in this process, by CUDA events (median): ``fwd`` by its forward;
   ``bwd_kv`` by forward + backward on the device's default dQ path (``DQ_DEFAULT``: on Hopper the
   atomic-free split path, so the time includes ``bwd_q`` on its pinned entry; on Ampere dQ by atomics
   inside the dK/dV kernel); ``bwd_q`` by forward + backward with deterministic algorithms (which take the
   split path on every GPU);
3. prints each list fastest first, and the forward + backward of the fastest of each kernel together
   beside the pinned entries (the two alternated three times, medians) and the ``sdpa`` backend, on the
   same inputs; where ``bwd_q`` was timed, that pair again with deterministic algorithms (on Ampere the
   default backward does not launch ``bwd_q``, so there only this line says whether its entry should change).

Shapes as ``python -m benchmarks.kernels``: bf16, model width ``D = 2H * d`` (default 2048), ``B * N =
16K`` tokens. It prints its progress (every 10 candidates checked, every candidate timed) and rewrites
``--json`` after the check and after each width and mask it times, so a run stopped early keeps what it
measured. Without CUDA it says so and exits 0; the tests run its check and timing code in Triton's CPU
interpreter at a tiny size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import partial
from multiprocessing import get_context

import torch

from benchmarks.kernels import _make_case, _time_ms, diff_inputs

MAX_ERR = 2e-2
KINDS = ("fwd", "bwd_kv", "bwd_q")
ROUNDS = 3  # alternations of the best-together and pinned timings


def grid(kind: str, d: int, shipped: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Candidate ``(BLOCK_M, BLOCK_N, warps, stages)`` of one kernel and width, the shipped entries included.

    ``BLOCK_M`` counts query rows and ``BLOCK_N`` key rows in every kernel. Eight warps only where a tile has
    128 rows or the width is 128 (four warps there leave one warp group the whole accumulator); ``dK/dV``
    tiles of 16-64 query rows against 64 or 128 keys; 2 or 3 stages.
    """
    out = set(shipped)
    ms: tuple[int, ...] = (16, 32, 64) if kind == "bwd_kv" else (64, 128)
    ns: tuple[int, ...] = (64, 128) if kind == "bwd_kv" else (32, 64, 128)
    for bm in ms:
        for bn in ns:
            for warps in (4, 8):
                for stages in (2, 3):
                    rows = bn if kind == "bwd_kv" else bm
                    if warps == 4 and rows == 128:
                        continue  # one warp group would hold a 128-row accumulator
                    out.add((bm, bn, warps, stages))
    return sorted(out)


def candidates(ds: list[int], causals: list[bool], kinds=KINDS, family: str | None = None) -> list[tuple]:
    """``(kind, d, causal, config)`` of the sweep; ``family`` defaults to this device's."""
    from diffzoo.kernels import triton_diff as td

    family = family or td.target_family(torch.cuda.get_device_capability())
    return [(kind, d, causal, c) for kind in kinds for d in ds for causal in causals
            for c in grid(kind, d, td.CONFIGS[kind][family][td.width_bucket(d)])]


@contextlib.contextmanager
def _forced(kind: str | None, config, d: int, family: str):
    """``config`` for ``kind`` and the pinned entry for every other kernel."""
    from diffzoo.kernels import triton_diff as td

    with contextlib.ExitStack() as stack:
        for k in td.KERNELS:
            pinned = td.CONFIGS[k][family][td.width_bucket(d)][0]
            stack.enter_context(td.forced_config(k, config if k == kind else pinned))
        yield


def _outputs(case, deterministic: bool):
    q, k, v, lam, dout, causal = case
    from diffzoo.kernels import triton_diff as td

    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        out = td.diff_attention_triton(q, k, v, lam, causal=causal)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))
    finally:
        torch.use_deterministic_algorithms(old, warn_only=True)


def _inputs(n: int, width: int, tokens: int, d: int, causal: bool, device: str = "cuda"):
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, lam = diff_inputs(max(1, tokens // n), n, width, d, device, g)
    dout = torch.randn(v.shape, device=device, dtype=torch.bfloat16, generator=g)
    return q, k, v, lam, dout, causal


def relative_error(got, want) -> float:
    """Largest absolute difference over the tensors of ``got``, each relative to the largest magnitude of its
    counterpart in ``want``."""
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
               for a, b in zip(got, want))


_REFERENCES: dict = {}  # per process: the inputs and the all-pinned outputs of each (shape, mask, mode)


def check_one(item: tuple, n: int, width: int, tokens: int, family: str, device: str = "cuda") -> dict:
    """Run (and so compile) one candidate ``(kind, d, causal, config)`` against the all-pinned call."""
    kind, d, causal, config = item
    row = dict(kind=kind, d=d, causal=causal, config=list(config))
    deterministic = kind == "bwd_q"
    try:
        key = (n, width, tokens, d, causal, deterministic, family, device)
        if key not in _REFERENCES:
            case = _inputs(n, width, tokens, d, causal, device)
            with _forced(None, None, d, family):
                _REFERENCES[key] = (case, _outputs(case, deterministic))
        case, want = _REFERENCES[key]
        with _forced(kind, config, d, family):
            got = _outputs(case, deterministic)
        row["err"] = relative_error(got, want)
        row["ok"] = row["err"] <= MAX_ERR
    except Exception as e:  # shared memory beyond the device's, a compile failure
        row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e).splitlines()[0][:110] if str(e) else ''}"
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def time_group(rows: list[dict], d: int, causal: bool, n: int, width: int, tokens: int, warmup: int, reps: int,
               family: str, device: str = "cuda") -> dict:
    """Time the candidates of one width and mask that passed (in place, printing each) and summarise them."""
    from diffzoo.kernels import triton_diff as td

    B = max(1, tokens // n)
    forward, forward_backward, _ = _make_case("triton", B, n, width, d, causal, device)
    group = [r for r in rows if r["d"] == d and r["causal"] == causal]
    for r in group:
        if not r["ok"]:
            continue
        with _forced(r["kind"], tuple(r["config"]), d, family):
            if r["kind"] == "fwd":
                r["ms"] = _time_ms(forward, warmup, reps, device)
            elif r["kind"] == "bwd_kv":
                r["ms"] = _time_ms(forward_backward, warmup, reps, device)
            else:
                torch.use_deterministic_algorithms(True, warn_only=True)
                try:
                    r["ms"] = _time_ms(forward_backward, warmup, reps, device)
                finally:
                    torch.use_deterministic_algorithms(False)
        print(f"  timed {r['kind']:6s} d={d} causal={causal!s:5s} {tuple(r['config'])}: {r['ms']:.3f} ms", flush=True)
    best = {}
    for kind in KINDS:
        timed = [r for r in group if r["kind"] == kind and "ms" in r]
        if timed:
            best[kind] = tuple(min(timed, key=lambda r: r["ms"])["config"])
    entry: dict = dict(d=d, causal=causal, best=best)

    def together(which: str, deterministic: bool) -> float:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_forced(None, None, d, family))  # a kernel with no timed candidate stays pinned
            if which == "best":
                for kind, c in best.items():
                    stack.enter_context(td.forced_config(kind, c))
            torch.use_deterministic_algorithms(deterministic, warn_only=True)
            try:
                return _time_ms(forward_backward, warmup, reps, device)
            finally:
                torch.use_deterministic_algorithms(False)

    # The fastest of each kernel together against the pinned entries, alternated ROUNDS times (median). Where
    # the default dQ path is atomic (Ampere) the default backward never launches bwd_q, so where bwd_q was
    # timed the pair is timed again with deterministic algorithms, which always run it.
    modes = [("", False)] + ([("det_", True)] if "bwd_q" in best else [])
    for prefix, deterministic in modes:
        times: dict = {"best": [], "pinned": []}
        for _ in range(ROUNDS):
            for which in times:
                times[which].append(together(which, deterministic))
        for which, ts in times.items():
            entry[f"{prefix}{which}_fwd_bwd_ms"] = statistics.median(ts)
            entry[f"{prefix}{which}_fwd_bwd_runs_ms"] = ts
    _, sdpa_fb, _ = _make_case("sdpa", B, n, width, d, causal, device)
    entry["sdpa_fwd_bwd_ms"] = _time_ms(sdpa_fb, warmup, reps, device)
    return entry


def format_rows(rows: list[dict], shipped_of) -> str:
    lines = [f"{'kernel':7s} {'d':>3s} {'causal':6s} {'BLOCK_M x BLOCK_N, warps, stages':34s} {'ms':>8s}  note"]
    key = lambda r: (r["kind"], r["d"], r["causal"], r.get("ms", float("inf")))  # noqa: E731
    for r in sorted(rows, key=key):
        bm, bn, w, st = r["config"]
        shipped = shipped_of(r["kind"], r["d"])
        mark = "pinned" if tuple(r["config"]) == shipped[0] else "shipped" if tuple(r["config"]) in shipped else ""
        ms = f"{r['ms']:8.3f}" if "ms" in r else f"{'-':>8s}"
        note = r.get("error") or (f"err {r['err']:.1e}" + ("" if r["ok"] else " FAILS the check"))
        lines.append(f"{r['kind']:7s} {r['d']:3d} {str(r['causal']):6s} {f'{bm} x {bn}, {w}, {st}':34s} {ms}  "
                     f"{mark:8s}{note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=4096, help="sequence length")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="query/key head widths")
    p.add_argument("--causal", choices=["yes", "no", "both"], default="no")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--width", type=int, default=2048, help="model width D = 2H * d")
    p.add_argument("--tokens", type=int, default=16384, help="B * N per step")
    p.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1),
                   help="processes that check (and compile) candidates in parallel")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--json", default=None, help="also write the rows and the summary to this JSON file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.kernel_sweep: no CUDA device on this machine; the sweep times kernels on a GPU "
              "(nothing measured).")
        return 0
    from diffzoo.kernels import triton_diff as td

    family = td.target_family(torch.cuda.get_device_capability())
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    todo = candidates(args.d, causals, args.kinds, family)
    print(f"device: {torch.cuda.get_device_name()} ({family} tables), torch {torch.__version__}, bf16, N = {args.n}, "
          f"D = {args.width}, B * N = {args.tokens}; {len(todo)} candidates, {args.workers} checking processes",
          flush=True)
    rows: list[dict] = []
    summary: dict = {}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name(), family=family, torch=torch.__version__, n=args.n,
                               width=args.width, tokens=args.tokens, rows=rows, summary=summary), f, indent=1)

    start = time.monotonic()
    check = partial(check_one, n=args.n, width=args.width, tokens=args.tokens, family=family)
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        for i, future in enumerate(as_completed([pool.submit(check, item) for item in todo]), 1):
            rows.append(future.result())
            if i % 10 == 0 or i == len(todo):
                print(f"checked {i} of {len(todo)} ({time.monotonic() - start:.0f} s)", flush=True)
    rows.sort(key=lambda r: (r["kind"], r["d"], r["causal"], r["config"]))
    save()
    for d in args.d:
        for causal in causals:
            summary[f"d{d}-{'causal' if causal else 'full'}"] = time_group(
                rows, d, causal, args.n, args.width, args.tokens, args.warmup, args.reps, family)
            save()  # a run stopped later keeps what it timed
    print(format_rows(rows, lambda kind, d: td.CONFIGS[kind][family][td.width_bucket(d)]))
    print("\nforward + backward (ms): the fastest of each kernel together, the pinned entries, the sdpa backend")
    for name, e in summary.items():
        print(f"{name:12s} best {e['best_fwd_bwd_ms']:8.3f}  pinned {e['pinned_fwd_bwd_ms']:8.3f}  "
              f"sdpa {e['sdpa_fwd_bwd_ms']:8.3f}  best = {e['best']}")
        if "det_best_fwd_bwd_ms" in e:
            print(f"{'':12s} deterministic: best {e['det_best_fwd_bwd_ms']:8.3f}  "
                  f"pinned {e['det_pinned_fwd_bwd_ms']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
