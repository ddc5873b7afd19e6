"""Every CPU backend of diffzoo.kernels against the reference: outputs and gradients, all mask kinds."""

from __future__ import annotations

import logging

import pytest
import torch

from diffzoo import kernels
from diffzoo.kernels import attention, diff_attention, registry
from diffzoo.kernels import blockwise as blockwise_mod
from diffzoo.kernels.reference import attention_reference

from conftest import rel_err  # tests/ is on sys.path

CPU_BACKENDS = ["sdpa", "blockwise"]


def make_inputs(B=2, H=4, Hkv=2, Nq=37, Nk=37, d=8, dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    dv = 2 * d if dv is None else dv
    q = torch.randn(B, 2 * H, Nq, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, 2 * Hkv, Nk, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, Nk, dv, generator=g).to(dtype).requires_grad_()
    lam = torch.tensor(0.37, requires_grad=True)
    return q, k, v, lam


def make_masks(kind: str, B: int, H: int, Nq: int, Nk: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    kp = torch.zeros(B, Nk, dtype=torch.bool)
    kp[-1, Nk // 2 :] = True  # the last item is half padding
    if kind == "none":
        return {}
    if kind == "causal":
        return {"causal": True}
    if kind == "padding":
        return {"key_padding_mask": kp}
    if kind == "additive":
        return {"attn_mask": torch.randn(1, H, Nq, Nk, generator=g)}
    if kind == "bool":
        m = torch.rand(B, 1, Nq, Nk, generator=g) > 0.3
        m[..., 0] = True
        return {"attn_mask": m}
    if kind == "causal+padding+additive":
        kp = torch.zeros(B, Nk, dtype=torch.bool)
        kp[0, -3:] = True
        return {"causal": True, "key_padding_mask": kp, "attn_mask": torch.randn(B, 1, 1, Nk, generator=g)}
    raise ValueError(kind)


def run(backend, q, k, v, lam, masks, seed=3):
    out = diff_attention(q, k, v, lam, backend=backend, **masks)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=g).to(out.dtype)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v, lam))
    return out, grads


@pytest.fixture(autouse=True)
def poison_and_small_blocks(monkeypatch):
    # Many small blocks (with a ragged last block) and NaN-filled outputs in the blockwise backend.
    monkeypatch.setattr(blockwise_mod, "_POISON", True)
    monkeypatch.setattr(blockwise_mod, "_BLOCK_ELEMENTS", 2 * 4 * 37 * 16)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mask", ["none", "causal", "padding", "additive", "bool", "causal+padding+additive"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_backend_matches_reference_fp32(backend, mask, heads):
    H, Hkv = heads
    q, k, v, lam = make_inputs(H=H, Hkv=Hkv)
    masks = make_masks(mask, 2, H, 37, 37)
    ref_out, ref_grads = run("reference", q, k, v, lam, masks)
    out, grads = run(backend, q, k, v, lam, masks)
    assert rel_err(out, ref_out) < 1e-5
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert torch.isfinite(g).all(), name
        assert rel_err(g, rg) < 1e-5, name
    assert abs(grads[3].item() - ref_grads[3].item()) <= 1e-5 * max(1.0, abs(ref_grads[3].item()))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_cross_and_cache_shapes(backend, causal):
    """Nq != Nk: cross-attention (no causal) and a query block continuing a kv-cache (causal)."""
    q, k, v, lam = make_inputs(Nq=5, Nk=29)
    masks = {"causal": causal, "key_padding_mask": make_masks("padding", 2, 4, 5, 29)["key_padding_mask"]}
    ref_out, ref_grads = run("reference", q, k, v, lam, masks)
    out, grads = run(backend, q, k, v, lam, masks)
    assert rel_err(out, ref_out) < 1e-5
    for g, rg in zip(grads[:3], ref_grads[:3]):
        assert rel_err(g, rg) < 1e-5


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backend_low_precision(backend, dtype):
    q, k, v, lam = make_inputs(dtype=dtype, Nq=40, Nk=40)
    masks = {"causal": True}
    # Ground truth: the reference on the same (rounded) inputs, computed in fp32.
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref_out, ref_grads = run("reference", qf, kf, vf, lam, masks)
    out, grads = run(backend, q, k, v, lam, masks)
    assert out.dtype == dtype
    assert rel_err(out, ref_out) < 3e-2
    for g, rg in zip(grads[:3], ref_grads[:3]):
        assert g.dtype == dtype
        assert rel_err(g, rg) < 5e-2


