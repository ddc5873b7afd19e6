"""The fused Triton differential-attention kernels against the reference: outputs and every gradient.

Without CUDA the kernels run in Triton's CPU interpreter, which must be switched on
(``TRITON_INTERPRET=1``) before triton is first imported in the process. This module sets it when it
is the first to import triton; when something imported triton earlier (``torch.compile`` does), the
in-process tests skip and ``test_in_subprocess`` runs this module in a fresh interpreter process.
Output buffers are poisoned with NaN, so an element the kernels fail to write shows up as NaN.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_module_in_interpreter, use_triton_interpreter

use_triton_interpreter()  # must precede the first import of triton
triton = pytest.importorskip("triton")

from diffzoo.kernels import diff_attention  # noqa: E402
from diffzoo.kernels import triton_diff as td  # noqa: E402
from diffzoo.kernels.reference import diff_attention_reference  # noqa: E402
from diffzoo.kernels.registry import Call  # noqa: E402

# the interpreter calls a deprecated numpy conversion on every index
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"
IN_PROCESS = ON_CUDA or (td.INTERPRET and not td._INTERPRETER_BROKEN)


@pytest.fixture(autouse=True)
def _kernels_runnable(request, monkeypatch):
    if request.function.__name__ != "test_in_subprocess":
        if not IN_PROCESS:
            pytest.skip("triton was imported without the interpreter; test_in_subprocess runs these tests")
        monkeypatch.setattr(td, "_poison", True)


def test_in_subprocess(request):
    if IN_PROCESS:
        pytest.skip("the kernel tests run in this process")
    run_module_in_interpreter(__file__, request.config.option.markexpr or "not slow")


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def make_inputs(B=2, H=1, Hkv=1, Nq=17, Nk=17, d=16, dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    dv = 2 * d if dv is None else dv
    q = torch.randn(B, 2 * H, Nq, d, generator=g).to(DEVICE, dtype).requires_grad_()
    k = torch.randn(B, 2 * Hkv, Nk, d, generator=g).to(DEVICE, dtype).requires_grad_()
    v = torch.randn(B, Hkv, Nk, dv, generator=g).to(DEVICE, dtype).requires_grad_()
    lam = torch.tensor(0.63, device=DEVICE, requires_grad=True)
    return q, k, v, lam


@contextlib.contextmanager
def deterministic(flag: bool):
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(flag, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old, warn_only=True)


def run_both(q, k, v, lam, *, blocks=None, det=False, seed=1, **kw):
    """Kernel and reference outputs and gradients (q, k, v, lam) for the same upstream gradient."""
    blocks_ctx = td._test_blocks(*blocks) if blocks else contextlib.nullcontext()
    with blocks_ctx, deterministic(det):
        out = td.diff_attention_triton(q, k, v, lam, **kw)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
        grads = torch.autograd.grad(out, (q, k, v, lam), dout)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)] + [lam.detach().clone().requires_grad_()]
    ref = diff_attention_reference(*leaves, **kw)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float())
    return (out, *grads), (ref, *ref_grads)


NAMES = ("out", "dq", "dk", "dv", "dlam")


def assert_matches(got, want, atol=1e-4, rtol=1e-4):
    for name, a, b in zip(NAMES, got, want):
        assert torch.isfinite(a).all(), f"{name} has non-finite values (unwritten or NaN)"
        torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol, msg=lambda m, name=name: f"{name}: {m}")


def assert_close_rel(got, want, tol):
    """Max error relative to the largest reference magnitude (for fp16 / bf16 against fp32)."""
    for name, a, b in zip(NAMES, got, want):
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        err = (a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


# --------------------------------------------------------------------------------------------------
# correctness against the reference
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "Nq, Nk, causal, blocks, det",
    [
        (1, 1, False, None, False),
        (1, 1, True, None, True),
        (17, 17, True, (16, 16), False),  # ragged tails on both axes
        (64, 64, False, (16, 32), True),  # exact multiples, several block boundaries
        (64, 64, True, (32, 16), False),  # rectangular blocks on the diagonal
        (100, 100, True, (32, 32), True),
        (100, 100, False, (32, 64), False),
        (17, 100, True, (16, 32), False),  # kv-cache: queries continue a longer cache
        (1, 100, True, (16, 32), True),  # one decoding step
        (100, 17, True, (32, 16), False),  # more queries than keys: leading rows see no key
        (64, 100, False, (32, 32), True),
    ],
)
def test_fp32_matches_reference(Nq, Nk, causal, blocks, det):
    q, k, v, lam = make_inputs(Nq=Nq, Nk=Nk)
    got, want = run_both(q, k, v, lam, causal=causal, blocks=blocks, det=det)
    assert_matches(got, want)


@pytest.mark.parametrize("dtype, tol, det", [(torch.float16, 5e-3, False), (torch.bfloat16, 3e-2, True)])
def test_half_precision_matches_reference(dtype, tol, det):
    q, k, v, lam = make_inputs(Nq=70, Nk=70, dtype=dtype)
    kpm = torch.zeros(2, 70, dtype=torch.bool, device=DEVICE)
    kpm[1, 50:] = True
    got, want = run_both(q, k, v, lam, causal=True, key_padding_mask=kpm, blocks=(32, 32), det=det)
    assert got[0].dtype == dtype and got[1].dtype == dtype
    assert_close_rel(got, want, tol)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_lengths_differ_per_item(causal):
    B, N = 3, 40
    q, k, v, lam = make_inputs(B=B, Nq=N, Nk=N)
    kpm = torch.zeros(B, N, dtype=torch.bool, device=DEVICE)
    kpm[1, 23:] = True  # length 23
    kpm[2, :] = True  # fully padded item: every row has no key
    got, want = run_both(q, k, v, lam, causal=causal, key_padding_mask=kpm, blocks=(16, 16))
    assert_matches(got, want)
    out, dq, dk, dv, _ = got
    assert (out[2] == 0).all() and (dq[2] == 0).all() and (dk[2] == 0).all() and (dv[2] == 0).all()
    assert (dk[1, :, 23:] == 0).all() and (dv[1, :, 23:] == 0).all()  # padded keys get no gradient


def test_key_padding_not_only_a_suffix():
    q, k, v, lam = make_inputs(Nq=40, Nk=40)
    g = torch.Generator().manual_seed(3)
    kpm = (torch.rand(2, 40, generator=g) < 0.4).to(DEVICE)
    got, want = run_both(q, k, v, lam, key_padding_mask=kpm, causal=True, blocks=(16, 16))
    assert_matches(got, want)


@pytest.mark.parametrize("Hkv, det", [(2, False), (1, True)])
def test_grouped_query_heads(Hkv, det):
    q, k, v, lam = make_inputs(B=1, H=4, Hkv=Hkv, Nq=33, Nk=33)
    kpm = torch.zeros(1, 33, dtype=torch.bool, device=DEVICE)
    kpm[0, 27:] = True
    got, want = run_both(q, k, v, lam, causal=True, key_padding_mask=kpm, blocks=(16, 16), det=det)
    assert_matches(got, want)


def test_bool_attn_mask_with_fully_masked_row():
    Nq, Nk = 33, 40
    q, k, v, lam = make_inputs(Nq=Nq, Nk=Nk)
    g = torch.Generator().manual_seed(5)
    mask = (torch.rand(Nq, Nk, generator=g) < 0.7).to(DEVICE)  # broadcast over batch and heads
    mask[4] = False  # a row with no allowed key
    got, want = run_both(q, k, v, lam, attn_mask=mask, blocks=(16, 16))
    assert_matches(got, want)
    assert (got[0][:, :, 4] == 0).all() and (got[1][:, :, 4] == 0).all()


@pytest.mark.parametrize("det", [True])
def test_float_attn_mask_per_head_with_padding_and_causal(det):
    B, H, N = 2, 2, 33
    q, k, v, lam = make_inputs(B=B, H=H, Nq=N, Nk=N)
    g = torch.Generator().manual_seed(6)
    bias = torch.randn(1, H, N, N, generator=g).to(DEVICE)
    kpm = torch.zeros(B, N, dtype=torch.bool, device=DEVICE)
    kpm[1, 25:] = True
    got, want = run_both(q, k, v, lam, attn_mask=bias, key_padding_mask=kpm, causal=True, blocks=(16, 16), det=det)
    assert_matches(got, want)


def test_large_negative_finite_mask():
    """A ``-1e4`` "mask" is finite: fully covered rows stay uniform, and padding keys never leak in."""
    Nq, Nk = 20, 40  # ragged last key tile
    q, k, v, lam = make_inputs(B=1, Nq=Nq, Nk=Nk)
    g = torch.Generator().manual_seed(8)
    bias = torch.where(torch.rand(Nq, Nk, generator=g) < 0.5, 0.0, -1e4).to(DEVICE)
    bias[3] = -1e4  # every key carries the same large negative bias: a uniform row
    got, want = run_both(q, k, v, lam, attn_mask=bias, blocks=(16, 32))
    # logits near -1e4 carry only ~1e-3 of absolute precision in fp32, in the reference as well
    assert_matches(got, want, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("d, dv", [(32, 64), (24, 40), (16, 16), (8, 16)])
def test_head_widths(d, dv):
    """Powers of two run as they are; other widths are zero-padded to the next power of two."""
    q, k, v, lam = make_inputs(B=1, Nq=33, Nk=33, d=d, dv=dv)
    got, want = run_both(q, k, v, lam, causal=True, blocks=(16, 16))
    assert got[0].shape == (1, 1, 33, dv)
    assert_matches(got, want)


def test_explicit_scale_and_non_contiguous_inputs():
    B, H, N, d = 2, 1, 30, 16
    g = torch.Generator().manual_seed(7)
    # the usual layer layout: (B, N, heads, width) viewed as (B, heads, N, width)
    q = torch.randn(B, N, 2 * H, d, generator=g).to(DEVICE).transpose(1, 2).requires_grad_()
    k = torch.randn(B, N, 2 * H, d, generator=g).to(DEVICE).transpose(1, 2).requires_grad_()
    v = torch.randn(B, N, H, 2 * d, generator=g).to(DEVICE).transpose(1, 2).requires_grad_()
    lam = torch.tensor(0.2, device=DEVICE, requires_grad=True)
    assert not q.is_contiguous()
    got, want = run_both(q, k, v, lam, scale=0.3, blocks=(16, 16))
    assert_matches(got, want)


def test_inference_matches_training_forward():
    q, k, v, lam = make_inputs(Nq=40, Nk=40)
    with torch.no_grad():
        out_ng = td.diff_attention_triton(q, k, v, lam, causal=True)
    out = td.diff_attention_triton(q, k, v, lam, causal=True)
    assert out.requires_grad and not out_ng.requires_grad
    torch.testing.assert_close(out_ng, out.detach(), atol=0, rtol=0)


def test_gradient_paths_agree():
    """Atomic dQ, the atomic-free dQ kernel and the deterministic path give the same gradients."""
    q, k, v, lam = make_inputs(B=1, H=2, Hkv=1, Nq=40, Nk=40)
    with td.dq_path("atomic"):
        got_atomic, want = run_both(q, k, v, lam, causal=True, blocks=(16, 16), det=False)
    with td.dq_path("split"):
        got_split, _ = run_both(q, k, v, lam, causal=True, blocks=(16, 16), det=False)
    got_det, _ = run_both(q, k, v, lam, causal=True, blocks=(16, 16), det=True)
    for name, a, b, c, r in zip(NAMES, got_atomic, got_split, got_det, want):
        torch.testing.assert_close(a, r.to(a.dtype), atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
        for other in (b, c):
            torch.testing.assert_close(a, other, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    # the split path with deterministic algorithms off and on runs the same kernels on the same blocks
    for name, b, c in zip(NAMES, got_split, got_det):
        torch.testing.assert_close(b, c, atol=0, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_dq_path_default_per_family_and_its_override(monkeypatch):
    assert td._split_dq(deterministic=True) and not td._split_dq(deterministic=False)  # interpreter: atomic
    monkeypatch.setattr(td, "INTERPRET", False)
    for family, path in td.DQ_DEFAULT.items():
        monkeypatch.setattr(td, "_device_family", lambda family=family: family)
        assert td._split_dq(deterministic=False) == (path == "split"), family
        assert td._split_dq(deterministic=True), family  # deterministic algorithms always take the split path
        for forced in td.DQ_PATHS:
            with td.dq_path(forced):
                assert td._split_dq(deterministic=False) == (forced == "split")
                assert td._split_dq(deterministic=True)
    with pytest.raises(ValueError, match="unknown dQ path 'fast'"):
        with td.dq_path("fast"):
            pass
    assert td._forced_dq is None


def test_public_entry_point_selects_triton():
    q, k, v, lam = make_inputs(Nq=20, Nk=20)
    out = diff_attention(q, k, v, lam, causal=True, backend="triton")
    ref = diff_attention_reference(q, k, v, lam, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_torch_compile_traces_the_custom_op():
    q, k, v, lam = make_inputs(Nq=20, Nk=20)

    def f(q, k, v, lam):
        return td.diff_attention_triton(q, k, v, lam, causal=True).square().sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)  # fullgraph: no graph break allowed
    loss = compiled(q, k, v, lam)
    grads = torch.autograd.grad(loss, (q, k, v, lam))
    loss_ref = f(q, k, v, lam)
    grads_ref = torch.autograd.grad(loss_ref, (q, k, v, lam))
    torch.testing.assert_close(loss, loss_ref)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------------
# what the kernel refuses, and the test hooks themselves
# --------------------------------------------------------------------------------------------------


def _call(q, k, v, attn_mask=None, dropout_p=0.0):
    return Call(q, k, v, attn_mask, None, False, dropout_p, True)


def test_unsupported_reasons():
    q, k, v, lam = make_inputs()
    assert td.unsupported(_call(q, k, v)) is None
    assert "dropout" in td.unsupported(_call(q, k, v, dropout_p=0.1))
    wide = torch.zeros(1, 2, 4, 256, device=DEVICE)
    assert "head width" in td.unsupported(_call(wide, wide, torch.zeros(1, 1, 4, 512, device=DEVICE)))
    bias = torch.zeros(17, 17, device=DEVICE, requires_grad=True)
    assert "attn_mask" in td.unsupported(_call(q, k, v, attn_mask=bias))
    ints = torch.zeros(1, 2, 4, 16, dtype=torch.float64, device=DEVICE)
    assert "dtype" in td.unsupported(_call(ints, ints, torch.zeros(1, 1, 4, 32, dtype=torch.float64, device=DEVICE)))
    with pytest.raises(ValueError, match="dropout"):
        td.diff_attention_triton(q, k, v, lam, dropout_p=0.1)


def test_poison_hook_fills_nan():
    t = td._alloc((3, 4), torch.float32, torch.device(DEVICE))
    assert torch.isnan(t).all()


# --------------------------------------------------------------------------------------------------
# larger cases
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_larger_fp32(d, causal):
    q, k, v, lam = make_inputs(B=1, H=2, Hkv=1, Nq=256, Nk=256, d=d)
    kpm = torch.zeros(1, 256, dtype=torch.bool, device=DEVICE)
    kpm[0, 200:] = True
    got, want = run_both(q, k, v, lam, causal=causal, key_padding_mask=kpm, blocks=(64, 32))
    assert_matches(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_larger_half_precision_kv_cache(dtype, tol):
    q, k, v, lam = make_inputs(B=2, H=4, Hkv=2, Nq=77, Nk=256, d=64, dtype=dtype)
    got, want = run_both(q, k, v, lam, causal=True, blocks=(32, 64))
    assert_close_rel(got, want, tol)


# --------------------------------------------------------------------------------------------------
# masked tiles, limits and refusals
# --------------------------------------------------------------------------------------------------

SHIFT_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["left_padding", "block_diagonal"])
def test_constant_logit_shift_after_fully_masked_tiles(dtype, layout):
    """Adding one constant to every allowed logit leaves softmax unchanged, also after key tiles that a
    row sees fully masked (left-padded batches, block-diagonal and sliding-window masks reach this)."""
    Nq, Nk = 64, 256
    q, k, v, lam = make_inputs(B=1, Nq=Nq, Nk=Nk, dtype=dtype, seed=3)
    kw: dict = {}
    if layout == "left_padding":  # the first 128 keys are padding: 8 fully masked 16-key tiles first
        kpm = torch.zeros(1, Nk, dtype=torch.bool, device=DEVICE)
        kpm[:, :128] = True
        kw["key_padding_mask"] = kpm
        allowed = ~kpm[0].expand(Nq, Nk)
    else:  # query row i sees the 64-key block 2 + i // 32 only
        block = torch.arange(Nk, device=DEVICE) // 64
        allowed = block[None, :] == (2 + torch.arange(Nq, device=DEVICE) // 32)[:, None]
    for shift in (0.0, -1000.0, 30.0):
        bias = torch.where(allowed, torch.tensor(shift, device=DEVICE), torch.tensor(float("-inf"), device=DEVICE))
        got, want = run_both(q, k, v, lam, attn_mask=bias, blocks=(16, 16), **kw)
        assert got[0].abs().amax(-1).min() > 0, f"shift {shift}: rows with allowed keys came out as zeros"
        assert_close_rel(got, want, SHIFT_TOL[dtype])


def test_backward_fake_kernel_declares_contiguous_gradients():
    """The fake (meta) backward must describe what the real op returns, or inductor's stride asserts fail."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 9, 2, 16, generator=g).permute(0, 2, 1, 3) for _ in range(2))  # token-major views
    v = torch.randn(2, 9, 1, 32, generator=g).permute(0, 2, 1, 3)
    lam = torch.tensor(0.4)
    out, parts, lse = td._fwd_op(q, k, v, lam, None, None, False, 0.25, True, False)
    args = (torch.randn_like(out), q, k, v, lam, None, None, parts, lse, False, 0.25)
    for det in (False, True):
        real = td._bwd_op(*args, det)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = td._bwd_op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args), det)
        for name, r, f in zip(("dq", "dk", "dv", "dlam"), real, fake):
            assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype), f"{name} (deterministic={det})"


