"""Throughput of the differential-attention kernels on a CUDA GPU, against matched standard attention.

    python -m benchmarks.kernels                          # N = 1K..16K, d = 64 and 128, causal and not
    python -m benchmarks.kernels --n 4096 --d 128 --causal yes
    python -m benchmarks.kernels --ptxas                  # no GPU needed: sm_90a registers / spills

Rows, at equal model width ``D = 2H * d`` (default 2048) and ``B * N = 16K`` tokens per step:

* ``triton``: ``diff_attention(backend="triton")``, the fused kernels (``H`` differential heads).
* ``sdpa``: ``diff_attention(backend="sdpa")``, both branches folded into SDPA calls.
* ``standard``: ``F.scaled_dot_product_attention`` on q, k, v of shape ``(B, 2H, N, d)`` - the
  baseline with matched parameters (FlashAttention-2-class kernel on recent GPUs).

FLOP counts (docs/design.md, "Kernel cost model": attention core, non-causal, halved for causal): the
differential rows count the fused algorithm, forward ``6 N^2 D`` and forward+backward ``16 N^2 D`` per sequence, for
both backends (the ``sdpa`` backend executes more, so its figure is "useful" throughput); the
standard row counts ``4 N^2 D`` and ``14 N^2 D``. The triton kernels with atomic dQ execute exactly
the fused count. Times are medians of CUDA-event timings of bf16 runs after warm-up (the first calls
also autotune the Triton kernels). ``x std`` is the time over the standard row's time.

``--ptxas`` compiles every autotuning candidate of the Triton kernels for sm_90a (H100) without a
GPU and prints ptxas' register and spill counts: a static check of register pressure, not a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

FLOPS = {  # per N^2 D, non-causal: (forward, forward + backward)
    "diff": (6.0, 16.0),
    "standard": (4.0, 14.0),
}


def _time_ms(fn: Callable[[], None], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _make_case(row: str, B: int, N: int, width: int, d: int, causal: bool):
    """``(forward, forward_backward)`` closures for one row."""
    from diffzoo.kernels import diff_attention

    dev, dt = "cuda", torch.bfloat16
    heads = width // d  # 2H standard heads of width d
    g = torch.Generator(device=dev).manual_seed(0)
    if row == "standard":
        q, k, v = (torch.randn(B, heads, N, d, device=dev, dtype=dt, generator=g).requires_grad_() for _ in range(3))
        leaves: tuple = (q, k, v)

        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    else:
        q = torch.randn(B, heads, N, d, device=dev, dtype=dt, generator=g).requires_grad_()
        k = torch.randn(B, heads, N, d, device=dev, dtype=dt, generator=g).requires_grad_()
        v = torch.randn(B, heads // 2, N, 2 * d, device=dev, dtype=dt, generator=g).requires_grad_()
        lam = torch.tensor(0.5, device=dev, requires_grad=True)
        leaves = (q, k, v, lam)

        def fwd():
            return diff_attention(q, k, v, lam, causal=causal, backend=row)

    with torch.no_grad():
        dout = torch.randn_like(fwd())

    def forward():
        with torch.no_grad():
            fwd()

    def forward_backward():
        torch.autograd.grad(fwd(), leaves, dout)

    return forward, forward_backward


def run(
    ns: list[int], ds: list[int], causals: list[bool], rows: list[str], width: int, tokens: int, warmup: int, reps: int
) -> list[dict]:
    results = []
    print(f"device: {torch.cuda.get_device_name()}, bf16, model width D = {width}, B * N = {tokens} tokens")
    print("TFLOP/s count the FLOPs of docs/design.md (Kernel cost model): differential rows 6 N^2 D (fwd) / "
          "16 N^2 D (fwd+bwd), standard 4 / 14; causal halves them")
    header = f"{'row':9s} {'causal':6s} {'d':>4s} {'N':>6s} {'B':>3s} | {'fwd ms':>8s} {'TFLOP/s':>7s} | " \
             f"{'f+b ms':>8s} {'TFLOP/s':>7s} {'x std':>6s}"
    print(header)
    print("-" * len(header))
    for causal in causals:
        for d in ds:
            for N in ns:
                B = max(1, tokens // N)
                base: float | None = None
                for row in rows:
                    kind = "standard" if row == "standard" else "diff"
                    f_fwd, f_all = FLOPS[kind]
                    scale = B * N * N * width * (0.5 if causal else 1.0)
                    try:
                        forward, forward_backward = _make_case(row, B, N, width, d, causal)
                        t_fwd = _time_ms(forward, warmup, reps)
                        t_all = _time_ms(forward_backward, warmup, reps)
                    except Exception as e:  # out of memory, a backend refusing a size, a compile failure
                        print(f"{row:9s} {str(causal):6s} {d:4d} {N:6d} {B:3d} | failed: {str(e).splitlines()[0][:80]}")
                        torch.cuda.empty_cache()
                        continue
                    if row == "standard":
                        base = t_all
                    ratio = f"{t_all / base:6.2f}" if base else "   n/a"
                    tf_fwd = f_fwd * scale / (t_fwd * 1e-3) / 1e12
                    tf_all = f_all * scale / (t_all * 1e-3) / 1e12
                    print(f"{row:9s} {str(causal):6s} {d:4d} {N:6d} {B:3d} | {t_fwd:8.3f} {tf_fwd:7.1f} | "
                          f"{t_all:8.3f} {tf_all:7.1f} {ratio}", flush=True)
                    results.append(dict(row=row, causal=causal, d=d, N=N, B=B, fwd_ms=t_fwd, fwd_bwd_ms=t_all,
                                        fwd_tflops=tf_fwd, fwd_bwd_tflops=tf_all))
                    torch.cuda.empty_cache()
    return results


def ptxas_report(ds: list[int], causal: bool = True, arch: int = 90) -> None:
    """Compile the bf16 kernels for ``sm_<arch>a`` (no GPU needed) and print registers and spills."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from diffzoo.kernels import triton_diff as td

    if td.INTERPRET:
        print("--ptxas needs the compiler: unset TRITON_INTERPRET")
        return
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    target = GPUTarget("cuda", arch, 32)
    bf, f32 = "*bf16", "*fp32"
    kernels = [
        ("forward", td._fwd_kernel, td._FWD_CONFIGS, "DV",
         dict(Q=bf, K=bf, V=bf, OUT=bf, PARTS=bf), dict(SAVE_PARTS=True)),
        ("bwd dK/dV", td._bwd_kv_kernel, td._BWD_KV_CONFIGS, "DV_",
         dict(Q=bf, K=bf, V=bf, DO=bf, DQ=f32, DK=bf, DV=bf), dict(DQ_ATOMIC=True)),
        ("bwd dQ", td._bwd_q_kernel, td._BWD_Q_CONFIGS, "DV", dict(Q=bf, K=bf, V=bf, DO=bf, DQ=bf), {}),
    ]
    print(f"ptxas -v for sm_{arch}a, bf16, causal={causal}, no masks (static register pressure only)")
    for d in ds:
        for name, fn, table, dv_name, ptrs, extra in kernels:
            for bm, bn, warps, stages in table[64 if d <= 64 else 128]:
                consts = dict(D=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, HAS_KPB=False, HAS_BIAS=False,
                              UPCAST=False, PREC="tf32", **extra)
                consts[dv_name] = 2 * d
                sig = {}
                for a in fn.arg_names:
                    if a in consts:
                        sig[a] = "constexpr"
                    elif a in ptrs or a in ("LAM", "KPB", "BIAS", "LSE", "DELTA"):
                        sig[a] = ptrs.get(a, f32)
                    else:
                        sig[a] = "fp32" if a in ("qk_scale", "scale") else "i32"
                label = f"{name:9s} d={d:3d} BLOCK_M={bm:3d} BLOCK_N={bn:3d} warps={warps} stages={stages}"
                try:
                    src = ASTSource(fn=fn, signature=sig,
                                    constexprs={(fn.arg_names.index(a),): v for a, v in consts.items()})
                    kernel = triton.compile(src, target=target, options={"num_warps": warps, "num_stages": stages})
                    with tempfile.TemporaryDirectory() as tmp:
                        path = os.path.join(tmp, "k.ptx")
                        with open(path, "w") as f:
                            f.write(kernel.asm["ptx"])
                        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", path, "-o", path + ".o"],
                                             capture_output=True, text=True).stderr
                    regs = re.search(r"Used (\d+) registers", out)
                    spill = re.search(r"(\d+) bytes spill stores", out)
                    print(f"{label}: {regs.group(1) if regs else '?'} registers, "
                          f"{spill.group(1) if spill else '?'} bytes spilled, shared {kernel.metadata.shared} B",
                          flush=True)
                except Exception as e:  # the compiler API is Triton-version specific
                    print(f"{label}: failed ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})")


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
    p.add_argument("--ptxas", action="store_true", help="compile for sm_90a and print registers / spills (no GPU)")
    args = p.parse_args(argv)
    if args.ptxas:
        ptxas_report(args.d)
        return 0
    if not torch.cuda.is_available():
        print("benchmarks.kernels: no CUDA device on this machine; kernel throughput needs a GPU (nothing measured).")
        return 0
    rows = ["standard"] + [r for r in args.rows if r != "standard"] if "standard" in args.rows else args.rows
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    run(args.n, args.d, causals, rows, args.width, args.tokens, args.warmup, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
