"""DiffCLIP models: open_clip integration, configs, masks, input checks and the checkpoint converter."""

from __future__ import annotations

import argparse
import datetime
import math

import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from timm.layers import Attention as TimmAttention

from diffzoo.layers import Attention, DiffAttention, check_matched, lambda_init_schedule
from diffzoo.models import clip as C
from diffzoo.models.vit import TimmDiffAttention
from diffzoo.weights.diffclip import convert_diffclip_state_dict, load_diffclip_checkpoint
from diffzoo.weights.io import unwrap_state_dict

VIT_B = ["DiffCLIP-ViT-B-16", "DiffCLIPstar-ViT-B-16", "DiffCLIPdagger-ViT-B-16", "SoftCLIP-ViT-B-16"]
NANO = ["DiffCLIP-nano", "DiffCLIPdagger-nano", "SoftCLIP-nano"]
SOT, EOT = 49406, 49407


@pytest.fixture(scope="module")
def nano() -> torch.nn.Module:
    torch.manual_seed(0)
    return C.create_clip("DiffCLIP-nano").eval()


def _tokens(texts: list[str], context_length: int = 16) -> torch.Tensor:
    return open_clip.get_tokenizer("DiffCLIP-nano", context_length=context_length)(texts)


def _attn_kinds(tower: torch.nn.Module) -> set[type]:
    return {type(m) for m in tower.modules() if isinstance(m, (Attention, DiffAttention, TimmAttention))}


# -- registration and the open_clip factory --------------------------------------------------------
def test_configs_registered_with_open_clip() -> None:
    assert C.clip_model_names() == sorted(VIT_B + NANO)
    assert set(C.clip_model_names()) <= set(open_clip.list_models())
    for name in C.clip_model_names():
        cfg = open_clip.get_model_config(name)
        assert cfg["custom_text"] and "diffzoo" in cfg["vision_cfg"] and "diffzoo" in cfg["text_cfg"]


def test_hooks_are_idempotent_and_fall_through() -> None:
    before = (open_clip.model._build_vision_tower, open_clip.model._build_text_tower)
    C.install_open_clip_hooks()
    C.install_open_clip_hooks()
    assert (open_clip.model._build_vision_tower, open_clip.model._build_text_tower) == before
    assert before[0]._diffzoo_hook and before[1]._diffzoo_hook
    # a config without a "diffzoo" entry is built by open_clip itself
    plain = open_clip.model.CustomTextCLIP(
        16, dict(image_size=16, patch_size=8, width=32, layers=1, head_width=16),
        dict(context_length=8, vocab_size=100, width=32, heads=2, layers=1),
    )
    assert type(plain.visual) is open_clip.transformer.VisionTransformer
    assert type(plain.text) is open_clip.transformer.TextTransformer


@pytest.mark.parametrize("name", VIT_B)
def test_factory_builds_vit_b_on_meta(name: str) -> None:
    with torch.device("meta"):
        model = open_clip.create_model(name, device="meta")
    assert isinstance(model, open_clip.CustomTextCLIP)
    v, t = model.visual, model.text
    assert isinstance(v, C.DiffVisionTower) and isinstance(t, C.DiffTextTower)
    assert v.image_size == (224, 224) and v.trunk.embed_dim == 768 and len(v.trunk.blocks) == 12
    assert v.proj.shape == (768, 512) and t.text_projection.shape == (512, 512)
    assert (t.context_length, t.vocab_size, t.width, len(t.blocks)) == (77, 49408, 512, 12)
    assert model.visual.preprocess_cfg["mean"] == open_clip.OPENAI_DATASET_MEAN
    vis_attn, txt_attn = v.trunk.blocks[3].attn, t.blocks[3].attn
    if name == "SoftCLIP-ViT-B-16":
        # the image tower is timm's ViT with timm's attention, the text tower diffzoo's softmax blocks
        assert _attn_kinds(v) == {TimmAttention} and _attn_kinds(t) == {Attention}
        assert (vis_attn.num_heads, vis_attn.head_dim, txt_attn.num_heads, txt_attn.head_dim) == (12, 64, 8, 64)
        return
    assert _attn_kinds(v) == {TimmDiffAttention}  # diffzoo's DiffAttention inside timm's ViT
    assert (vis_attn.num_heads, vis_attn.head_dim) == (6, 64)  # 12 baseline heads -> 6 differential heads
    if name == "DiffCLIPdagger-ViT-B-16":
        assert _attn_kinds(t) == {Attention} and (txt_attn.num_heads, txt_attn.head_dim) == (8, 64)
    else:
        assert _attn_kinds(t) == {DiffAttention} and (txt_attn.num_heads, txt_attn.head_dim) == (4, 64)
    expected = lambda_init_schedule(3) if name.startswith("DiffCLIPstar") else 0.8
    for attn in (vis_attn, txt_attn):
        if isinstance(attn, DiffAttention):
            assert attn.lambda_init == pytest.approx(expected)
    # the published DiffCLIP text blocks use QuickGELU, its image blocks GELU
    assert type(t.blocks[0].mlp.act) is open_clip.transformer.QuickGELU
    assert type(v.trunk.blocks[0].mlp.act) is torch.nn.GELU


