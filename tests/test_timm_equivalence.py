"""Weight-copy equivalence with timm's own DiffAttention (an implementation diffzoo does not share code with)."""

from __future__ import annotations

import pytest
import torch

from diffzoo.layers import DiffAttention

timm_layers = pytest.importorskip("timm.layers")


def copy_from_timm(theirs, dim: int, num_heads: int, depth: int) -> DiffAttention:
    ours = DiffAttention(dim, num_heads, qkv_bias=theirs.qkv.bias is not None, depth=depth)
    assert ours.head_dim == theirs.head_dim
    q_w, k_w, v_w = theirs.qkv.weight.chunk(3, dim=0)
    sd = {
        "q_proj.weight": q_w, "k_proj.weight": k_w, "v_proj.weight": v_w,
        "out_proj.weight": theirs.proj.weight, "out_proj.bias": theirs.proj.bias,
        "lambda_q1": theirs.lambda_q1, "lambda_k1": theirs.lambda_k1,
        "lambda_q2": theirs.lambda_q2, "lambda_k2": theirs.lambda_k2,
        "sub_norm.weight": theirs.sub_norm.weight,
    }
    if theirs.qkv.bias is not None:
        sd.update(zip(("q_proj.bias", "k_proj.bias", "v_proj.bias"), theirs.qkv.bias.chunk(3)))
    ours.load_state_dict(sd, strict=True)
    return ours


@pytest.mark.parametrize("fused", [True, False], ids=["timm-sdpa", "timm-manual"])
@pytest.mark.parametrize("backend", ["reference", "sdpa", "blockwise"])
@pytest.mark.parametrize("depth", [0, 5])
def test_matches_timm_diff_attention(fused, backend, depth):
    torch.manual_seed(depth)
    dim, heads = 96, 3
    theirs = timm_layers.DiffAttention(dim, num_heads=heads, qkv_bias=True, depth=depth).eval()
    theirs.fused_attn = fused
    torch.nn.init.normal_(theirs.sub_norm.weight, 1.0, 0.3)
    ours = copy_from_timm(theirs, dim, heads, depth).eval()
    assert ours.lambda_init == pytest.approx(theirs.lambda_init)
    x = torch.randn(2, 17, dim, requires_grad=True)
    expected = theirs(x)
    got = ours(x, backend=backend)
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-5
    (g_theirs,) = torch.autograd.grad(expected.square().sum(), x)
    (g_ours,) = torch.autograd.grad(got.square().sum(), x)
    assert ((g_ours - g_theirs).abs().max() / g_theirs.abs().max()).item() < 1e-5
