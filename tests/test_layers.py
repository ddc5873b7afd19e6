"""diffzoo.layers: the differential attention modules, their baseline, blocks, RoPE and kv-cache."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffzoo.kernels import registry
from diffzoo.layers import (
    Attention,
    Block,
    DiffAttention,
    DiffAttentionV2,
    RotaryEmbedding,
    build_attention,
    count_parameters,
    diff_heads_for_baseline,
    lambda_init_schedule,
    matched_attention_pair,
)

from conftest import rel_err  # tests/ is on sys.path

BACKENDS = ["reference", "sdpa", "blockwise"]


# -- lambda -------------------------------------------------------------------------------------


def test_lambda_init_schedule_values():
    assert lambda_init_schedule(0) == pytest.approx(0.2)
    assert lambda_init_schedule(1) == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    assert lambda_init_schedule(11) == pytest.approx(0.8 - 0.6 * math.exp(-3.3))
    assert lambda_init_schedule(200) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        lambda_init_schedule(-1)


def test_lambda_full_formula_and_constant_init():
    attn = DiffAttention(32, 2, depth=3)
    assert attn.lambda_init == pytest.approx(lambda_init_schedule(3))
    expected = (
        torch.exp((attn.lambda_q1 * attn.lambda_k1).sum())
        - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum())
        + lambda_init_schedule(3)
    )
    assert attn.lambda_full().dtype == torch.float32
    assert torch.allclose(attn.lambda_full(), expected)
    assert DiffAttention(32, 2, depth=3, lambda_init=0.8).lambda_init == 0.8
    # N(0, 0.1) initialisation of the four lambda vectors
    big = DiffAttention(4096, 1)
    assert big.lambda_q1.std().item() == pytest.approx(0.1, rel=0.1)


def test_block_passes_depth_to_attention():
    blocks = [Block(64, 4, attn="diff", depth=i) for i in range(3)]
    assert [b.attn.lambda_init for b in blocks] == pytest.approx([lambda_init_schedule(i) for i in range(3)])
    assert Block(64, 4, attn="diff", depth=5, lambda_init=0.8).attn.lambda_init == 0.8


# -- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dim, heads, kv", [(192, 4, None), (384, 6, None), (768, 12, None), (512, 8, 2)])
def test_matched_pair_parameter_counts(dim, heads, kv):
    pair = matched_attention_pair(dim, heads, kv, qkv_bias=True)
    d = dim // heads
    # identical projections; the differential layer adds 4d (lambda) + 2d (norm weight)
    assert pair.differential_params - pair.baseline_params == 6 * d
    assert pair.relative_difference < 0.005
    assert "differential" in pair.report()


def test_odd_baseline_heads_need_head_dim():
    with pytest.raises(ValueError, match=r"num_heads=3 is odd; pass head_dim=32"):
        diff_heads_for_baseline(192, 3)
    assert diff_heads_for_baseline(192, 3, head_dim=32) == (3, 3, 32)
    assert diff_heads_for_baseline(384, 6) == (3, 3, 64)
    assert diff_heads_for_baseline(512, 8, 4) == (4, 2, 64)
    pair = matched_attention_pair(192, 3, head_dim=32, qkv_bias=True)
    assert pair.relative_difference < 0.005


def test_bad_head_counts():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        DiffAttention(64, 4, 3)
    with pytest.raises(ValueError, match="not divisible by 2 \\* num_heads"):
        DiffAttention(60, 4)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        Attention(64, 4, 3)
    with pytest.raises(ValueError, match="unknown attention variant .linear.; choose one of softmax"):
        build_attention("linear", 64, 4)


# -- the module against an independent computation ----------------------------------------------


def manual_diff_attention(attn: DiffAttention, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Per-head loops straight from the paper's equations, using the module's weights."""
    B, N, D = x.shape
    H, Hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(B, N, 2 * H, d)
    k = attn.k_proj(x).view(B, N, 2 * Hkv, d)
    v = attn.v_proj(x).view(B, N, Hkv, 2 * d)
    lam = attn.lambda_full()
    mask = torch.ones(N, N, dtype=torch.bool).tril() if causal else torch.ones(N, N, dtype=torch.bool)
    heads = []
    for i in range(H):
        g = i // (H // Hkv)
        s1 = (q[:, :, 2 * i] @ k[:, :, 2 * g].transpose(1, 2)) / math.sqrt(d)
        s2 = (q[:, :, 2 * i + 1] @ k[:, :, 2 * g + 1].transpose(1, 2)) / math.sqrt(d)
        a1 = s1.masked_fill(~mask, float("-inf")).softmax(-1)
        a2 = s2.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (a1 - lam * a2) @ v[:, :, g]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.sub_norm.weight
        heads.append(o * (1 - attn.lambda_init))
    return attn.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_diff_attention_matches_paper_equations(backend, kv_heads, causal):
    torch.manual_seed(0)
    attn = DiffAttention(64, 4, kv_heads, qkv_bias=True, depth=2)
    nn.init.normal_(attn.sub_norm.weight, 1.0, 0.2)
    x = torch.randn(2, 11, 64)
    out = attn(x, causal=causal, backend=backend)
    assert rel_err(out, manual_diff_attention(attn, x, causal)) < 1e-5