@pytest.mark.parametrize("diff, soft", [(n, "SoftCLIP-ViT-B-16") for n in VIT_B[:3]] + [(n, "SoftCLIP-nano") for n in NANO[:2]])
def test_pairs_are_parameter_matched(diff: str, soft: str) -> None:
    rel = check_matched(C.create_clip(soft, device="meta"), C.create_clip(diff, device="meta"))
    assert 0 < rel < 0.005


@pytest.mark.parametrize("name", NANO)
def test_nano_through_factory_with_transforms(name: str) -> None:
    model, _, preprocess = open_clip.create_model_and_transforms(name)
    assert sum(p.numel() for p in model.parameters()) < 4_000_000
    norm = preprocess.transforms[-1]
    assert list(norm.mean) == [0.5, 0.5, 0.5] and list(norm.std) == [0.5, 0.5, 0.5]
    image = preprocess(Image.new("RGB", (28, 28), (255, 0, 0)))
    assert image.shape == (3, 32, 32) and image[0].min() == pytest.approx(1.0) and image[1].max() == pytest.approx(-1.0)
    tokens = open_clip.get_tokenizer(name)(["a red seven on a blue background", "a green one"])
    assert tokens.shape == (2, 16)
    with torch.no_grad():
        img = model.encode_image(image[None].expand(2, -1, -1, -1))
        txt = model.encode_text(tokens, normalize=True)
        image_features, text_features, scale = model(image[None].expand(2, -1, -1, -1), tokens)
    assert img.shape == txt.shape == (2, 64)
    assert not torch.allclose(img.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(image_features, F.normalize(img, dim=-1))
    torch.testing.assert_close(text_features, txt)
    assert scale == pytest.approx(1 / 0.07, rel=1e-5)
    # a caller's preprocessing values still win over the config's
    forced, _, _ = open_clip.create_model_and_transforms(name, image_mean=(0.1, 0.2, 0.3), output_dict=True)
    assert tuple(forced.visual.preprocess_cfg["mean"]) == (0.1, 0.2, 0.3)
    assert list(forced.visual.preprocess_cfg["std"]) == [0.5, 0.5, 0.5]
    with torch.no_grad():
        assert set(forced(image[None], tokens[:1])) == {"image_features", "text_features", "logit_scale"}


def test_output_dict_logit_bias_and_clip_loss_backprop() -> None:
    torch.manual_seed(0)
    model = C.create_clip("DiffCLIP-nano", output_dict=True, init_logit_bias=-2.0)
    image = torch.randn(4, 3, 32, 32)
    text = _tokens([f"a red {d} on a blue background" for d in ("one", "two", "three", "four")])
    out = model(image, text)
    assert set(out) == {"image_features", "text_features", "logit_scale", "logit_bias"}
    loss = open_clip.ClipLoss()(out["image_features"], out["text_features"], out["logit_scale"])
    assert torch.isfinite(loss)
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None and n != "logit_bias"]
    assert not no_grad, no_grad
    assert model.text.blocks[0].attn.lambda_q1.grad.abs().sum() > 0