@pytest.mark.slow
def test_inductor_compiles_non_contiguous_inputs():
    import torch._inductor.config as inductor_config

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 9, 2, 16, generator=g).permute(0, 2, 1, 3).requires_grad_() for _ in range(2))
    v = torch.randn(2, 9, 1, 32, generator=g).permute(0, 2, 1, 3).requires_grad_()
    lam = torch.tensor(0.4, requires_grad=True)

    def f(q, k, v, lam):
        return td.diff_attention_triton(q, k, v, lam).square().sum()

    with inductor_config.patch(force_disable_caches=True):  # a cached graph would keep an old op's strides
        compiled = torch.compile(f, backend="inductor", fullgraph=True)
        grads = torch.autograd.grad(compiled(q, k, v, lam), (q, k, v, lam))
    grads_ref = torch.autograd.grad(f(q, k, v, lam), (q, k, v, lam))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


def test_fp32_runs_after_the_new_tf32_api_was_used():
    """Reading the legacy ``allow_tf32`` flag raises once ``fp32_precision`` has been set."""
    matmul = torch.backends.cuda.matmul
    old = matmul.fp32_precision
    q, k, v, lam = make_inputs(Nq=20, Nk=20)
    try:
        matmul.fp32_precision = "tf32"
        out = td.diff_attention_triton(q, k, v, lam, causal=True)
        assert td.tf32_enabled() and td._precision(torch.float32) == "tf32"
        matmul.fp32_precision = "ieee"
        assert not td.tf32_enabled() and td._precision(torch.float32) == "ieee"
        assert td._precision(torch.bfloat16) == "tf32"
    finally:
        matmul.fp32_precision = old
    torch.testing.assert_close(out, diff_attention_reference(q, k, v, lam, causal=True), atol=2e-3, rtol=2e-3)