def test_v2_matches_its_definition():
    torch.manual_seed(0)
    attn = DiffAttentionV2(48, 4, 2)
    x = torch.randn(2, 9, 48)
    out = attn(x)
    B, N, H, Hkv, d = 2, 9, 4, 2, 12
    q = attn.q_proj(x).view(B, N, 2 * H, d).transpose(1, 2)
    k = attn.k_proj(x).view(B, N, Hkv, d).transpose(1, 2)
    v = attn.v_proj(x).view(B, N, Hkv, d).transpose(1, 2)
    lam = torch.sigmoid(attn.lambda_proj(x))  # (B, N, H)
    heads = []
    for i in range(H):
        g = (2 * i) // (2 * H // Hkv)
        assert g == (2 * i + 1) // (2 * H // Hkv)  # both halves of a pair fall in one group
        a = torch.softmax(q[:, 2 * i] @ k[:, g].transpose(1, 2) / math.sqrt(d), -1) @ v[:, g]
        b = torch.softmax(q[:, 2 * i + 1] @ k[:, g].transpose(1, 2) / math.sqrt(d), -1) @ v[:, g]
        heads.append(a - lam[..., i : i + 1] * b)
    expected = attn.out_proj(torch.cat(heads, -1))
    assert rel_err(out, expected) < 1e-5
    # fewer attention parameters than V1 at the same H, d, H_kv
    v1 = DiffAttention(48, 4, 2, head_dim=12)
    assert count_parameters(attn) < count_parameters(v1)


@pytest.mark.parametrize("cls", ["diff", "diff_v2", "softmax"])
def test_backends_agree_at_layer_level_with_gradients(cls):
    torch.manual_seed(0)
    attn = build_attention(cls, 64, 8, 4, rope=True, causal=True, qkv_bias=True)
    x = torch.randn(2, 13, 64, requires_grad=True)
    kp = torch.zeros(2, 13, dtype=torch.bool)
    kp[1, 10:] = True
    results = {}
    for backend in BACKENDS:
        attn.zero_grad()
        out = attn(x, key_padding_mask=kp, backend=backend)
        (gx,) = torch.autograd.grad(out.square().sum(), x, retain_graph=True)
        out.square().sum().backward()
        results[backend] = (out, gx, {n: p.grad.clone() for n, p in attn.named_parameters()})
    ref_out, ref_gx, ref_gp = results["reference"]
    for backend in BACKENDS[1:]:
        out, gx, gp = results[backend]
        assert rel_err(out, ref_out) < 1e-5
        assert rel_err(gx, ref_gx) < 1e-5
        for n in ref_gp:
            assert rel_err(gp[n], ref_gp[n]) < 1e-4, n


