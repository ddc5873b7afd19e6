"""GPU suite of the fused Triton kernels: every launch configuration alone, the masked-tile, limit and
compile cases, and the timing table against PyTorch SDPA.

On a CUDA machine (one command, a few minutes on an H100)::

    python -m pytest tests/gpu -q -rA          # or: make gpu

runs each configuration of the device's tables forced alone through forward and backward against the
fp32 reference at d = 64 and 128 in bf16 and fp16, then prints the timing table of
``python -m benchmarks.kernels`` at N = 1K..16K. Without CUDA the same tests run in Triton's CPU
interpreter at small sizes (block sizes only; warps and stages mean nothing there), so CI keeps the
suite itself working.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from conftest import run_module_in_interpreter, use_triton_interpreter

use_triton_interpreter()  # must precede the first import of triton
triton = pytest.importorskip("triton")

from diffzoo.kernels import triton_diff as td  # noqa: E402
from diffzoo.kernels.reference import diff_attention_reference  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"
IN_PROCESS = ON_CUDA or (td.INTERPRET and not td._INTERPRETER_BROKEN)
# GPU: the shipped widths at realistic lengths; interpreter: small shapes that still cross tile edges
WIDTHS = (64, 128) if ON_CUDA else (16,)
TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _candidates() -> list[tuple[str, int, td.Config]]:
    """``(kernel, width bucket, configuration)`` of the tables this device launches from."""
    if ON_CUDA:
        family = td.target_family(torch.cuda.get_device_capability())
        return [(kind, d, c) for kind in td.CONFIGS for d in (64, 128) for c in td.CONFIGS[kind][family][d]]
    # the interpreter honours block sizes only: each distinct pair once, whatever the table
    seen: dict[tuple[str, int, int], td.Config] = {}
    for kind, fams in td.CONFIGS.items():
        for fam in fams.values():
            for cs in fam.values():
                for c in cs:
                    seen.setdefault((kind, c[0], c[1]), c)
    return [(kind, 16, c) for (kind, _, _), c in sorted(seen.items())]


CANDIDATES = _candidates()


@pytest.fixture(autouse=True)
def _kernels_runnable(request):
    if request.function.__name__ != "test_in_subprocess" and not IN_PROCESS:
        pytest.skip("triton was imported without the interpreter; test_in_subprocess runs these tests")


def test_in_subprocess():
    if IN_PROCESS:
        pytest.skip("the suite runs in this process")
    run_module_in_interpreter(__file__, "")


def _inputs(B, H, Hkv, Nq, Nk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 2 * H, Nq, d, generator=g).to(DEVICE, dtype).requires_grad_()
    k = torch.randn(B, 2 * Hkv, Nk, d, generator=g).to(DEVICE, dtype).requires_grad_()
    v = torch.randn(B, Hkv, Nk, 2 * d, generator=g).to(DEVICE, dtype).requires_grad_()
    lam = torch.tensor(0.6, device=DEVICE, requires_grad=True)
    return q, k, v, lam


def _check(q, k, v, lam, dtype, deterministic=False, **kw):
    """Forward and backward of the kernel against the fp32 reference on the same rounded inputs."""
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        out = td.diff_attention_triton(q, k, v, lam, **kw)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        got = (out, *torch.autograd.grad(out, (q, k, v, lam), dout))
    finally:
        torch.use_deterministic_algorithms(old, warn_only=True)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)] + [lam.detach().clone().requires_grad_()]
    ref = diff_attention_reference(*leaves, **kw)
    want = (ref, *torch.autograd.grad(ref, leaves, dout.float()))
    # dlam = -sum(dO * O2) is one sum over every output element: its rounding error scales with the sum of
    # the magnitudes of its terms, not with its (partly cancelling) value
    dlam_scale = (dout.float().abs() * ref.detach().abs()).sum()
    for name, a, b in zip(("out", "dq", "dk", "dv", "dlam"), got, want):
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        scale = dlam_scale if name == "dlam" else b.abs().max()
        err = ((a.float() - b).abs().max() / scale.clamp_min(1e-6)).item()
        assert err <= TOL[dtype], f"{name}: relative error {err:.2e} > {TOL[dtype]:.0e}"


def _case_shapes(case: str) -> dict:
    if case == "ragged_causal_gqa_padding":
        n = 1000 if ON_CUDA else 70
        return dict(B=2, H=4, Hkv=2, Nq=n, Nk=n)
    return dict(B=2, H=4, Hkv=2, Nq=77, Nk=300)  # kv-cache: 77 new queries after a cache of 223 tokens


# the interpreter computes every product in fp32 whatever the dtype: one half type is enough there
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] if ON_CUDA else [torch.bfloat16],
                         ids=["bf16", "fp16"] if ON_CUDA else ["bf16"])
@pytest.mark.parametrize("case", ["ragged_causal_gqa_padding", "kv_cache"])
@pytest.mark.parametrize("kind, d, config", CANDIDATES, ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple)
                         else str(x))
def test_every_configuration_alone(kind, d, config, case, dtype):
    shapes = _case_shapes(case)
    q, k, v, lam = _inputs(**shapes, d=d, dtype=dtype)
    kpm = torch.zeros(shapes["B"], shapes["Nk"], dtype=torch.bool, device=DEVICE)
    kpm[1, shapes["Nk"] - shapes["Nk"] // 3:] = True  # the second item is shorter
    # a dK/dV entry runs with and without its atomic dQ adds; bwd_q entries alone under deterministic algorithms
    paths = td.DQ_PATHS if kind == "bwd_kv" else (None,)
    for path in paths:
        with td.forced_config(kind, config), (td.dq_path(path) if path else contextlib.nullcontext()):
            _check(q, k, v, lam, dtype, deterministic=kind == "bwd_q", causal=True, key_padding_mask=kpm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_constant_shift_after_fully_masked_tiles(dtype):
    """Every allowed logit shifted by -1000 (a left-padded batch): softmax must not change."""
    if dtype == torch.float32:
        if ON_CUDA and not td.tf32_enabled():
            pytest.skip("fp32 runs only with TF32 on CUDA")
        tol = 2e-3 if ON_CUDA else 1e-4
    else:
        tol = TOL[dtype]
    d = WIDTHS[-1]
    q, k, v, lam = _inputs(1, 2, 2, 64, 512 if ON_CUDA else 256, d, dtype)
    kpm = torch.zeros(1, k.shape[2], dtype=torch.bool, device=DEVICE)
    kpm[:, : k.shape[2] // 2] = True
    bias = torch.full((q.shape[2], k.shape[2]), -1000.0, device=DEVICE)
    ctx = td._test_blocks(16, 16) if not ON_CUDA else contextlib.nullcontext()
    with ctx:
        out = td.diff_attention_triton(q, k, v, lam, key_padding_mask=kpm, attn_mask=bias)
    ref = diff_attention_reference(q.float(), k.float(), v.float(), lam, key_padding_mask=kpm, attn_mask=bias)
    assert out.abs().amax(-1).min() > 0, "rows with allowed keys came out as zeros"
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() <= tol


def test_non_contiguous_inputs_compile_with_inductor():
    import torch._inductor.config as inductor_config

    d = WIDTHS[-1]
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 9, 4, d, generator=g).to(DEVICE, torch.bfloat16).permute(0, 2, 1, 3).requires_grad_()
            for _ in range(2))
    v = torch.randn(2, 9, 2, 2 * d, generator=g).to(DEVICE, torch.bfloat16).permute(0, 2, 1, 3).requires_grad_()
    lam = torch.tensor(0.4, device=DEVICE, requires_grad=True)

    def f(q, k, v, lam):
        return td.diff_attention_triton(q, k, v, lam, causal=True).float().square().sum()

    with inductor_config.patch(force_disable_caches=True):
        grads = torch.autograd.grad(torch.compile(f, backend="inductor", fullgraph=True)(q, k, v, lam), (q, k, v))
    for a, b in zip(grads, torch.autograd.grad(f(q, k, v, lam), (q, k, v))):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


_BITS_SCRIPT = """
import hashlib, sys, torch
from diffzoo.kernels import triton_diff as td
dev, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.use_deterministic_algorithms(True)
g = torch.Generator().manual_seed(0)
q = torch.randn(2, 8, n, d, generator=g).to(dev, torch.bfloat16).requires_grad_()
k = torch.randn(2, 4, n, d, generator=g).to(dev, torch.bfloat16).requires_grad_()
v = torch.randn(2, 2, n, 2 * d, generator=g).to(dev, torch.bfloat16).requires_grad_()
lam = torch.tensor(0.6, device=dev, requires_grad=True)
out = td.diff_attention_triton(q, k, v, lam, causal=True)
dout = torch.randn(out.shape, generator=g).to(out)
h = hashlib.sha256()
for t in (out, *torch.autograd.grad(out, (q, k, v, lam), dout)):
    h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