_LARGE_OFFSETS = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from diffzoo.kernels import triton_diff as td
from diffzoo.kernels.reference import diff_attention_reference

g = torch.Generator().manual_seed(0)
# q rows 256.. and mask rows 256.. lie beyond 2**31 elements from their base; the storages are
# allocated but only the rows read are ever touched
rows, d, stride = 272, 16, 2**23
q_store = torch.empty(rows * stride, dtype=torch.float16)
q = q_store.as_strided((1, 2, rows, d), (0, d, stride, 1))
q.copy_(torch.randn(1, 2, rows, d, generator=g))
k = torch.randn(1, 2, 40, d, generator=g).half()
v = torch.randn(1, 1, 40, 2 * d, generator=g).half()
mask_store = torch.empty(rows * stride, dtype=torch.float32)
mask = mask_store.as_strided((rows, 40), (stride, 1))
mask.copy_(torch.randn(rows, 40, generator=g))
lam = torch.tensor(0.3)
worst = 0.0
with td._test_blocks(16, 16):
    for attn_mask in (None, mask):
        out = td.diff_attention_triton(q, k, v, lam, attn_mask=attn_mask)
        ref = diff_attention_reference(q.float(), k.float(), v.float(), lam, attn_mask=attn_mask)
        worst = max(worst, ((out.float() - ref).abs().max() / ref.abs().max()).item())
