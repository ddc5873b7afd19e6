"""diffzoo.analysis: recorded maps, noise scores, outliers, low-bit attention and plots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
from timm.layers import Attention as TimmAttention
from torch import nn

from diffzoo.analysis import (  # importing diffzoo registers its models with timm
    absmax_quantize,
    answer_share,
    attention_entropy,
    attention_noise,
    image_relevant_tokens,
    low_bit_attention,
    metric_vs_bits,
    negative_share,
    outlier_stats,
    record_attention,
    record_outliers,
    speech_relevance,
    speech_relevant_tokens,
    token_attention,
    vit_relevance,
)
from diffzoo.kernels import attention, diff_attention
from diffzoo.kernels.reference import attention_reference, diff_attention_reference
from diffzoo.layers import Attention, Block, DiffAttention, DiffAttentionV2
from diffzoo.models.lm import CausalLM

from conftest import rel_err  # tests/ is on sys.path

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def vit(kind: str = "diff", **kw) -> nn.Module:
    return timm.create_model(f"{kind}vit_nano_patch7_28", **kw).eval()


def speech(kind: str = "diff") -> nn.Module:
    return timm.create_model(f"{kind}kwt_nano", depth=2, num_classes=5).eval()


def lm(attn: str = "diff") -> CausalLM:
    return CausalLM.from_preset("lm_tiny", attn=attn).eval()


def assert_unpatched(model: nn.Module) -> None:
    for m in model.modules():
        assert "_attend" not in m.__dict__ and "forward" not in m.__dict__
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert not getattr(m, "_attend_hooks", None) and not any(k.startswith("_diffzoo") for k in m.__dict__)
        if type(m) is TimmAttention:
            assert m.fused_attn == timm.layers.use_fused_attn()


def test_attend_hook_is_public_and_removable():
    """A hook sees q, k, v and may call the step again; timm's own Attention takes the same hook."""
    from diffzoo.hosts.timm import register_attend_hook

    for model in (vit("diff"), vit("soft")):
        x = torch.randn(2, 1, 28, 28)
        expected = model(x)
        seen = []

        def hook(module, inner, x, q, k, v, masks, return_attn, backend, seen=seen):
            out, maps = inner(x, q, k, v, masks, True, backend)
            seen.append((tuple(q.shape), sorted(maps)))
            return out, (maps if return_attn else None)

        attn = model.blocks[1].attn
        handle = register_attend_hook(attn, hook)
        assert torch.allclose(model(x), expected, atol=1e-5)
        assert seen == [((2, 4, 17, 24), ["attn1", "attn2", "lambda"] if isinstance(attn, DiffAttention) else ["attn"])]
        handle.remove()
        model(x)
        assert len(seen) == 1
        assert_unpatched(model)


def test_timm_attention_without_an_sdpa_call_is_refused():
    """A timm forward that no longer makes the call the hook replaces raises instead of going unobserved."""
    model = vit("soft")
    attn = model.blocks[0].attn
    attn.forward = lambda x, attn_mask=None, is_causal=False: x
    with pytest.raises(RuntimeError, match="made no F.scaled_dot_product_attention call"):
        with record_attention(model):
            model(torch.randn(1, 1, 28, 28))
    del attn.forward
    assert_unpatched(model)


# -- scores on hand-built maps --------------------------------------------------------------------
def test_scores_on_hand_built_softmax_maps():
    a = torch.zeros(1, 1, 3, 4)
    a[0, 0, 0] = 0.25  # uniform
    a[0, 0, 1, 0] = 1.0  # one-hot on key 0
    # row 2 stays empty (a fully masked query): left out of every mean
    assert torch.allclose(attention_entropy(a), torch.tensor([[math.log(4) / 2]]))
    assert torch.allclose(attention_entropy(a, query=[0]), torch.tensor([[math.log(4)]]))
    assert torch.allclose(answer_share(a, [0, 1, 2], [0]), torch.tensor([[(0.25 + 1.0) / 2]]))
    assert torch.allclose(answer_share(a, [0], [1, 2]), torch.tensor([[0.5]]))
    assert negative_share(a).item() == 0.0


