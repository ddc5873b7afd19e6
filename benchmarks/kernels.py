"""Throughput of the differential-attention kernels against matched standard attention, and the static
build report of the Triton kernels.

    python -m benchmarks.kernels                          # GPU: N = 1K..16K, d = 64 and 128, causal and not
    python -m benchmarks.kernels --n 4096 --d 128 --causal yes --json out.json
    python -m benchmarks.kernels --static                 # no GPU needed: what each shipped configuration builds to

Rows, at equal model width ``D = 2H * d`` (default 2048) and ``B * N = 16K`` tokens per step:

* ``triton``: ``diff_attention(backend="triton")``, the fused kernels (``H`` differential heads).
* ``sdpa``: ``diff_attention(backend="sdpa")``, both branches folded into SDPA calls (``auto`` on CUDA).
* ``standard``: ``F.scaled_dot_product_attention`` on q, k, v of shape ``(B, 2H, N, d)`` - the
  baseline with matched parameters (FlashAttention-2-class kernel on recent GPUs).

The SDPA kernel PyTorch picks for each SDPA row is recorded (``sdpa kernel``: flash, efficient, cudnn or
math, as ``torch._fused_sdp_choice`` reports it for every call the row makes).

FLOP counts (docs/design.md, "Kernel cost model": attention core, non-causal, halved for causal): the
differential rows count the fused algorithm, forward ``6 N^2 D`` and forward+backward ``16 N^2 D`` per
sequence, for both backends (the ``sdpa`` backend executes more, so its figure is "useful" throughput);
the standard row counts ``4 N^2 D`` and ``14 N^2 D``. Times are medians of CUDA-event timings after
warm-up (the first calls also autotune the Triton kernels); ``x std`` is the time over the standard
row's time. Without CUDA the table runs in Triton's interpreter (``TRITON_INTERPRET=1``) and times
nothing meaningful: that mode only checks that the benchmark itself works.

``--compare-dq`` times the ``triton`` forward + backward with dQ by atomic adds and by the atomic-free dQ
kernel (``diffzoo.kernels.triton_diff.dq_path``), both autotuned, alternated ``--rounds`` times per cell
(medians of the per-round medians), and prints ``split / atomic``: the measurement behind each GPU
family's default path (``DQ_DEFAULT``).

``--static`` compiles every shipped configuration of the Triton kernels for sm_90a (H100) and sm_80 as a
launch specialises it, and prints registers, spills, shared memory, the MMA instruction and replicated
tiles of every product, pipelining and atomic semantics (:mod:`diffzoo.kernels.triton_build`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

FLOPS = {  # per N^2 D, non-causal: (forward, forward + backward)
    "diff": (6.0, 16.0),
    "standard": (4.0, 14.0),
}
SDPA_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def _time_ms(fn: Callable[[], None], warmup: int, reps: int, device: str) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def sdpa_kernels(fn: Callable[[], object]) -> str:
    """The SDPA kernels PyTorch chooses for the calls ``fn`` makes (one untimed run)."""
    chosen: list[str] = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        choice = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        chosen.append(SDPA_NAMES.get(int(choice), str(choice)))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = spy
    try:
        fn()
    finally:
        F.scaled_dot_product_attention = original
    return "+".join(sorted(set(chosen)))


def diff_inputs(B: int, N: int, width: int, d: int, device: str, generator: torch.Generator) -> tuple:
    """bf16 leaves ``(q, k, v, lam)`` of a differential call at model width ``width`` (2H heads of width d)."""
    heads = width // d
    q, k = (torch.randn(B, heads, N, d, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
            for _ in range(2))
    v = torch.randn(B, heads // 2, N, 2 * d, device=device, dtype=torch.bfloat16, generator=generator)
    return q, k, v.requires_grad_(), torch.tensor(0.5, device=device, requires_grad=True)


def _make_case(row: str, B: int, N: int, width: int, d: int, causal: bool, device: str):
    """``(forward, forward_backward, sdpa kernel)`` for one row."""
    from diffzoo.kernels import diff_attention

    dt = torch.bfloat16
    heads = width // d  # 2H standard heads of width d
    g = torch.Generator(device=device).manual_seed(0)
    if row == "standard":
        q, k, v = (torch.randn(B, heads, N, d, device=device, dtype=dt, generator=g).requires_grad_() for _ in range(3))
        leaves: tuple = (q, k, v)

        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    else:
        q, k, v, lam = diff_inputs(B, N, width, d, device, g)
        leaves = (q, k, v, lam)

        def fwd():
            return diff_attention(q, k, v, lam, causal=causal, backend=row)

    with torch.no_grad():
        dout = torch.randn_like(fwd())
    kernel = sdpa_kernels(fwd) if row in ("standard", "sdpa") else ""

    def forward():
        with torch.no_grad():
            fwd()

    def forward_backward():
        torch.autograd.grad(fwd(), leaves, dout)

    return forward, forward_backward, kernel


def run(
    ns: list[int], ds: list[int], causals: list[bool], rows: list[str], width: int, tokens: int, warmup: int,
    reps: int, device: str = "cuda",
) -> list[dict]:
    """Time every (causal, d, N, row); one dict per row (``error`` set where a row failed)."""
    results = []
    for causal in causals:
        for d in ds:
            for N in ns:
                B = max(1, tokens // N)
                base: float | None = None
                for row in rows:
                    kind = "standard" if row == "standard" else "diff"
                    f_fwd, f_all = FLOPS[kind]
                    scale = B * N * N * width * (0.5 if causal else 1.0)
                    entry: dict = dict(row=row, causal=causal, d=d, N=N, B=B, width=width)
                    try:
                        forward, forward_backward, kernel = _make_case(row, B, N, width, d, causal, device)
                        t_fwd = _time_ms(forward, warmup, reps, device)
                        t_all = _time_ms(forward_backward, warmup, reps, device)
                    except Exception as e:  # out of memory, a backend refusing a size, a compile failure
                        entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
                        results.append(entry)
                        if device == "cuda":
                            torch.cuda.empty_cache()
                        continue
                    if row == "standard":
                        base = t_all
                    entry.update(
                        fwd_ms=t_fwd, fwd_bwd_ms=t_all, sdpa_backend=kernel,
                        fwd_tflops=f_fwd * scale / (t_fwd * 1e-3) / 1e12,
                        fwd_bwd_tflops=f_all * scale / (t_all * 1e-3) / 1e12,
                        x_std=t_all / base if base else None,
                    )
                    results.append(entry)
                    print(_format_row(entry), flush=True)
                    if device == "cuda":
                        torch.cuda.empty_cache()
    return results


def compare_dq(ns: list[int], ds: list[int], causals: list[bool], width: int, tokens: int, warmup: int, reps: int,
               rounds: int, device: str = "cuda") -> list[dict]:
    """``triton`` forward + backward on each dQ path, the two alternated ``rounds`` times per cell."""
    from diffzoo.kernels import triton_diff as td

    results = []
    for causal in causals:
        for d in ds:
            for N in ns:
                B = max(1, tokens // N)
                entry: dict = dict(causal=causal, d=d, N=N, B=B, width=width)
                try:
                    _, forward_backward, _ = _make_case("triton", B, N, width, d, causal, device)
                    runs: dict[str, list[float]] = {path: [] for path in td.DQ_PATHS}
                    for _ in range(rounds):
                        for path in td.DQ_PATHS:
                            with td.dq_path(path):
                                runs[path].append(_time_ms(forward_backward, warmup, reps, device))
                except Exception as e:  # out of memory, a compile failure
                    entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
                else:
                    for path, ts in runs.items():
                        entry[f"{path}_runs_ms"] = ts
                        entry[f"{path}_ms"] = statistics.median(ts)
                    entry["split_over_atomic"] = entry["split_ms"] / entry["atomic_ms"]
                results.append(entry)
                head = f"{str(causal):6s} {d:4d} {N:6d} {B:3d} | "
                print(head + (f"failed: {entry['error']}" if "error" in entry else
                              f"{entry['atomic_ms']:9.3f} {entry['split_ms']:9.3f} {entry['split_over_atomic']:7.3f} | "
                              + " ".join(f"{t:.3f}" for t in entry["atomic_runs_ms"]) + " / "
                              + " ".join(f"{t:.3f}" for t in entry["split_runs_ms"])), flush=True)
                if device == "cuda":
                    torch.cuda.empty_cache()
    return results


DQ_HEADER = f"{'causal':6s} {'d':>4s} {'N':>6s} {'B':>3s} | {'atomic ms':>9s} {'split ms':>9s} {'split/at':>7s} | runs"


_HEADER = (f"{'row':9s} {'causal':6s} {'d':>4s} {'N':>6s} {'B':>3s} | {'fwd ms':>8s} {'TFLOP/s':>7s} | "
           f"{'f+b ms':>8s} {'TFLOP/s':>7s} {'x std':>6s} | sdpa kernel")


def _format_row(r: dict) -> str:
    head = f"{r['row']:9s} {str(r['causal']):6s} {r['d']:4d} {r['N']:6d} {r['B']:3d} | "
    if r.get("error"):
        return head + f"failed: {r['error']}"
    ratio = f"{r['x_std']:6.2f}" if r.get("x_std") else "   n/a"
    return (head + f"{r['fwd_ms']:8.3f} {r['fwd_tflops']:7.1f} | {r['fwd_bwd_ms']:8.3f} {r['fwd_bwd_tflops']:7.1f} "
            f"{ratio} | {r.get('sdpa_backend') or '-'}")


def format_table(rows: list[dict]) -> str:
    return "\n".join([_HEADER, "-" * len(_HEADER)] + [_format_row(r) for r in rows])


def static_report(ds: list[int], archs: list[int], markdown: bool = False) -> int:
    """Print the build report of every shipped configuration; the number of configurations that break
    a rule without a documented exception."""
    from diffzoo.kernels import triton_build as tb
    from diffzoo.kernels import triton_diff as td

    if td.INTERPRET:
        print("--static compiles the kernels: unset TRITON_INTERPRET")
        return 1
    if not markdown:
        print(f"static build report, {tb.Problem().describe()}")
        print("wgmma: Hopper warp-group MMA; mma.sync: warp MMA; xN: the result tile is held N times by the warps;")
        print("pipelined a/b: product loops with asynchronous multi-buffered loads; MEMBAR: GPU-wide barriers and")
        print("L1 invalidations in the machine code. '<<' lists the rules a configuration breaks (docs/kernels.md).")
    bad = 0
    reports = []
    for arch in archs:
        for kind, d, config, pinned in tb.shipped(arch, tuple(ds)):
            report = tb.build_report(kind, d, config, arch)
            bad += bool(tb.unexplained(report, pinned))
            reports.append((report, pinned))
            if not markdown:
                print(tb.format_report(report, pinned) + ("  (pinned)" if pinned else ""), flush=True)
    if markdown:
        print(tb.markdown_table(reports))
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384], help="sequence lengths")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="query/key head widths")
    p.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    p.add_argument("--rows", nargs="+", default=["standard", "triton", "sdpa"], choices=["standard", "triton", "sdpa"])
    p.add_argument("--width", type=int, default=2048, help="model width D = 2H * d")
    p.add_argument("--tokens", type=int, default=16384, help="B * N per step")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--deterministic", action="store_true",
                   help="time under torch.use_deterministic_algorithms(True) (warn only): the triton rows then "
                        "compute dQ in its own atomic-free kernel")
    p.add_argument("--compare-dq", action="store_true",
                   help="time the triton forward + backward with dQ by atomics and by the atomic-free kernel, "
                        "alternated --rounds times per cell")
    p.add_argument("--rounds", type=int, default=3, help="alternations of --compare-dq")
    p.add_argument("--static", "--ptxas", dest="static", action="store_true",
                   help="print the build report of the shipped Triton configurations (no GPU needed)")
    p.add_argument("--arch", type=int, nargs="+", default=[90, 80], choices=[90, 80], help="targets of --static")
    p.add_argument("--markdown", action="store_true", help="--static as the Markdown table of docs/kernels.md")
    args = p.parse_args(argv)
    if args.static:
        return 1 if static_report(args.d, args.arch, args.markdown) else 0
    if not torch.cuda.is_available():
        print("benchmarks.kernels: no CUDA device on this machine; kernel throughput needs a GPU (nothing measured).")
        return 0
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    if args.compare_dq:
        from diffzoo.kernels import triton_diff as td

        family = td.target_family(torch.cuda.get_device_capability())
        print(f"device: {torch.cuda.get_device_name()} ({family}: default dQ path {td.DQ_DEFAULT[family]}), "
              f"torch {torch.__version__}, bf16, model width D = {args.width}, B * N = {args.tokens} tokens; "
              f"triton forward + backward, medians of {args.rounds} alternated rounds of {args.reps} timings")
        print(DQ_HEADER)
        print("-" * len(DQ_HEADER))
        results = compare_dq(args.n, args.d, causals, args.width, args.tokens, args.warmup, args.reps, args.rounds)
        ratios = [r["split_over_atomic"] for r in results if "error" not in r]
        if ratios:
            print(f"split / atomic: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
                  f"split faster in {sum(x < 1 for x in ratios)} of {len(ratios)} cells")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, family=family,
                               rounds=args.rounds, rows=results), f, indent=1)
        return 0
    rows = ["standard"] + [r for r in args.rows if r != "standard"] if "standard" in args.rows else args.rows
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, model width D = {args.width}, "
          f"B * N = {args.tokens} tokens")
    print("TFLOP/s count the FLOPs of docs/design.md (Kernel cost model): differential rows 6 N^2 D (fwd) / "
          "16 N^2 D (fwd+bwd), standard 4 / 14; causal halves them")
    print(_HEADER)
    print("-" * len(_HEADER))
    if args.deterministic:
        print("deterministic algorithms: on (triton: dQ by the atomic-free kernel)")
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(args.deterministic, warn_only=True)
    try:
        results = run(args.n, args.d, causals, rows, args.width, args.tokens, args.warmup, args.reps)
    finally:
        torch.use_deterministic_algorithms(old, warn_only=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           deterministic=args.deterministic, rows=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