def test_zero_shot_classifier(nano) -> None:
    tokenizer = open_clip.get_tokenizer("DiffCLIP-nano")
    classnames = ["zero", "one", "two"]
    templates = [lambda c: f"a red {c} on a blue background", lambda c: f"a {c}"]
    weights = open_clip.build_zero_shot_classifier(nano, tokenizer, classnames, templates, use_tqdm=False)
    assert weights.shape == (64, 3)
    torch.testing.assert_close(weights.norm(dim=0), torch.ones(3))
    with torch.no_grad():
        manual = nano.encode_text(tokenizer([t("one") for t in templates]), normalize=True).mean(0)
    torch.testing.assert_close(weights[:, 1], F.normalize(manual, dim=-1))


def test_padding_does_not_change_text_features(nano) -> None:
    text = _tokens(["a red seven on a blue background", "a green one"])  # (2, 16), zeros after EOT
    eot = text.argmax(-1)
    junk = text.clone()
    for i, e in enumerate(eot.tolist()):
        junk[i, e + 1:] = torch.randint(1, EOT, (16 - e - 1,))
    short = text[:, : int(eot.max()) + 1]  # no padding at all for the longest text
    with torch.no_grad():
        ref = nano.encode_text(text)
        torch.testing.assert_close(nano.encode_text(junk), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(nano.encode_text(short), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(nano.encode_text(text[1:2, : int(eot[1]) + 1]), ref[1:2], atol=1e-5, rtol=1e-5)
    # the mask is real: without it, later tokens would reach earlier ones in a non-causal tower
    torch.manual_seed(1)
    bidir = C.create_clip("DiffCLIP-nano", text_cfg={"no_causal_mask": True}).eval()
    with torch.no_grad():
        torch.testing.assert_close(bidir.encode_text(junk), bidir.encode_text(text), atol=1e-5, rtol=1e-5)


def test_causal_mask(nano) -> None:
    text = _tokens(["a red seven on a blue background"])
    changed = text.clone()
    changed[0, 5] = 1000  # a token before the EOT (position 8)
    with torch.no_grad():
        a = nano.text.forward_intermediates(text, indices=1)["text_intermediates"][0]
        b = nano.text.forward_intermediates(changed, indices=1)["text_intermediates"][0]
    torch.testing.assert_close(a[:, :5], b[:, :5])  # earlier positions never see later tokens
    assert (a[:, 5:9] - b[:, 5:9]).abs().amax() > 1e-3
    with torch.no_grad():
        assert not torch.allclose(nano.encode_text(text), nano.encode_text(changed))


def test_forward_intermediates_lock_and_grad_checkpointing() -> None:
    torch.manual_seed(0)
    model = C.create_clip("DiffCLIP-nano")
    image, text = torch.randn(2, 3, 32, 32), _tokens(["a red one", "a blue two"])
    out = model.forward_intermediates(image, text, image_indices=2, text_indices=[0, 3], normalize=False)
    assert [y.shape for y in out["image_intermediates"]] == [(2, 128, 4, 4)] * 2
    assert [y.shape for y in out["text_intermediates"]] == [(2, 16, 64)] * 2
    with torch.no_grad():
        torch.testing.assert_close(out["image_features"], model.encode_image(image))
        torch.testing.assert_close(out["text_features"], model.encode_text(text))

    ref = model(image, text)
    grads_ref = torch.autograd.grad(ref[0].sum() + ref[1].sum(), list(model.parameters()), allow_unused=True)
    model.set_grad_checkpointing(True)
    assert model.visual.trunk.grad_checkpointing and model.text.grad_checkpointing
    ckpt = model(image, text)
    grads = torch.autograd.grad(ckpt[0].sum() + ckpt[1].sum(), list(model.parameters()), allow_unused=True)
    for g, r in zip(grads, grads_ref):
        assert (g is None) == (r is None)
        if g is not None:
            torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)

    model.lock_image_tower(unlocked_groups=1)
    model.lock_text_tower(unlocked_layers=2)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n in trainable if n.startswith("visual.")} == {"visual.proj"}
    assert {n for n in trainable if n.startswith("text.")} == {
        n for n, _ in model.named_parameters() if n.startswith(("text.blocks.3.", "text.ln_final.", "text.text_projection"))
    }


