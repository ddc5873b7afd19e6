"""Edge cases of diffzoo.layers and diffzoo.kernels: autocast decoding, the V2 lambda projection,
attention dropout semantics, empty inputs, bad arguments and the shared head-count check."""

from __future__ import annotations

import pytest
import torch

from diffzoo.kernels import attention, diff_attention
from diffzoo.kernels import blockwise as blockwise_mod
from diffzoo.kernels.reference import diff_attention_maps
from diffzoo.layers import (
    Attention,
    Block,
    DiffAttention,
    DiffAttentionV2,
    build_attention,
    count_parameters,
    diff_heads_for_baseline,
)
from diffzoo.models.lm import CausalLM, LMConfig, generate

BACKENDS = ["reference", "sdpa", "blockwise"]
DROPOUT_BACKENDS = ["reference", "blockwise", "auto"]  # the backends that drop the combined map


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def diff_inputs(B=2, H=4, Hkv=2, Nq=11, Nk=11, d=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 2 * H, Nq, d, generator=g)
    k = torch.randn(B, 2 * Hkv, Nk, d, generator=g)
    v = torch.randn(B, Hkv, Nk, 2 * d, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


# -- kv-cache under autocast ---------------------------------------------------------------------
@pytest.mark.parametrize("attn", ["diff", "diff_v2", "softmax"])
def test_generate_under_bf16_autocast_matches_uncached_logits(attn: str) -> None:
    torch.manual_seed(0)
    model = CausalLM.from_preset("lm_tiny", attn=attn, vocab_size=61).eval()
    prompt, T = [3, 14, 15, 9, 26, 5], 5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new, scores = generate(model, [prompt], T, return_logits=True)
        full = torch.tensor([prompt + new[0].tolist()])
        with torch.no_grad():
            uncached = model(full)[:, len(prompt) - 1 : len(prompt) - 1 + T]
        caches = model.make_kv_caches(1, 8)
        with torch.no_grad():
            model(full[:, :4], kv_caches=caches)
    assert new.shape == (1, T)
    assert {c.dtype for c in caches} == {torch.bfloat16}  # the cache follows the activations
    # both runs round to bf16 in different places; the logits agree to bf16 precision
    assert rel_err(scores, uncached) < 0.05
    assert torch.equal(scores.argmax(-1), uncached.argmax(-1))


def test_kv_cache_with_a_fixed_dtype_returns_the_activations_dtype() -> None:
    torch.manual_seed(0)
    attn = DiffAttention(32, 2, causal=True, rope=True)
    x = torch.randn(1, 6, 32)
    full = attn(x)
    cache = attn.make_kv_cache(1, 6, dtype=torch.bfloat16)  # half the memory of the fp32 model's cache
    steps = [attn(x[:, :3], kv_cache=cache)] + [attn(x[:, t : t + 1], kv_cache=cache) for t in range(3, 6)]
    assert cache.k.dtype == torch.bfloat16
    out = torch.cat(steps, 1)
    assert out.dtype == torch.float32
    assert rel_err(out, full) < 0.05


# -- DiffAttentionV2's lambda projection -----------------------------------------------------------
def test_v2_lambda_projection_has_no_bias_by_default() -> None:
    D, H, Hkv = 48, 4, 2
    attn = DiffAttentionV2(D, H, Hkv)
    d = D // H
    projections = D * 2 * H * d + 2 * D * Hkv * d + H * d * D + D  # q, k, v, out (with its bias)
    assert "lambda_proj.bias" not in attn.state_dict()
    assert count_parameters(attn) == projections + D * H  # lambda_proj: a (D -> H) matrix only
    with_bias = DiffAttentionV2(D, H, Hkv, lambda_bias=True)
    assert count_parameters(with_bias) == count_parameters(attn) + H
    # a state dict without the bias (the reference V2 layout) loads strictly
    sd = {k: v for k, v in with_bias.state_dict().items() if k != "lambda_proj.bias"}
    attn.load_state_dict(sd, strict=True)
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        with_bias.lambda_proj.bias.zero_()
    assert torch.allclose(attn(x), with_bias(x), atol=1e-6)


def test_v2_blocks_and_lm_have_no_lambda_bias() -> None:
    model = CausalLM.from_preset("lm_tiny", attn="diff_v2")
    assert not [k for k in model.state_dict() if k.endswith("lambda_proj.bias")]
    assert Block(32, 2, attn="diff_v2").attn.lambda_proj.bias is None


# -- attention dropout ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", DROPOUT_BACKENDS)
def test_dropout_drops_the_combined_map_once(backend: str) -> None:
    # identical branches and lam = 1: A1 - lam A2 = 0, so dropping that map leaves exactly zero;
    # independent masks on the two branches would not cancel.
    q, k, v = diff_inputs()
    q[:, 1::2] = q[:, 0::2]
    k[:, 1::2] = k[:, 0::2]
    torch.manual_seed(0)
    out = diff_attention(q, k, v, torch.tensor(1.0), dropout_p=0.5, backend=backend)
    assert out.abs().max() < 1e-5
    # lam = 0: the output is dropout(A1) v, which does differ from A1 v
    no_drop = diff_attention(q, k, v, torch.tensor(0.0), backend="reference")
    dropped = diff_attention(q, k, v, torch.tensor(0.0), dropout_p=0.5, backend=backend)
    assert not torch.allclose(dropped, no_drop, atol=1e-3)


@pytest.mark.parametrize("backend", DROPOUT_BACKENDS)
def test_both_value_halves_see_the_same_dropout_mask(backend: str) -> None:
    q, k, v = diff_inputs()
    d = q.shape[-1]
    v[..., d:] = v[..., :d]  # a value whose two halves are equal
    torch.manual_seed(0)
    out = diff_attention(q, k, v, torch.tensor(0.3), dropout_p=0.4, backend=backend)
    assert torch.equal(out[..., :d], out[..., d:])


@pytest.mark.parametrize("backend", ["reference", "blockwise"])
def test_dropout_is_unbiased_and_follows_the_seed(backend: str) -> None:
    q, k, v = diff_inputs(B=1, H=2, Hkv=1, Nq=6, Nk=6)
    lam = torch.tensor(0.3)
    torch.manual_seed(5)
    a = diff_attention(q, k, v, lam, dropout_p=0.3, backend=backend)
    torch.manual_seed(5)
    b = diff_attention(q, k, v, lam, dropout_p=0.3, backend=backend)
    assert torch.equal(a, b)
    mean = torch.stack([diff_attention(q, k, v, lam, dropout_p=0.3, backend=backend) for _ in range(400)]).mean(0)
    assert rel_err(mean, diff_attention(q, k, v, lam, backend="reference")) < 0.15


@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_dropout_gradients_match_the_explicit_masked_map(causal: bool) -> None:
    q, k, v = diff_inputs(requires_grad=True)
    lam = torch.tensor(0.4, requires_grad=True)
    B, H, Hkv, N, d = q.shape[0], q.shape[1] // 2, v.shape[1], q.shape[2], q.shape[-1]
    p, seed = 0.3, 1234
    out = blockwise_mod.blockwise_forward(q, k, v, lam, None, causal, d**-0.5, p, torch.tensor(seed))
    a1, a2 = diff_attention_maps(q, k, lam, causal=causal)
    G = H // Hkv
    drop = blockwise_mod._dropout_scale((B, Hkv, G * N, N), p, seed, 0, q.device).view(B, H, N, N)
    expected = (drop * (a1 - lam * a2)) @ v.repeat_interleave(G, 1)
    assert rel_err(out, expected) < 1e-5
    w = torch.randn(out.shape)
    got = torch.autograd.grad((out * w).sum(), (q, k, v, lam))
    want = torch.autograd.grad((expected * w).sum(), (q, k, v, lam))
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-5


def test_sdpa_refuses_differential_dropout_and_auto_uses_a_backend_that_can() -> None:
    q, k, v = diff_inputs()
    with pytest.raises(RuntimeError, match="'sdpa' cannot run this call: attention dropout"):
        diff_attention(q, k, v, torch.tensor(0.3), dropout_p=0.1, backend="sdpa")
    layer = DiffAttention(32, 2, attn_drop=0.5, backend="auto").train()
    x = torch.randn(2, 5, 32)
    layer(x).sum().backward()
    assert layer.q_proj.weight.grad is not None and layer.q_proj.weight.grad.abs().sum() > 0


# -- empty inputs ---------------------------------------------------------------------------------
def _layer(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "block":
        return Block(32, 4, attn="diff", causal=True, rope=True)
    return build_attention(kind, 32, 4, 2, rope=True, causal=True, qkv_bias=True)


@pytest.mark.parametrize("kind", ["softmax", "diff", "diff_v2", "block"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("B,N", [(0, 5), (2, 0), (0, 0)])
def test_empty_batch_or_sequence_gives_an_empty_output_and_backward(kind: str, backend: str, B: int, N: int) -> None:
    layer = _layer(kind)
    x = torch.randn(B, N, 32, requires_grad=True)
    out = layer(x, backend=backend)
    assert out.shape == (B, N, 32)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name, param in layer.named_parameters():
        assert param.grad is None or not param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_query_block_in_the_kernel(backend: str) -> None:
    q, k, v = diff_inputs(Nq=0, requires_grad=True)
    lam = torch.tensor(0.5, requires_grad=True)
    out = diff_attention(q, k, v, lam, backend=backend, causal=True)
    assert out.shape == (2, 4, 0, 16)
    grads = torch.autograd.grad(out.sum(), (q, k, v, lam), allow_unused=True)
    for g in grads:
        assert g is None or not g.abs().sum() > 0


def test_empty_kv_cache_step() -> None:
    attn = DiffAttention(32, 2, causal=True, rope=True)
    cache = attn.make_kv_cache(2, 4)
    assert attn(torch.randn(2, 0, 32), kv_cache=cache).shape == (2, 0, 32)
    assert cache.seq_len == 0
    assert attn(torch.randn(2, 2, 32), kv_cache=cache).shape == (2, 2, 32)


# -- bad arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build",
    [
        lambda: Attention(32, 2, head_dim=0),
        lambda: DiffAttention(32, 2, head_dim=0),
        lambda: DiffAttentionV2(32, 2, head_dim=0),
        lambda: Block(32, 2, head_dim=0),
        lambda: diff_heads_for_baseline(48, 3, head_dim=0),
    ],
)
def test_zero_head_dim_is_a_value_error(build) -> None:
    with pytest.raises(ValueError, match="head_dim=0 must be a positive integer"):
        build()


def test_zero_width_heads_in_the_kernel_are_a_value_error() -> None:
    q, k, v = diff_inputs(d=0)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="width 0"):
            diff_attention(q, k, v, torch.tensor(0.5), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_number_lambda_equals_a_tensor_lambda(backend: str) -> None:
    q, k, v = diff_inputs()
    expected = diff_attention(q, k, v, torch.tensor(0.25), backend=backend)
    assert torch.equal(diff_attention(q, k, v, 0.25, backend=backend), expected)
    with pytest.raises(TypeError, match="lam must be a tensor or a real number, got str"):
        diff_attention(q, k, v, "0.25", backend=backend)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_dropout_outside_zero_one_is_a_value_error(p: float) -> None:
    q, k, v = diff_inputs()
    with pytest.raises(ValueError, match=r"dropout_p=.* must be a dropout probability in \[0, 1\)"):
        diff_attention(q, k, v, torch.tensor(0.5), dropout_p=p, backend="reference")
    with pytest.raises(ValueError, match=r"dropout_p=.* must be a dropout probability"):
        attention(q, k[:, :4], v[..., :8], dropout_p=p)
    for name in ("attn_drop", "proj_drop"):
        for cls in (Attention, DiffAttention, DiffAttentionV2):
            with pytest.raises(ValueError, match=f"{name}=.* must be a dropout probability"):
                cls(32, 2, **{name: p})
    with pytest.raises(ValueError, match="drop_path=.* must be a dropout probability"):
        Block(32, 2, drop_path=p)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_lambda_init_is_a_value_error(value: float) -> None:
    with pytest.raises(ValueError, match="lambda_init=.* must be a finite number"):
        DiffAttention(32, 2, lambda_init=value)
    with pytest.raises(ValueError, match="lambda_init=.* must be a finite number"):
        Block(32, 2, attn="diff", lambda_init=value)


# -- one head-count check everywhere ----------------------------------------------------------------
@pytest.mark.parametrize(
    "build",
    [
        lambda: Attention(48, 4, 3),
        lambda: DiffAttention(48, 4, 3),
        lambda: DiffAttentionV2(48, 4, 3),
        lambda: Block(48, 4, num_kv_heads=3, attn="softmax"),
        lambda: Block(48, 4, num_kv_heads=3, attn="diff"),
        lambda: diff_heads_for_baseline(48, 4, 3),
        lambda: LMConfig(dim=48, num_heads=4, num_kv_heads=3, attn="softmax"),
    ],
)
def test_every_entry_point_reports_bad_head_counts_the_same_way(build) -> None:
    with pytest.raises(ValueError, match=r"num_heads=4 is not a multiple of num_kv_heads=3; choose num_kv_heads from"):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda: Attention(48, 0),
        lambda: DiffAttention(48, 0),
        lambda: Block(48, 0, attn="diff_v2"),
        lambda: DiffAttentionV2(48, 2.0),
    ],
)
def test_non_positive_or_fractional_head_counts_are_named(build) -> None:
    with pytest.raises(ValueError, match=r"num_heads=(0|2\.0) must be a positive integer"):
        build()


# -- Block arguments the LM needs -------------------------------------------------------------------
def test_block_takes_the_mlp_width_and_the_sub_norm_epsilon() -> None:
    block = Block(48, 4, attn="diff", mlp="swiglu", mlp_hidden_dim=131, sub_norm_eps=3e-4, norm_eps=2e-5)
    assert block.mlp.w1.out_features == 131 and block.mlp.w2.in_features == 131
    assert block.attn.sub_norm.eps == 3e-4
    assert block.norm1.eps == 2e-5
    assert Block(48, 4, mlp_hidden_dim=7).mlp.fc1.out_features == 7
    with pytest.raises(ValueError, match="mlp_hidden_dim=0 must be a positive integer"):
        Block(48, 4, mlp_hidden_dim=0)
    model = CausalLM(LMConfig(dim=64, depth=2, num_heads=4, intermediate_size=171, norm_eps=3e-6))
    for blk in model.blocks:
        assert blk.mlp.w1.out_features == 171
        assert blk.attn.sub_norm.eps == 3e-6