print("relative error", worst)
sys.exit(0 if worst < 5e-3 else 1)
"""


def test_offsets_beyond_int32_in_the_interpreter():
    """Row offsets past 2**31 elements (a token-major view of a long sequence, a dense mask of
    Nq * Nk >= 2**31): 32-bit offsets wrap around and read the wrong memory (or crash)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _LARGE_OFFSETS], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"


def test_launch_grids_stay_within_cuda_limits(monkeypatch):
    """CUDA caps grid axes 1 and 2 at 65535 and axis 0 at 2**31 - 1: batch * heads goes on axis 0."""
    grids = []

    def record(kernel, grid, args, kwargs):
        grids.append(grid(kwargs) if callable(grid) else grid)

    monkeypatch.setattr(td, "_run_kernel", record)
    B, H = 35000, 2  # B * H = 70000 programs per query tile
    q, k, v, lam = make_inputs(B=B, H=H, Hkv=H, Nq=1, Nk=1)
    for det, path in ((False, "atomic"), (False, "split"), (True, "atomic")):
        with deterministic(det), td.dq_path(path):
            out = td.diff_attention_triton(q, k, v, lam)
            torch.autograd.grad(out, (q, k, v, lam), torch.ones_like(out))
    assert len(grids) == 3 * 3 + 2  # forward, delta, dK/dV (+ dQ on the split path and when deterministic)
    for grid in grids:
        assert grid[0] >= B * H and grid[0] <= 2**31 - 1
        assert all(n <= 65535 for n in grid[1:]), grid