# -- input and config errors -----------------------------------------------------------------------
@pytest.mark.parametrize("shape, match", [
    ((2, 3, 28, 28), r"\(batch, 3, 32, 32\).*\(2, 3, 28, 28\)"),
    ((2, 1, 32, 32), r"\(batch, 3, 32, 32\).*\(2, 1, 32, 32\)"),
    ((3, 32, 32), r"shape \(batch, 3, 32, 32\), got \(3, 32, 32\)"),
])
def test_image_shape_errors(nano, shape, match) -> None:
    with pytest.raises(ValueError, match=match):
        nano.encode_image(torch.randn(shape))


def test_image_dtype_error(nano) -> None:
    with pytest.raises(ValueError, match="floating-point"):
        nano.encode_image(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


@pytest.mark.parametrize("text, match", [
    (torch.zeros(16, dtype=torch.long), "2-D"),
    (torch.zeros(1, 2, 16, dtype=torch.long), "2-D"),
    (torch.zeros(2, 16), "integer token ids.*float32"),
    (torch.zeros(2, 16, dtype=torch.bool), "integer token ids"),
    (torch.zeros(2, 17, dtype=torch.long), "17 tokens.*context_length=16"),
    (torch.full((2, 16), 49408), r"\[0, 49408\)"),
    ("a red seven", "torch.Tensor of token ids"),
])
def test_text_errors(nano, text, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        nano.encode_text(text)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="attentional_pool"):
        C.create_clip("DiffCLIP-nano", vision_cfg={"attentional_pool": True}, device="meta")
    with pytest.raises(ValueError, match="proj_bias"):
        C.create_clip("DiffCLIP-nano", text_cfg={"proj_bias": True}, device="meta")
    with pytest.raises(ValueError, match="diffzoo.attn: unknown attention variant 'flash'"):
        C.create_clip("DiffCLIP-nano", text_cfg={"diffzoo": {"attn": "flash"}}, device="meta")
    with pytest.raises(ValueError, match="unknown diffzoo tower fields.*lamda_init"):
        C.create_clip("DiffCLIP-nano", vision_cfg={"diffzoo": {"lamda_init": 0.5}}, device="meta")
    with pytest.raises(ValueError, match="not a diffzoo CLIP config"):
        C.create_clip("DiffCLIP-huge")
    with pytest.raises(ValueError, match="pure_bf16"):
        open_clip.create_model("DiffCLIP-nano", precision="bf16")
    cfg = open_clip.get_model_config("DiffCLIP-nano")
    cfg.pop("custom_text")
    with pytest.raises(AttributeError, match="custom_text"):
        open_clip.model.CLIP(**cfg)


# -- converter from the published DiffCLIP layout --------------------------------------------------
# A tiny configuration of the published modules (timm ViT with differential blocks + CLIP text
# transformer with differential attention), with this test's own reference forward pass.
TINY = dict(
    embed=16, v_width=32, v_layers=2, v_heads=4, patch=8, image=16,
    t_width=32, t_layers=2, t_heads=4, ctx=8, vocab=64, lambda_init=0.8,
)
TINY_OVERRIDES = dict(
    embed_dim=TINY["embed"],
    vision_cfg=dict(image_size=TINY["image"], patch_size=TINY["patch"], width=TINY["v_width"], layers=TINY["v_layers"],
                    head_width=TINY["v_width"] // TINY["v_heads"], mlp_ratio=4.0, diffzoo={"preprocess_cfg": None}),
    text_cfg=dict(context_length=TINY["ctx"], vocab_size=TINY["vocab"], width=TINY["t_width"], heads=TINY["t_heads"],
                  layers=TINY["t_layers"], mlp_ratio=4.0, diffzoo={"act": "quick_gelu"}),
)


def _published_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.05, mean=0.0):
        return mean + std * torch.randn(*shape, generator=g)

    sd: dict[str, torch.Tensor] = {}

    def attn_block(prefix: str, width: int, heads: int, mlp: str, norms: tuple[str, str]) -> None:
        d = width // heads
        for n in norms:
            sd[f"{prefix}.{n}.weight"], sd[f"{prefix}.{n}.bias"] = r(width, std=0.1, mean=1.0), r(width, std=0.1)
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            sd[f"{prefix}.attn.{p}.weight"], sd[f"{prefix}.attn.{p}.bias"] = r(width, width, std=0.2), r(width)
        for p in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            sd[f"{prefix}.attn.{p}"] = r(d, std=0.1)
        sd[f"{prefix}.attn.diff_norm.weight"] = r(2 * d, std=0.1, mean=1.0)
        fc1, fc2 = ("c_fc", "c_proj") if mlp == "clip" else ("fc1", "fc2")
        sd[f"{prefix}.mlp.{fc1}.weight"], sd[f"{prefix}.mlp.{fc1}.bias"] = r(4 * width, width), r(4 * width)
        sd[f"{prefix}.mlp.{fc2}.weight"], sd[f"{prefix}.mlp.{fc2}.bias"] = r(width, 4 * width), r(width)

    vw, tw, n_patches = TINY["v_width"], TINY["t_width"], (TINY["image"] // TINY["patch"]) ** 2
    sd["visual.cls_token"], sd["visual.pos_embed"] = r(1, 1, vw, std=0.5), r(1, 1 + n_patches, vw, std=0.5)
    sd["visual.patch_embed.proj.weight"] = r(vw, 3, TINY["patch"], TINY["patch"])
    sd["visual.patch_embed.proj.bias"] = r(vw)
    for i in range(TINY["v_layers"]):
        attn_block(f"visual.blocks.{i}", vw, TINY["v_heads"], "timm", ("norm1", "norm2"))
    sd["visual.norm.weight"], sd["visual.norm.bias"] = r(vw, std=0.1, mean=1.0), r(vw, std=0.1)
    sd["image_projection"] = r(vw, TINY["embed"], std=0.2)
    sd["token_embedding.weight"], sd["positional_embedding"] = r(TINY["vocab"], tw, std=0.5), r(TINY["ctx"], tw, std=0.1)
    for i in range(TINY["t_layers"]):
        attn_block(f"transformer.resblocks.{i}", tw, TINY["t_heads"], "clip", ("ln_1", "ln_2"))
    sd["ln_final.weight"], sd["ln_final.bias"] = r(tw, std=0.1, mean=1.0), r(tw, std=0.1)
    sd["text_projection"] = r(tw, TINY["embed"], std=0.2)
    sd["logit_scale"] = torch.tensor(math.log(1 / 0.05))
    return sd


def _ref_diff_attention(x, sd, prefix, heads, causal):
    """The published differential attention: 2h heads of width d, maps (2i, 2i+1) paired, v as (h, 2d)."""
    B, N, D = x.shape
    h, d = heads // 2, D // heads
    lin = lambda name, t: F.linear(t, sd[f"{prefix}.attn.{name}.weight"], sd[f"{prefix}.attn.{name}.bias"])
    q = lin("q_proj", x).view(B, N, 2 * h, d).transpose(1, 2) * d ** -0.5
    k = lin("k_proj", x).view(B, N, 2 * h, d).transpose(1, 2)
    v = lin("v_proj", x).view(B, N, h, 2 * d).transpose(1, 2)
    scores = q @ k.transpose(-1, -2)
    if causal:
        scores = scores + torch.full((N, N), float("-inf")).triu(1)
    maps = scores.softmax(-1).view(B, h, 2, N, N)
    lam = (torch.exp((sd[f"{prefix}.attn.lambda_q1"] * sd[f"{prefix}.attn.lambda_k1"]).sum())
           - torch.exp((sd[f"{prefix}.attn.lambda_q2"] * sd[f"{prefix}.attn.lambda_k2"]).sum()) + TINY["lambda_init"])
    o = (maps[:, :, 0] - lam * maps[:, :, 1]) @ v  # (B, h, N, 2d)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * sd[f"{prefix}.attn.diff_norm.weight"]
    o = (o * (1 - TINY["lambda_init"])).transpose(1, 2).reshape(B, N, D)
    return lin("out_proj", o)


def _ref_block(x, sd, prefix, heads, causal, norms, fcs, act):
    ln = lambda n, t: F.layer_norm(t, t.shape[-1:], sd[f"{prefix}.{n}.weight"], sd[f"{prefix}.{n}.bias"], 1e-5)
    x = x + _ref_diff_attention(ln(norms[0], x), sd, prefix, heads, causal)
    hdn = act(F.linear(ln(norms[1], x), sd[f"{prefix}.mlp.{fcs[0]}.weight"], sd[f"{prefix}.mlp.{fcs[0]}.bias"]))
    return x + F.linear(hdn, sd[f"{prefix}.mlp.{fcs[1]}.weight"], sd[f"{prefix}.mlp.{fcs[1]}.bias"])


def _ref_encode_text(sd, text):
    x = sd["token_embedding.weight"][text] + sd["positional_embedding"][: text.shape[1]]
    for i in range(TINY["t_layers"]):
        x = _ref_block(x, sd, f"transformer.resblocks.{i}", TINY["t_heads"], True, ("ln_1", "ln_2"), ("c_fc", "c_proj"),
                       lambda t: t * torch.sigmoid(1.702 * t))
    x = F.layer_norm(x, x.shape[-1:], sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    return x[torch.arange(len(text)), text.argmax(-1)] @ sd["text_projection"]


def _ref_encode_image(sd, image):
    x = F.conv2d(image, sd["visual.patch_embed.proj.weight"], sd["visual.patch_embed.proj.bias"], stride=TINY["patch"])
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([sd["visual.cls_token"].expand(len(x), -1, -1), x], 1) + sd["visual.pos_embed"]
    for i in range(TINY["v_layers"]):
        x = _ref_block(x, sd, f"visual.blocks.{i}", TINY["v_heads"], False, ("norm1", "norm2"), ("fc1", "fc2"), F.gelu)
    x = F.layer_norm(x, x.shape[-1:], sd["visual.norm.weight"], sd["visual.norm.bias"], 1e-5)
    return x[:, 0] @ sd["image_projection"]


def _tiny_inputs():
    g = torch.Generator().manual_seed(3)
    image = torch.randn(3, 3, TINY["image"], TINY["image"], generator=g)
    text = torch.zeros(3, TINY["ctx"], dtype=torch.long)
    for i, n in enumerate((3, 6, 8)):  # SOT, words, EOT (the largest id), then padding
        text[i, :n] = torch.randint(1, TINY["vocab"] - 2, (n,), generator=g)
        text[i, 0], text[i, n - 1] = TINY["vocab"] - 2, TINY["vocab"] - 1
    return image, text


def _tiny_model() -> torch.nn.Module:
    return C.create_clip("DiffCLIP-nano", **TINY_OVERRIDES).eval()


def test_converter_places_every_tensor_and_matches_published_math() -> None:
    sd = _published_state_dict()
    converted = convert_diffclip_state_dict(sd)
    model = _tiny_model()
    assert set(converted) == set(model.state_dict())
    model.load_state_dict(converted, strict=True)
    params = dict(model.named_parameters())
    pairs = {
        "visual.blocks.1.attn.q_proj.weight": "visual.trunk.blocks.1.attn.q_proj.weight",
        "visual.blocks.0.attn.diff_norm.weight": "visual.trunk.blocks.0.attn.sub_norm.weight",
        "visual.blocks.1.attn.lambda_k2": "visual.trunk.blocks.1.attn.lambda_k2",
        "image_projection": "visual.proj",
        "transformer.resblocks.1.attn.diff_norm.weight": "text.blocks.1.attn.sub_norm.weight",
        "transformer.resblocks.0.attn.lambda_q1": "text.blocks.0.attn.lambda_q1",
        "transformer.resblocks.0.mlp.c_proj.weight": "text.blocks.0.mlp.fc2.weight",
        "transformer.resblocks.1.ln_2.bias": "text.blocks.1.norm2.bias",
        "text_projection": "text.text_projection",
        "logit_scale": "logit_scale",
    }
    for src, dst in pairs.items():
        torch.testing.assert_close(params[dst].detach(), sd[src], rtol=0, atol=0)
    assert model.text.blocks[0].attn.lambda_init == model.visual.trunk.blocks[1].attn.lambda_init == 0.8

    image, text = _tiny_inputs()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(text), _ref_encode_text(sd, text), atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(model.encode_image(image), _ref_encode_image(sd, image), atol=2e-5, rtol=2e-5)
        assert model(image, text)[2] == pytest.approx(20.0, rel=1e-5)


def test_converter_splits_fused_qkv() -> None:
    sd = _published_state_dict()
    fused = dict(sd)
    for prefix in ("visual.blocks.0", "transformer.resblocks.1"):
        for kind in ("weight", "bias"):
            parts = [fused.pop(f"{prefix}.attn.{p}_proj.{kind}") for p in "qkv"]
            fused[f"{prefix}.attn.in_proj_{kind}"] = torch.cat(parts)
    converted = convert_diffclip_state_dict(fused)
    rows = fused["transformer.resblocks.1.attn.in_proj_weight"]
    w = TINY["t_width"]
    for i, p in enumerate("qkv"):
        torch.testing.assert_close(converted[f"text.blocks.1.attn.{p}_proj.weight"], rows[i * w:(i + 1) * w], rtol=0, atol=0)
    torch.testing.assert_close(converted["visual.trunk.blocks.0.attn.v_proj.bias"], sd["visual.blocks.0.attn.v_proj.bias"])
    assert convert_diffclip_state_dict(fused).keys() == convert_diffclip_state_dict(sd).keys()


def test_loader_unwraps_and_reports_key_problems(tmp_path) -> None:
    sd = _published_state_dict()
    path = tmp_path / "diffclip.pt"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in sd.items()}}, path)
    model = load_diffclip_checkpoint(path, "DiffCLIP-nano", **TINY_OVERRIDES)
    image, text = _tiny_inputs()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(text), _ref_encode_text(sd, text), atol=2e-5, rtol=2e-5)
    assert unwrap_state_dict({"model": {"_orig_mod.module.a": torch.ones(1)}}).keys() == {"a"}

    broken = {k: v for k, v in sd.items() if k != "visual.blocks.1.attn.lambda_q2"}
    broken["visual.head.weight"] = torch.zeros(10, TINY["v_width"])
    broken["ln_final.bias"] = torch.zeros(TINY["t_width"] + 1)
    torch.save(broken, path)
    with pytest.raises(ValueError) as err:
        load_diffclip_checkpoint(path, "DiffCLIP-nano", **TINY_OVERRIDES)
    msg = str(err.value)
    assert "visual.trunk.blocks.1.attn.lambda_q2" in msg and "missing" in msg
    assert "visual.head.weight" in msg and "unexpected" in msg
    assert "text.ln_final.bias: checkpoint (33,) vs model (32,)" in msg

    # training arguments (argparse.Namespace) load safely; any other pickled object is refused, never unpickled
    torch.save({"state_dict": sd, "args": argparse.Namespace(lr=1e-3)}, path)
    model = load_diffclip_checkpoint(path, "DiffCLIP-nano", **TINY_OVERRIDES)
    torch.testing.assert_close(model.visual.proj.detach(), sd["image_projection"])
    torch.save({"state_dict": sd, "started": datetime.date(2025, 3, 1)}, path)
    with pytest.raises(ValueError, match=r"pickled objects \(datetime.date\).*loads only tensors and plain values"):
        load_diffclip_checkpoint(path, "DiffCLIP-nano", **TINY_OVERRIDES)