def test_backend_is_not_in_state_dict():
    a = DiffAttention(32, 2, backend="sdpa")
    b = DiffAttention(32, 2)
    assert set(a.state_dict()) == set(b.state_dict())
    assert not any("backend" in key for key in a.state_dict())


# -- masks, cross-attention, maps ---------------------------------------------------------------


def test_key_padding_equals_shorter_sequence():
    torch.manual_seed(0)
    attn = DiffAttention(32, 2)
    x = torch.randn(1, 10, 32)
    kp = torch.zeros(1, 10, dtype=torch.bool)
    kp[0, 7:] = True
    full = attn(x, key_padding_mask=kp)
    short = attn(x[:, :7])
    assert rel_err(full[:, :7], short) < 1e-5


def test_fully_padded_item_gives_finite_outputs_and_grads():
    torch.manual_seed(0)
    attn = DiffAttention(32, 2, qkv_bias=True)
    x = torch.randn(2, 5, 32, requires_grad=True)
    kp = torch.zeros(2, 5, dtype=torch.bool)
    kp[1] = True
    for backend in BACKENDS:
        out = attn(x, key_padding_mask=kp, backend=backend)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
        x.grad = None
        attn.zero_grad()


def test_cross_attention():
    torch.manual_seed(0)
    attn = DiffAttention(32, 2, kv_dim=48)
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 9, 48)
    kp = torch.zeros(2, 9, dtype=torch.bool)
    kp[0, 6:] = True
    out = attn(x, ctx, key_padding_mask=kp)
    assert out.shape == (2, 5, 32)
    assert rel_err(out[:1], attn(x[:1], ctx[:1, :6])) < 1e-5
    with pytest.raises(ValueError, match="context has width 32"):
        attn(x, x)
    with pytest.raises(ValueError, match="pass context="):
        attn(x)


def test_return_attn_maps():
    torch.manual_seed(0)
    attn = DiffAttention(32, 2, causal=True)
    x = torch.randn(2, 6, 32)
    out, maps = attn(x, return_attn=True)
    assert torch.allclose(out, attn(x), atol=1e-6)
    a1, a2, lam = maps["attn1"], maps["attn2"], maps["lambda"]
    assert a1.shape == a2.shape == (2, 2, 6, 6)
    assert torch.allclose(a1.sum(-1), torch.ones(2, 2, 6), atol=1e-6)
    assert torch.allclose((a1 - lam * a2).sum(-1), (1 - lam).expand(2, 2, 6), atol=1e-6)
    assert a1.triu(1).abs().max() == 0  # causal
    _, base_maps = Attention(32, 4)(x, return_attn=True)
    assert base_maps["attn"].shape == (2, 4, 6, 6)
    _, v2_maps = DiffAttentionV2(32, 2)(x, return_attn=True)
    assert v2_maps["lambda"].shape == (2, 2, 6)


# -- bad input ----------------------------------------------------------------------------------