@pytest.mark.parametrize("backend", ["reference"] + CPU_BACKENDS)
def test_fully_masked_rows_are_zero_with_finite_grads(backend):
    q, k, v, lam = make_inputs(Nq=6, Nk=6)
    kp = torch.zeros(2, 6, dtype=torch.bool)
    kp[1] = True  # every key of item 1 is padding
    m = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    m[..., 2, :] = False  # query row 2 may see nothing
    out, grads = run(backend, q, k, v, lam, {"key_padding_mask": kp, "attn_mask": m})
    assert torch.isfinite(out).all()
    assert out[1].abs().max() == 0
    assert out[0, :, 2].abs().max() == 0
    assert out[0, :, 3].abs().max() > 0
    for g in grads:
        assert torch.isfinite(g).all()
    assert grads[0][1].abs().max() == 0  # no gradient flows into fully masked queries


def test_padding_equals_removing_keys():
    """Key padding must be exactly the same as attending to the unpadded keys only."""
    q, k, v, lam = make_inputs(B=1, Nq=9, Nk=12)
    kp = torch.zeros(1, 12, dtype=torch.bool)
    kp[0, 8:] = True
    for backend in ["reference"] + CPU_BACKENDS:
        padded = diff_attention(q, k, v, lam, key_padding_mask=kp, backend=backend)
        cut = diff_attention(q, k[:, :, :8], v[:, :, :8], lam, backend=backend)
        assert rel_err(padded, cut) < 1e-5, backend


def test_causal_is_bottom_right_aligned():
    """Query i of a block that continues a cache sees keys 0 .. i + Nk - Nq and nothing later."""
    q, k, v, lam = make_inputs(B=1, Nq=4, Nk=10)
    for backend in ["reference"] + CPU_BACKENDS:
        out = diff_attention(q, k, v, lam, causal=True, backend=backend)
        for i in range(4):
            visible = i + 10 - 4 + 1
            row = diff_attention(q[:, :, i : i + 1], k[:, :, :visible], v[:, :, :visible], lam, backend="reference")
            assert rel_err(out[:, :, i : i + 1], row) < 1e-5, (backend, i)


def test_reference_matches_explicit_formula():
    """An independent loop over heads: (softmax(q1 k1^T s) - lam softmax(q2 k2^T s)) v with GQA pairing."""
    B, H, Hkv, N, d = 1, 4, 2, 7, 4
    q, k, v, lam = make_inputs(B=B, H=H, Hkv=Hkv, Nq=N, Nk=N, d=d)
    out = diff_attention(q, k, v, lam, backend="reference")
    G = H // Hkv
    for i in range(H):
        g = i // G
        a1 = torch.softmax(q[0, 2 * i] @ k[0, 2 * g].T / d**0.5, -1)
        a2 = torch.softmax(q[0, 2 * i + 1] @ k[0, 2 * g + 1].T / d**0.5, -1)
        expected = (a1 - lam * a2) @ v[0, g]
        assert torch.allclose(out[0, i], expected, atol=1e-5)


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "additive"])
def test_softmax_sdpa_matches_reference(mask):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 21, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 21, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 21, 8, generator=g, requires_grad=True)
    masks = make_masks(mask, 2, 4, 21, 21)
    ref = attention_reference(q, k, v, **masks)
    out = attention(q, k, v, backend="sdpa", **masks)
    assert rel_err(out, ref) < 1e-5
    gr = torch.autograd.grad(ref.square().sum(), (q, k, v))
    go = torch.autograd.grad(out.square().sum(), (q, k, v))
    for a, b in zip(go, gr):
        assert rel_err(a, b) < 1e-5


def test_dropout_changes_output_only_in_training_sense():
    q, k, v, lam = make_inputs(Nq=16, Nk=16)
    torch.manual_seed(0)
    for backend in ("reference", "blockwise"):
        a = diff_attention(q, k, v, lam, dropout_p=0.5, backend=backend)
        b = diff_attention(q, k, v, lam, backend=backend)
        assert not torch.allclose(a, b)
    with pytest.raises(RuntimeError, match="dropout"):
        diff_attention(q, k, v, lam, dropout_p=0.5, backend="sdpa")