def _published_name(key: str) -> str:
    """The published DiffCLIP name of a diffzoo CLIP key (written independently of the converter)."""
    if key == "visual.proj":
        return "image_projection"
    key = key.replace(".sub_norm.", ".diff_norm.")
    if key.startswith("visual.trunk."):
        return "visual." + key[len("visual.trunk."):]
    key = key[len("text."):] if key.startswith("text.") else key
    if key.startswith("blocks."):
        key = "transformer.resblocks." + key[len("blocks."):]
        for a, b in ((".norm1.", ".ln_1."), (".norm2.", ".ln_2."), (".mlp.fc1.", ".mlp.c_fc."), (".mlp.fc2.", ".mlp.c_proj.")):
            key = key.replace(a, b)
    return key


def test_converter_fits_vit_b_layout() -> None:
    """A full-size published key set (names and shapes) converts onto DiffCLIP-ViT-B-16 exactly."""
    own = C.create_clip("DiffCLIP-ViT-B-16", device="meta").state_dict()
    published = {_published_name(k): v for k, v in own.items()}
    assert {"visual.blocks.11.attn.diff_norm.weight", "transformer.resblocks.11.mlp.c_fc.bias", "image_projection",
            "visual.cls_token", "positional_embedding", "logit_scale"} <= set(published)
    assert published["visual.blocks.0.attn.lambda_q1"].shape == (64,)
    assert published["transformer.resblocks.0.attn.diff_norm.weight"].shape == (128,)
    converted = convert_diffclip_state_dict(published)
    assert converted.keys() == own.keys()
    assert all(converted[k].shape == own[k].shape for k in own)