print(h.hexdigest())
"""


def test_deterministic_runs_are_bit_identical_across_processes():
    """Under deterministic algorithms (pinned configurations, dQ without atomics) two fresh processes give
    the same bits for the output and every gradient; the default path adds dQ by atomics and need not."""
    import os
    import subprocess
    import sys

    n, d = (1000, 64) if ON_CUDA else (40, 16)
    env = dict(os.environ) if ON_CUDA else dict(os.environ, TRITON_INTERPRET="1")

    def digest(width: int) -> str:
        proc = subprocess.run([sys.executable, "-c", _BITS_SCRIPT, DEVICE, str(n), str(width)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.split()[-1]

    for width in (d, 2 * d) if ON_CUDA else (d,):
        first, second = digest(width), digest(width)
        assert len(first) == 64 and first == second, f"d = {width}: {first} != {second}"


@pytest.mark.skipif(not ON_CUDA, reason="a real launch of 70,000 programs per tile; the interpreter test records grids")
def test_batch_times_heads_above_the_axis_limit():
    q, k, v, lam = _inputs(35000, 2, 2, 16, 16, 64, torch.bfloat16)  # B * H = 70,000 > 65,535
    _check(q, k, v, lam, torch.bfloat16)


@pytest.mark.skipif(not ON_CUDA, reason="tests/test_triton_kernels.py runs this case in the interpreter")
def test_row_offsets_beyond_int32():
    rows, d, stride = 272, 64, 2**23  # rows 256.. of q start past 2**31 elements (4.5 GB of storage)
    store = torch.empty(rows * stride, dtype=torch.bfloat16, device=DEVICE)
    q = store.as_strided((1, 2, rows, d), (0, d, stride, 1))
    q.copy_(torch.randn(1, 2, rows, d, device=DEVICE))
    k = torch.randn(1, 2, 300, d, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn(1, 1, 300, 2 * d, device=DEVICE, dtype=torch.bfloat16)
    lam = torch.tensor(0.3, device=DEVICE)
    out = td.diff_attention_triton(q, k, v, lam)
    ref = diff_attention_reference(q.float(), k.float(), v.float(), lam)
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() <= TOL[torch.bfloat16]


def test_timing_table(capsys):
    """The benchmark's table (GPU: N = 1K..16K; interpreter: one tiny size, nothing timed meaningfully)."""
    from benchmarks import kernels as bench

    if ON_CUDA:
        ns, reps = [1024, 2048, 4096, 8192, 16384], 20
    else:
        ns, reps = [32], 1
    rows = bench.run(ns, list((64, 128) if ON_CUDA else (16,)), [False, True], ["standard", "triton", "sdpa"],
                     width=2048 if ON_CUDA else 64, tokens=16384 if ON_CUDA else 64, warmup=1 if not ON_CUDA else 5,
                     reps=reps, device=DEVICE)
    with capsys.disabled():
        print()
        print(bench.format_table(rows))
    assert {r["row"] for r in rows} == {"standard", "triton", "sdpa"}
    assert all(r.get("error") is None for r in rows), [r for r in rows if r.get("error")]
    assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in rows)
    assert all(r["sdpa_backend"] for r in rows if r["row"] in ("standard", "sdpa"))