def test_refuses_what_it_would_get_wrong_or_run_slowly(monkeypatch):
    q, k, v, lam = make_inputs(H=2, Hkv=2, Nq=20, Nk=20)
    per_head = torch.tensor([0.2, 0.7]).view(1, 2, 1, 1).to(DEVICE)
    reason = td.unsupported(Call(q, k, v, None, None, False, 0.0, True, per_head))
    assert reason is not None and "scalar lambda" in reason
    # auto falls back to a backend that takes a per-head lambda instead of raising
    with torch.no_grad():
        out = diff_attention(q, k, v, per_head, backend="auto")
        torch.testing.assert_close(out, diff_attention_reference(q, k, v, per_head), atol=1e-5, rtol=1e-5)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "compute capability 7.5" in td._device_refusal(cuda, torch.float16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert td._device_refusal(cuda, torch.bfloat16) is None
    monkeypatch.setattr(td, "tf32_enabled", lambda: False)
    assert "TF32" in td._device_refusal(cuda, torch.float32)
    monkeypatch.setattr(td, "tf32_enabled", lambda: True)
    assert td._device_refusal(cuda, torch.float32) is None


def test_autotuning_keys_on_sequence_length_buckets():
    for kind, tuner in td.TUNED.items():
        assert {"NQ_BUCKET", "NK_BUCKET", "D", "CAUSAL"} <= set(tuner.keys), kind
    assert [td.length_bucket(n) for n in (1, 16, 17, 300, 4096, 4097, 10**7)] == [16, 16, 32, 512, 4096, 8192, 65536]


def test_deterministic_launches_use_the_pinned_configuration(monkeypatch):
    """Without autotuning the reduction order, and so every bit, is the same in every process."""
    launched = []
    monkeypatch.setattr(td, "INTERPRET", False)
    monkeypatch.setattr(td, "_device_family", lambda: "sm90")
    monkeypatch.setattr(td, "_run_kernel", lambda kernel, grid, args, kwargs: launched.append((kernel, kwargs)))
    for kind in td.KERNELS:
        for d in (64, 128):
            launched.clear()
            td._launch(kind, None, (), {"D": d}, deterministic=True)
            (kernel, kwargs), = launched
            bm, bn, warps, stages = td.CONFIGS[kind]["sm90"][d][0]
            assert kernel is td.KERNELS[kind]
            assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"]) == (bm, bn, warps,
                                                                                                        stages)
            launched.clear()
            td._launch(kind, None, (), {"D": d}, deterministic=False)
            assert launched[0][0] is td.TUNED[kind]