# -- selection ----------------------------------------------------------------------------------


def test_unknown_backend_raises():
    q, k, v, lam = make_inputs()
    with pytest.raises(ValueError, match="unknown attention backend 'flash9'"):
        diff_attention(q, k, v, lam, backend="flash9")


def test_unavailable_backend_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("triton is available on this machine")
    q, k, v, lam = make_inputs()
    with pytest.raises(RuntimeError, match="triton"):
        diff_attention(q, k, v, lam, backend="triton")


def test_selection_order_argument_context_env(monkeypatch):
    calls = []
    for name in ("reference", "sdpa", "blockwise"):
        b = registry._REGISTRY["diff"][name]
        fn = b.fn()

        def spy(*a, _fn=fn, _name=name, **kw):
            calls.append(_name)
            return _fn(*a, **kw)

        monkeypatch.setattr(b, "_fn", spy)
    q, k, v, lam = make_inputs()
    monkeypatch.setenv(registry.ENV_VAR, "reference")
    diff_attention(q, k, v, lam)
    with kernels.use_backend("sdpa"):
        diff_attention(q, k, v, lam)
        diff_attention(q, k, v, lam, backend="blockwise")
    diff_attention(q, k, v, lam)
    assert calls == ["reference", "sdpa", "blockwise", "reference"]


def test_auto_falls_back_and_logs_once(monkeypatch, caplog):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    monkeypatch.setattr(registry, "_logged", set())
    q, k, v, lam = make_inputs()
    caplog.set_level(logging.WARNING, logger="diffzoo.kernels")
    # auto on CPU prefers blockwise; when it refuses a call, the next in line runs it.
    monkeypatch.setattr(registry._REGISTRY["diff"]["blockwise"], "unsupported", lambda call: "refused in this test")
    for _ in range(3):
        diff_attention(q, k, v, lam)
    records = [r for r in caplog.records if "not used" in r.getMessage()]
    assert len(records) == 1
    assert "'sdpa'" in records[0].getMessage()


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda q, k, v: (q[0], k, v), "rank 4"),
        (lambda q, k, v: (q, k.double(), v), "share a dtype"),
        (lambda q, k, v: (q[:, :7], k, v), "even number"),
        (lambda q, k, v: (q, k[..., :4], v), "widths differ"),
        (lambda q, k, v: (q, k, v[:, :, :5]), "token counts differ"),
        (lambda q, k, v: (q[:, :6], k, v), "not divisible"),
        (lambda q, k, v: (q, k, v[:, :1]), "expected 2"),
    ],
)
def test_bad_shapes_raise_clear_errors(mutate, message):
    q, k, v, lam = make_inputs()
    q, k, v = mutate(q.detach(), k.detach(), v.detach())
    for backend in ["reference"] + CPU_BACKENDS:
        with pytest.raises(ValueError, match=message):
            diff_attention(q, k, v, lam, backend=backend)


def test_bad_masks_raise_clear_errors():
    q, k, v, lam = make_inputs()
    with pytest.raises(ValueError, match="does not broadcast"):
        diff_attention(q, k, v, lam, attn_mask=torch.zeros(3, 1, 37, 37))
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        diff_attention(q, k, v, lam, key_padding_mask=torch.zeros(2, 36, dtype=torch.bool))
    with pytest.raises(ValueError, match="must be bool"):
        diff_attention(q, k, v, lam, key_padding_mask=torch.zeros(2, 37))


def test_device_and_dtype_mismatch_raise():
    q, k, v, lam = make_inputs()
    with pytest.raises(ValueError, match="one device"):
        diff_attention(q.detach().to("meta"), k, v, lam, backend="reference")
    with pytest.raises(ValueError, match="floating-point"):
        diff_attention(q.long(), k.long(), v.long(), lam, backend="reference")
    kp = torch.zeros(2, 37, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="key_padding_mask is on meta"):
        diff_attention(q, k, v, lam, key_padding_mask=kp, backend="reference")


def test_environment_variable_rejects_unknown_names(monkeypatch):
    q, k, v, lam = make_inputs()
    monkeypatch.setenv(registry.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match="unknown attention backend 'fastest'"):
        diff_attention(q, k, v, lam)