def test_scores_on_hand_built_differential_maps():
    a1 = torch.tensor([1.0, 0, 0, 0]).expand(1, 1, 1, 4)
    a2 = torch.full((1, 1, 1, 4), 0.25)
    maps = {"attn1": a1, "attn2": a2, "lambda": torch.tensor(0.5)}  # a = [.875, -.125, -.125, -.125], row sum .5
    noise = attention_noise([maps], query=[0], relevant=[0])
    assert noise.answer.item() == pytest.approx(0.875 / 0.5)
    assert noise.negative.item() == pytest.approx(0.375 / 1.25)
    p = torch.tensor([0.7, 0.1, 0.1, 0.1])
    assert noise.entropy.item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-6)
    assert noise.lambdas == [0.5]
    rest = attention_noise([maps], query=[0], relevant=[1, 2, 3]).answer.item()
    assert rest + noise.answer.item() == pytest.approx(1.0)  # shares over a partition of the keys sum to 1
    # V2: lambda per query token and head
    a1 = torch.tensor([1.0, 0]).expand(1, 1, 2, 2)
    a2 = torch.tensor([0.0, 1]).expand(1, 1, 2, 2)
    v2 = {"attn1": a1, "attn2": a2, "lambda": torch.tensor([[[0.5, 0.25]]])}
    shares = [attention_noise([v2], [i], [0]).answer.item() for i in (0, 1)]
    assert shares == pytest.approx([1 / 0.5, 1 / 0.75])


def test_noise_scores_reproduce_retrieval_attention_scores():
    from diffzoo.evaluation.retrieval import attention_scores

    B, H, N = 3, 2, 10

    def soft():
        return torch.randn(B, H, N, N).softmax(-1)

    maps = [{"attn": soft()}, {"attn1": soft(), "attn2": soft(), "lambda": torch.tensor(0.3)},
            {"attn1": soft(), "attn2": soft(), "lambda": torch.rand(B, H, N)}]
    query = torch.zeros(B, N, dtype=torch.bool)
    query[:, 6:9] = True
    answer, noise = torch.rand(B, N) > 0.6, torch.rand(B, N) > 0.5
    s_ans, s_noise = attention_scores(maps, query, answer, noise)
    assert torch.allclose(attention_noise(maps, query, answer).per_sample(), s_ans, atol=1e-6)
    assert torch.allclose(attention_noise(maps, query, noise).per_sample(), s_noise, atol=1e-6)


