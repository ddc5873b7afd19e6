"""Time and peak memory of differential attention against standard attention on this machine.

    python -m benchmarks.attention                 # the table of docs/performance.md
    python -m benchmarks.attention --n 256 1024    # fewer sizes
    python -m benchmarks.attention --level kernel  # attention core only (no projections)
    python -m benchmarks.attention --causal        # with a causal mask (the decoder setting)

Every configuration runs in a fresh subprocess so that its peak memory can be read on CPU
(``ru_maxrss`` growth over the set-up state); on CUDA ``torch.cuda.max_memory_allocated`` is used.
Times are medians; ratios are taken against the matched standard attention in the same run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time

WIDTH = 768
STANDARD = "standard attention (12 heads x 64, sdpa)"


def _candidates(level: str, causal: bool = False, device: str = "cpu") -> list[tuple[str, str, str | None]]:
    """(label, implementation, backend) rows, standard first; the Triton row only on a CUDA device."""
    rows = [(STANDARD, "softmax", "sdpa")]
    backends = ["reference", "sdpa", "blockwise", "triton", "auto"]
    if not device.startswith("cuda"):
        backends.remove("triton")
    for backend in backends:
        rows.append((f"diffzoo DiffAttention [{backend}]", "diff", backend))
    if level == "module" and not causal:  # timm's DiffAttention has no causal mask
        rows.append(("timm DiffAttention (sdpa)", "timm", None))
    return rows


def _build(impl: str, backend: str | None, level: str, n: int, device: str, causal: bool = False):
    import torch

    from diffzoo.kernels import attention, diff_attention, select_backend
    from diffzoo.kernels.registry import Call
    from diffzoo.layers import Attention, DiffAttention

    torch.manual_seed(0)
    picked = backend
    if level == "module":
        x = torch.randn(1, n, WIDTH, device=device, requires_grad=True)
        if impl == "softmax":
            mod = Attention(WIDTH, 12, qkv_bias=True, causal=causal, backend=backend)
        elif impl == "diff":
            mod = DiffAttention(WIDTH, 6, qkv_bias=True, depth=3, causal=causal, backend=backend)
        else:
            from timm.layers import DiffAttention as TimmDiffAttention

            mod = TimmDiffAttention(WIDTH, num_heads=6, qkv_bias=True, depth=3)
        mod = mod.to(device)
        inputs = [x]

        def fn():
            return mod(x)

        params = list(mod.parameters())
    else:
        heads, d = (12, 64) if impl == "softmax" else (6, 64)
        qh = heads if impl == "softmax" else 2 * heads
        q = torch.randn(1, qh, n, d, device=device, requires_grad=True)
        k = torch.randn(1, qh, n, d, device=device, requires_grad=True)
        v = torch.randn(1, heads, n, d if impl == "softmax" else 2 * d, device=device, requires_grad=True)
        lam = torch.tensor(0.5, device=device, requires_grad=True)
        inputs = [q, k, v]
        params = [lam]
        if impl == "softmax":

            def fn():
                return attention(q, k, v, causal=causal, backend=backend)

        else:

            def fn():
                return diff_attention(q, k, v, lam, causal=causal, backend=backend)

    if impl == "diff" and backend == "auto":
        probe = torch.empty(1, 2, 1, 64, device=device)
        call = Call(probe, probe, probe[:, :1], None, None, False, 0.0, True)
        picked = "auto -> " + select_backend("diff", call, "auto").name
    return fn, inputs + params, picked


def _measure(impl, backend, level, n, device, backward, budget_s, causal, queue):
    import torch

    torch.set_grad_enabled(True)
    try:
        fn, leaves, picked = _build(impl, backend, level, n, device, causal)

        def step():
            if backward:
                out = fn()
                out.backward(torch.ones_like(out))
                for t in leaves:
                    t.grad = None
            else:
                with torch.no_grad():
                    fn()
            if device == "cuda":
                torch.cuda.synchronize()

        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter()
        step()  # warm-up, also the peak-memory sample
        first = time.perf_counter() - t0
        if device == "cuda":
            peak = torch.cuda.max_memory_allocated() - base
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
        times = []
        # at least 3 timed repeats, except for cells whose single run exceeds 10 s (N = 16384)
        reps = max(1 if first > 10 else 3, min(20, int(budget_s / max(first, 1e-4))))
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        queue.put({"ok": True, "time": statistics.median(times), "peak": peak, "picked": picked})
    except Exception as e:  # report and go on with the next configuration
        queue.put({"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"})


def _run_one(*args, timeout: float = 900.0) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_measure, args=(*args, queue))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        return {"ok": False, "error": "timed out"}
    return queue.get() if not queue.empty() else {"ok": False, "error": f"exit code {p.exitcode}"}


def machine_description(device: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name()} | torch {torch.__version__}"
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads | torch {torch.__version__}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[256, 1024, 4096, 16384], help="sequence lengths")
    parser.add_argument("--backward-max-n", type=int, default=4096, help="largest N timed with backward")
    parser.add_argument("--reference-max-n", type=int, default=4096, help="largest N for the reference backend")
    parser.add_argument("--level", choices=["module", "kernel"], default="module")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed repeats per cell")
    parser.add_argument("--causal", action="store_true", help="causal mask (decoder setting); no timm row")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)

    mask = "causal" if args.causal else "no mask"
    print(f"# diffzoo attention benchmark: width {WIDTH}, batch 1, {args.level} level, fp32, {mask}")
    print(f"# machine: {machine_description(args.device)}")
    print("# times are medians; 'x std' is the ratio to the standard attention in the same run")
    candidates = _candidates(args.level, args.causal, args.device)
    if all(backend != "triton" for _, _, backend in candidates):
        print("# the triton backend needs a CUDA device: not timed here (see python -m benchmarks.kernels)")
    print()
    results = []
    for backward in (False, True):
        title = "forward + backward" if backward else "forward (no grad)"
        print(f"## {title}\n")
        print("| N | implementation | time (ms) | x std | peak extra memory (MiB) |")
        print("|---|---|---|---|---|")
        for n in args.n:
            if backward and n > args.backward_max_n:
                continue
            std_time = None
            for label, impl, backend in candidates:
                if backend == "reference" and n > args.reference_max_n:
                    continue
                r = _run_one(impl, backend, args.level, n, args.device, backward, args.budget, args.causal)
                results.append({"n": n, "backward": backward, "label": label, **r})
                if not r["ok"]:
                    print(f"| {n} | {label} | n/a | | {r['error']} |")
                    sys.stdout.flush()
                    continue
                if label == STANDARD:
                    std_time = r["time"]
                if (r.get("picked") or "").startswith("auto"):
                    label = f"diffzoo DiffAttention [{r['picked']}]"
                ratio = f"{r['time'] / std_time:.2f}" if std_time else ""
                print(f"| {n} | {label} | {1e3 * r['time']:.1f} | {ratio} | {r['peak'] / 2**20:.0f} |")
                sys.stdout.flush()
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