def test_layer_input_errors():
    attn = DiffAttention(32, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, tokens, 32\)"):
        attn(torch.randn(4, 32))
    with pytest.raises(ValueError, match="x has width 16"):
        attn(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="float64 but the DiffAttention parameters are torch.float32|torch.float64"):
        attn(torch.randn(2, 3, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not broadcast"):
        attn(torch.randn(2, 3, 32), attn_mask=torch.ones(2, 3, 3, 3, dtype=torch.bool))


def test_autocast_bf16_runs():
    attn = DiffAttention(32, 2)
    x = torch.randn(2, 7, 32)
    ref = attn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 5e-2


# -- RoPE and kv-cache --------------------------------------------------------------------------


def test_rope_scores_depend_on_relative_position_only():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return (rope(q, torch.tensor([i])) * rope(k, torch.tensor([j]))).sum()

    assert torch.allclose(score(3, 1), score(10, 8), atol=1e-5)
    assert not torch.allclose(score(3, 1), score(3, 2), atol=1e-3)
    assert torch.allclose(rope(q, torch.tensor([0])), q)  # position 0 is the identity
    assert torch.allclose(rope(q, torch.tensor([5000])).norm(), q.norm(), atol=1e-4)  # far positions need no table


@pytest.mark.parametrize("kind", ["diff", "diff_v2", "softmax"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_decoding_equals_full_causal_forward(kind, backend):
    torch.manual_seed(0)
    attn = build_attention(kind, 64, 8, 2, rope=True, causal=True)
    x = torch.randn(2, 12, 64)
    full = attn(x, backend=backend)
    cache = attn.make_kv_cache(2, 16)
    steps = [attn(x[:, :5], kv_cache=cache, backend=backend)]  # prefill a prompt of 5
    for t in range(5, 12):  # then token by token
        steps.append(attn(x[:, t : t + 1], kv_cache=cache, backend=backend))
    assert cache.seq_len == 12
    assert rel_err(torch.cat(steps, dim=1), full) < 1e-5
    with pytest.raises(ValueError, match="overflow"):
        attn(torch.randn(2, 5, 64), kv_cache=cache)


def test_kv_cache_rejects_context():
    attn = DiffAttention(32, 2, causal=True)
    cache = attn.make_kv_cache(1, 4)
    with pytest.raises(ValueError, match="kv_cache"):
        attn(torch.randn(1, 1, 32), torch.randn(1, 3, 32), kv_cache=cache)


# -- blocks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn", ["diff", "diff_v2", "softmax"])
@pytest.mark.parametrize("variant", ["vit", "llama"])
def test_block_variants_train(attn, variant):
    torch.manual_seed(0)
    if variant == "vit":
        block = Block(48, 4, attn=attn, qkv_bias=True, drop_path=0.1, layer_scale_init=1e-5, depth=1)
    else:
        block = Block(
            48, 4, attn=attn, num_kv_heads=2, mlp="swiglu", norm="rmsnorm", qkv_bias=False, proj_bias=False,
            mlp_bias=False, causal=True, rope=True, depth=1,
        )
    x = torch.randn(3, 10, 48)
    out = block(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_block_matched_parameters_and_unknown_fields():
    a = Block(384, 6, attn="softmax", qkv_bias=True)
    b = Block(384, 6, attn="diff", qkv_bias=True)
    assert abs(count_parameters(a) - count_parameters(b)) / count_parameters(a) < 0.005
    with pytest.raises(ValueError, match="unknown mlp"):
        Block(48, 4, mlp="moe")
    with pytest.raises(ValueError, match="unknown norm"):
        Block(48, 4, norm="batchnorm")


def test_drop_path_and_eval_determinism():
    torch.manual_seed(0)
    block = Block(32, 2, drop_path=0.5)
    x = torch.randn(8, 4, 32)
    block.eval()
    assert torch.equal(block(x), block(x))
    block.train()
    assert not torch.allclose(block(x), block(x))


# -- torch.compile -----------------------------------------------------------------------------


def test_torch_compile_runs_sdpa_path(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    torch.manual_seed(0)
    block = Block(32, 4, attn="diff", backend="sdpa")
    x = torch.randn(2, 8, 32)
    compiled = torch.compile(block, backend="aot_eager")
    out = compiled(x)
    assert rel_err(out, block(x)) < 1e-5
    out.sum().backward()
    assert block.attn.lambda_q1.grad is not None


@pytest.mark.slow
def test_torch_compile_inductor_sdpa_path(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    torch.manual_seed(0)
    block = Block(32, 4, attn="diff", backend="sdpa")
    x = torch.randn(2, 8, 32)
    out = torch.compile(block)(x)
    assert rel_err(out, block(x)) < 1e-5