# -- record_attention -----------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["diff", "diff_gqa", "diff_v2", "softmax"])
def test_recorded_maps_reproduce_the_layer_output(layer):
    B, N, D = 2, 6, 32
    if layer.startswith("diff") and layer != "diff_v2":
        attn = DiffAttention(D, 2, num_kv_heads=1 if layer == "diff_gqa" else 2, causal=True)
    elif layer == "diff_v2":
        attn = DiffAttentionV2(D, 2, num_kv_heads=1, causal=True)
    else:
        attn = Attention(D, 4, num_kv_heads=2, causal=True)
    x = torch.randn(B, N, D)
    expected = attn(x)
    with record_attention(attn) as rec:
        out = attn(x)
    assert torch.equal(out, expected)
    (rec_layer,) = rec
    v = attn.v_proj(x).view(B, N, attn.v_heads, attn.v_dim).transpose(1, 2)
    a = rec_layer.diff if rec_layer.differential else rec_layer.attn  # (B, H, N, N)
    o = a @ v.repeat_interleave(a.shape[1] // attn.v_heads, dim=1)
    if isinstance(attn, DiffAttention):
        o = attn.sub_norm(o) * (1 - attn.lambda_init)
        assert torch.allclose(rec_layer.lam, attn.lambda_full())
    assert torch.allclose(attn.out_proj(o.transpose(1, 2).reshape(B, N, -1)), out, atol=1e-5)


@pytest.mark.parametrize("family", ["vit", "speech", "lm"])
@pytest.mark.parametrize("kind", ["diff", "soft"])
def test_record_attention_on_models_leaves_outputs_unchanged(family, kind):
    if family == "vit":
        model, args, kwargs = vit(kind), (torch.randn(2, 1, 28, 28),), {}
    elif family == "speech":
        model, args, kwargs = speech(kind), (0.1 * torch.randn(2, 8000),), {"lengths": torch.tensor([8000, 4000])}
    else:
        model, args, kwargs = lm("diff" if kind == "diff" else "softmax"), (torch.randint(0, 256, (2, 24)),), {}
    expected = model(*args, **kwargs)
    with record_attention(model, device="cpu") as rec:
        out = model(*args, **kwargs)
    assert torch.equal(out, expected)
    assert_unpatched(model)
    attn_layers = [m for m in model.modules() if isinstance(m, (Attention, DiffAttention, DiffAttentionV2, TimmAttention))]
    assert attn_layers and len(rec) == len(attn_layers) and [layer.index for layer in rec] == list(range(len(attn_layers)))
    for layer, module in zip(rec, attn_layers):
        maps = [layer.attn1, layer.attn2] if kind == "diff" else [layer.attn]
        for a in maps:
            assert torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5)  # every row has a valid key here
        if kind == "diff":
            assert layer.lambda_value() == pytest.approx(float(module.lambda_full().detach()))
            assert torch.allclose(layer.diff.sum(-1), 1 - module.lambda_full(), atol=1e-5)
        else:
            assert math.isnan(layer.lambda_value())
    a = rec[0].attn1 if kind == "diff" else rec[0].attn
    if family == "lm":
        assert a.triu(1).abs().max() == 0  # causal
        # the maps equal those each attention layer gives itself for its own input
        inputs = []
        hooks = [blk.attn.register_forward_pre_hook(lambda m, a, kw: inputs.append((a[0], kw)), with_kwargs=True)
                 for blk in model.blocks]
        with torch.no_grad():
            model(*args, **kwargs)
        for h in hooks:
            h.remove()
        direct = [blk.attn(x, **kw, return_attn=True)[1] for blk, (x, kw) in zip(model.blocks, inputs)]
        for layer, m in zip(rec, direct):
            assert all(torch.allclose(layer.maps[k], m[k], atol=1e-6) for k in m)
        attn, (x0, kw0) = model.blocks[0].attn, inputs[0]
        with record_attention(attn, batch=1) as rec2:  # the caller's own return_attn maps are reused
            _, direct2 = attn(x0, **kw0, return_attn=True)
        assert direct2[next(iter(direct2))].shape[0] == 2  # the caller still gets the whole batch
        (layer,) = rec2
        assert all(torch.equal(layer.maps[k], direct[0][k][1:2] if direct[0][k].dim() else direct[0][k]) for k in direct[0])
    if family == "speech":  # the second clip is padded after 4000 samples: its padded keys get nothing
        valid = 1 + ((4000 - 480) // 160 + 1) // 2
        assert a[1, ..., valid:].abs().max() == 0 and a[1, ..., :valid].sum(-1).min() > 0.99


def test_record_attention_selects_layers_and_batch_and_restores_on_error():
    model, x = vit(), torch.randn(3, 1, 28, 28)
    with record_attention(model) as full:
        model(x)
    with record_attention(model, layers=[1, "blocks.3.attn"], batch=slice(1, 2)) as part:
        model(x)
    assert part.names == ["blocks.1.attn", "blocks.3.attn"] and [p.index for p in part] == [1, 3]
    row = token_attention(full[3], query=0, sample=2)  # class token's attention, mean over heads
    assert torch.allclose(row, full[3].diff[2, :, 0].mean(0)) and row.shape == (17,)
    assert torch.allclose(token_attention(full[3], [0, 5], 1, "attn2", head=1), full[3].attn2[1, 1, [0, 5]].mean(0))
    for p in part:
        assert p.attn1.shape[0] == 1
        assert torch.allclose(p.attn1, full[p.name].attn1[1:2], atol=1e-6)
        assert torch.allclose(p.attn2, full[p.name].attn2[1:2], atol=1e-6)
    with pytest.raises(ValueError, match="no attention layer named"):
        with record_attention(model, layers=["blocks.9.attn"]):
            pass
    with pytest.raises(RuntimeError, match="boom"):
        with record_attention(model), record_outliers(model):
            model(x)
            raise RuntimeError("boom")
    assert_unpatched(model)
    assert torch.equal(model(x), model(x))


def test_record_attention_keeps_the_random_stream_with_attention_dropout():
    model, x = vit(attn_drop_rate=0.3).train(), torch.randn(2, 1, 28, 28)
    torch.manual_seed(1)
    expected = model(x)
    torch.manual_seed(1)
    with record_attention(model) as rec:
        out = model(x)
    assert torch.equal(out, expected)
    assert len(rec) == 4


# -- relevant tokens ------------------------------------------------------------------------------
def test_image_relevant_tokens_and_vit_query():
    img = torch.zeros(2, 1, 28, 28)
    img[:, :, 8:13, 15:20] = 1.0  # inside patch (row 1, col 2) -> token 1 + 4 + 2 = 7
    img[:, :, 0, 0] = 1.0  # one pixel of patch 0 -> token 1
    rel = image_relevant_tokens(img, 7)
    assert rel.shape == (2, 17) and rel[0].nonzero().flatten().tolist() == [1, 7]
    assert image_relevant_tokens(img, 7, min_fraction=0.4)[0].nonzero().flatten().tolist() == [7]
    query, rel2 = vit_relevance(vit(), img)
    assert torch.equal(rel2, rel) and query[:, 0].all() and query.sum() == 2


def test_speech_relevance_marks_the_tokens_with_energy():
    model = speech()
    t = torch.arange(8000) / 16000
    wave = 1e-4 * torch.randn(2, 8000)
    wave[:, 1600:3200] += 0.5 * torch.sin(2 * math.pi * 440 * t[1600:3200])
    query, rel = speech_relevance(model, wave, torch.tensor([8000, 2400]))
    assert rel.shape == (2, 25) and torch.equal(query[:, 0], torch.ones(2, dtype=torch.bool)) and query.sum() == 2
    tokens = rel[:, 1:]  # token t covers frames 2t, 2t + 1 (samples 320t .. 320t + 640)
    assert tokens[0, 5:9].all() and not tokens[0, :3].any() and not tokens[0, 12:].any()
    assert tokens[1, 5] and not tokens[1, 6:].any()  # 2400 samples: 13 valid frames, 6 valid tokens


def test_speech_relevance_reads_the_models_framing_and_timm_batches():
    model = speech()
    wave = 0.1 * torch.randn(2, 8000)
    lengths = torch.tensor([8000, 2400])
    rel, pad = speech_relevant_tokens(model, wave, lengths)
    # timm's (B, 1, 1, T) input batches give the same tokens as (B, T)
    rel4, pad4 = speech_relevant_tokens(model, wave[:, None, None], lengths)
    assert torch.equal(rel4, rel) and torch.equal(pad4, pad)
    # the padding agrees with the model's own tokens, whatever its framing
    for framing in (dict(patch_time=4), dict(hop_length=200, patch_time=3)):
        other = timm.create_model("diffkwt_nano", depth=1, num_classes=5, **framing).eval()
        rel, pad = speech_relevant_tokens(other, wave, lengths)
        x, padded = other.tokenize(wave, lengths)
        assert rel.shape[1] == 1 + x.shape[1] == 1 + other.num_tokens(8000)
        assert torch.equal(pad[:, 1:], padded)


def test_needle_relevance_marks_value_and_queries():
    from diffzoo.analysis import needle_relevance
    from diffzoo.data.needles import make_needle_sample
    from diffzoo.data.text import ByteTokenizer

    tok = ByteTokenizer()
    filler = np.frombuffer(b"lorem ipsum dolor sit amet " * 20, dtype=np.uint8).astype(np.int64)
    s = make_needle_sample(filler, tok, 160, 2, 0.5, np.random.default_rng(0))
    query, answer, noise = needle_relevance([s])
    value = tok.decode(s.tokens[answer[0]].tolist())
    assert value.isdigit() and value == tok.decode(s.tokens[s.answer[0]:s.answer[1]].tolist())
    assert query[0].nonzero().flatten().tolist() == list(range(s.answer[0] - 1, s.answer[1] - 1))
    assert not (noise & answer).any()


def test_needle_masks_batch_each_sample_and_refuse_mixed_lengths():
    from diffzoo.analysis import needle_relevance
    from diffzoo.data.needles import make_needle_sample, needle_masks
    from diffzoo.data.text import ByteTokenizer

    tok = ByteTokenizer()
    filler = np.frombuffer(b"lorem ipsum dolor sit amet " * 20, dtype=np.uint8).astype(np.int64)
    rng = np.random.default_rng(1)
    batch = [make_needle_sample(filler, tok, 160, n, d, rng) for n, d in ((1, 0.0), (3, 1.0))]
    query, answer, noise = needle_masks(batch)
    for i, s in enumerate(batch):
        assert answer[i].nonzero().flatten().tolist() == list(range(*s.value))
        assert query[i].nonzero().flatten().tolist() == list(range(s.answer[0] - 1, s.answer[1] - 1))
        assert torch.equal(noise[i], s.noise_mask())
        for start, end in s.needles:  # needle text is neither noise nor (outside the value) answer
            assert not noise[i, start:end].any()
    for got, want in zip(needle_relevance(batch), (query, answer, noise)):
        assert torch.equal(got, want)
    short = make_needle_sample(filler, tok, 100, 1, 0.5, rng)
    with pytest.raises(ValueError, match=r"different lengths \[100, 160\]"):
        needle_masks([batch[0], short])


# -- outliers -------------------------------------------------------------------------------------
def test_outlier_stats_with_a_planted_outlier():
    x = torch.ones(1000)
    x[17] = -100.0
    s = outlier_stats(x)
    assert (s.top1, s.median, s.top1_ratio) == (100.0, 1.0, 100.0)
    assert s.topk_ratio == pytest.approx((100 + 9) / 10) and s.count == 1000
    keep = torch.ones(1000, dtype=torch.bool)
    keep[17] = False
    assert outlier_stats(x, mask=keep).top1_ratio == 1.0


def test_record_outliers_logits_follow_the_differential_head_pairing():
    blocks = nn.Sequential(*[Block(32, 4, attn="diff", num_kv_heads=2, causal=True, depth=i) for i in range(2)])
    x = torch.randn(2, 7, 32)
    expected = blocks(x)
    with record_outliers(blocks, k=5) as rec:
        out = blocks(x)
    assert torch.equal(out, expected)
    assert_unpatched(blocks)
    attn = blocks[0].attn  # 2 differential heads, 1 key/value group: q head 2i + b meets k head b
    h = blocks[0].norm1(x)
    q = attn.q_proj(h).view(2, 7, 4, 8).transpose(1, 2)
    kk = attn.k_proj(h).view(2, 7, 2, 8).transpose(1, 2)
    logits = torch.stack([q[:, 2 * i + b] @ kk[:, b].transpose(-1, -2) for i in range(2) for b in range(2)], 1) / 8**0.5
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    ref = outlier_stats(logits, 5, causal)
    got = rec.logits["0.attn"][0]
    assert got.count == 2 * 4 * 28 and got.count == ref.count
    assert got.top1 == pytest.approx(ref.top1, rel=1e-5) and got.median == pytest.approx(ref.median, rel=1e-5)
    assert rec.hidden["0"][0] == outlier_stats(blocks[0](x), 5)
    assert rec.names("hidden") == ["0", "1"] and len(rec.table("logits", "topk_ratio")) == 2


def test_record_outliers_on_models():
    for model, x in ((vit("diff"), torch.randn(2, 1, 28, 28)), (lm("softmax"), torch.randint(0, 256, (2, 16)))):
        with record_outliers(model) as rec:
            model(x)
        assert len(rec.table("logits")) == len(rec.table("hidden")) == (2 if isinstance(model, CausalLM) else 4)
        assert all(r >= 1 for r in rec.table("hidden", "top1_ratio"))
        assert_unpatched(model)


# -- low-bit attention ----------------------------------------------------------------------------
@pytest.mark.parametrize("granularity", ["head", "tensor"])
def test_absmax_quantize_error_bound_and_levels(granularity):
    s = 3 * torch.randn(2, 3, 5, 7)
    assert absmax_quantize(s, None) is s
    for bits in (8, 6, 4, 2):
        qmax = 2 ** (bits - 1) - 1
        deq = absmax_quantize(s, bits, granularity=granularity)
        absmax = s.abs().amax((-2, -1), keepdim=True) if granularity == "head" else s.abs().amax()
        assert ((s - deq).abs() <= absmax / qmax / 2 + 1e-6).all()
        levels = (deq / (absmax / qmax)).round()
        assert torch.allclose(deq / (absmax / qmax), levels, atol=1e-4) and levels.abs().max() <= qmax
    allowed = torch.ones_like(s, dtype=torch.bool)
    allowed[..., 0, 0] = False
    big = s.clone()
    big[..., 0, 0] = 1e4  # a masked logit must not set the scale
    deq = absmax_quantize(big, 4, allowed, granularity)
    mag = torch.where(allowed, s.abs(), 0.0)
    absmax = mag.amax((-2, -1), keepdim=True) if granularity == "head" else mag.amax()
    assert ((big - deq).abs()[allowed] <= (absmax / 7 / 2 + 1e-6).expand_as(big)[allowed]).all()
    assert deq[..., 0, 0].abs().max() <= absmax.max() + 1e-6  # clamped to the allowed range
    with pytest.raises(ValueError, match="bits"):
        absmax_quantize(s, 1)


MASKS = {
    "none": lambda B, H, N: {},
    "causal": lambda B, H, N: {"causal": True},
    "padding": lambda B, H, N: {"key_padding_mask": torch.arange(N).expand(B, N) >= torch.tensor([[N], [N - 4]])},
    "additive": lambda B, H, N: {"attn_mask": torch.randn(1, H, N, N)},
    "bool_empty_row": lambda B, H, N: {"attn_mask": (torch.rand(B, 1, N, N) > 0.3).index_fill_(2, torch.tensor([2]), False)},
}


@pytest.mark.parametrize("mask", list(MASKS))
def test_low_bit_backend_matches_reference_and_degrades_with_bits(mask):
    B, H, Hkv, N, d = 2, 4, 2, 11, 8
    q, k = 2 * torch.randn(B, 2 * H, N, d), 2 * torch.randn(B, 2 * Hkv, N, d)
    v, lam = torch.randn(B, Hkv, N, 2 * d), torch.tensor(0.4)
    masks = MASKS[mask](B, H, N)
    soft_masks = dict(masks)  # the softmax call has 2H = 8 query heads (GQA over 4 kv heads)
    if "attn_mask" in masks and masks["attn_mask"].shape[1] == H:
        soft_masks["attn_mask"] = masks["attn_mask"].repeat_interleave(2, dim=1)
    v_soft = v[..., :d].repeat_interleave(2, 1)
    ref_diff = diff_attention_reference(q, k, v, lam, **masks)
    ref_soft = attention_reference(q, k, v_soft, **soft_masks)
    errs = {}
    for bits in (None, 16, 8, 6, 4):
        with low_bit_attention(bits):
            out_diff = diff_attention(q, k, v, lam, **masks)
            out_soft = attention(q, k, v_soft, **soft_masks)
        errs[bits] = (rel_err(out_diff, ref_diff), rel_err(out_soft, ref_soft))
        if mask == "bool_empty_row":
            assert out_diff[:, :, 2].abs().max() == 0 and out_soft[:, :, 2].abs().max() == 0
    assert max(errs[None]) < 1e-6 and max(errs[16]) < 1e-3
    for i in range(2):
        assert errs[16][i] < errs[8][i] < errs[6][i] < errs[4][i] and errs[4][i] > 1e-3


def test_low_bit_gradients_flow_straight_through():
    q, k = torch.randn(1, 4, 6, 8, requires_grad=True), torch.randn(1, 4, 6, 8, requires_grad=True)
    v, lam = torch.randn(1, 2, 6, 16, requires_grad=True), torch.tensor(0.3, requires_grad=True)
    with low_bit_attention(4):
        diff_attention(q, k, v, lam, causal=True).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v, lam))


def test_low_bit_attention_on_models_and_metric_vs_bits():
    model, x = vit("diff", backend="sdpa"), torch.randn(4, 1, 28, 28)
    reference = model(x)
    with low_bit_attention(4):
        assert torch.equal(model(x), reference)  # the layers' own backend="sdpa" wins over the context
    with pytest.raises(RuntimeError, match="inside"):
        with low_bit_attention(4, model=model):
            assert not torch.allclose(model(x), reference, atol=1e-4)
            raise RuntimeError("inside")
    assert all(blk.attn.backend == "sdpa" for blk in model.blocks)
    results = metric_vs_bits(lambda: (model(x) - reference).abs().max().item(), model=model)
    assert list(results) == [None, 8, 6, 4]
    assert results[None] < 1e-5 < results[8] < results[4]
    soft = lm("softmax")  # causal, RoPE, softmax attention: the "softmax" op goes through the same backend
    tokens = torch.randint(0, 256, (2, 20))
    ref = soft(tokens)
    errs = metric_vs_bits(lambda: (soft(tokens) - ref).abs().max().item(), bits=(None, 4))
    assert errs[None] < 1e-5 < errs[4]


# -- plots ----------------------------------------------------------------------------------------
def test_plots_render_valid_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from diffzoo.analysis import plots

    img = torch.rand(1, 1, 28, 28)
    recs, outs = {}, {}
    for kind in ("diff", "soft"):
        model = vit(kind)
        with record_attention(model) as recs[kind], record_outliers(model) as outs[kind]:
            model(img)
    sp = speech()
    wave = 0.1 * torch.randn(1, 8000)
    with record_attention(sp) as sp_rec:
        sp(wave)
    spec = sp.frontend(wave)[0][0]
    text = "The key of ABC is 123."
    model = lm()
    with record_attention(model) as lm_rec:
        model(torch.tensor([list(text.encode())]))
    last = lm_rec[1]
    paths = [
        plots.plot_image_attention(img[0], recs["diff"][3], tmp_path / "img_diff.png"),
        plots.plot_image_attention(img[0], recs["soft"][3], tmp_path / "img_soft.png"),
        plots.plot_spectrogram_attention(spec, sp_rec[1], tmp_path / "spec.png", patch_time=2),
        plots.plot_text_attention(text, {"attn1": last.attn1[0].mean(0)[-1], "diff": last.diff[0].mean(0)[-1]},
                                  tmp_path / "text.png", width=16),
        plots.plot_lambda_by_depth({"vit": recs["diff"], "lm": lm_rec.lambdas()}, tmp_path / "lambda.png"),
        plots.plot_outliers_by_layer({"diff": outs["diff"], "softmax": outs["soft"]}, tmp_path / "outliers.png"),
        plots.plot_metric_vs_bits({"diff": {None: 0.9, 8: 0.9, 4: 0.5}, "softmax": {None: 0.9, 8: 0.8, 4: 0.2}},
                                  tmp_path / "bits.png", metric="accuracy"),
    ]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG and len(data) > 2000, p
    with pytest.raises(ValueError, match="weights for"):
        plots.plot_text_attention("abc", torch.ones(4), tmp_path / "bad.png")


def test_low_bit_attention_reaches_timm_attention_of_softmax_vit():
    """The softmax ViT baseline is timm's ViT; low_bit_attention(model=...) still quantises its logits."""
    torch.manual_seed(0)
    model, x = vit("soft"), torch.randn(2, 1, 28, 28)
    assert any(type(m) is TimmAttention for m in model.modules())
    with torch.no_grad():
        plain = model(x)
        outs = metric_vs_bits(lambda: model(x), (None, 2), model=model)
    torch.testing.assert_close(outs[None], plain, rtol=1e-4, atol=1e-5)  # unquantised: same math
    assert (outs[2] - plain).abs().max() > 1e-3  # 2-bit logits change the output
    assert_unpatched(model)
