"""diffzoo.models.vit: every registered ViT through timm, matched baselines, timm features, reload."""

from __future__ import annotations

import subprocess
import sys

import pytest
import timm
import torch
from timm.layers import Attention as TimmAttention
from timm.models.vision_transformer import VisionTransformer as TimmVisionTransformer

import diffzoo.models  # noqa: F401  (registers the models)
from diffzoo.layers import DiffAttention, check_matched, count_parameters
from diffzoo.models import VIT_CONFIGS, VisionTransformer, matched_name, model_names

ALL = model_names()


def _small_kwargs(name: str) -> dict:
    """Keep every model's architecture but feed it small images (the 224 models get 32x32 inputs)."""
    return {"img_size": 32} if name.endswith("_224") else {}


@pytest.mark.parametrize("name", ALL)
def test_registered_model_forward_backward(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, **_small_kwargs(name))
    assert VisionTransformer is TimmVisionTransformer and type(model) is TimmVisionTransformer
    c, h, w = model.pretrained_cfg["input_size"]
    size = model.patch_embed.img_size
    x = torch.randn(2, c, *size)
    out = model(x)
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without a finite gradient: {missing[:5]}"
    zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
    assert not zero, f"parameters with an all-zero gradient: {zero[:5]}"


@pytest.mark.parametrize("name", [n for n in ALL if n.startswith("diffvit")])
def test_differential_models_use_diffzoo_attention_and_match_baseline(name: str) -> None:
    kw = _small_kwargs(name)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        diff, base = timm.create_model(name, **kw), timm.create_model(matched_name(name), **kw)
    assert all(isinstance(b.attn, DiffAttention) for b in diff.blocks)
    assert all(type(b.attn) is TimmAttention for b in base.blocks)  # the baseline is timm's own ViT
    assert check_matched(base, diff) < 0.005
    # Paper convention: projections have identical shapes; only lambdas and per-head norms are extra.
    for bd, bb in zip(diff.blocks, base.blocks):
        qkv = torch.cat([bd.attn.q_proj.weight, bd.attn.k_proj.weight, bd.attn.v_proj.weight])
        assert qkv.shape == bb.attn.qkv.weight.shape
        assert bd.attn.out_proj.weight.shape == bb.attn.proj.weight.shape
    d = diff.blocks[0].attn.head_dim
    assert count_parameters(diff) - count_parameters(base) == len(diff.blocks) * 6 * d


def test_sizes_follow_timm_and_lambda_schedule() -> None:
    # softvit_small has exactly timm's ViT-S/16 parameter count.
    ref = timm.create_model("vit_small_patch16_224", img_size=32)
    ours = timm.create_model("softvit_small_patch16_224", img_size=32)
    assert count_parameters(ours) == count_parameters(ref)
    tiny = timm.create_model("diffvit_tiny_patch16_224", img_size=32)
    assert tiny.blocks[0].attn.num_heads == 3 and tiny.blocks[0].attn.head_dim == 32
    small = timm.create_model("diffvit_small_patch16_224", img_size=32)
    assert small.blocks[0].attn.num_heads == 3 and small.blocks[0].attn.head_dim == 64
    inits = [b.attn.lambda_init for b in small.blocks]
    assert inits[0] == pytest.approx(0.2) and inits == sorted(inits)
    const = timm.create_model("diffvit_nano_patch7_28", lambda_init=0.8)
    assert all(b.attn.lambda_init == 0.8 for b in const.blocks)


def test_names_do_not_collide_with_timm() -> None:
    for name in ALL:
        assert not name.startswith("vit_")
    assert set(ALL) <= set(timm.list_models("diffvit_*") + timm.list_models("softvit_*"))
    assert timm.list_models("vit_d*") == [n for n in timm.list_models("vit_d*") if n not in ALL]


def test_timm_features() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 1, 28, 28)
    m = timm.create_model("diffvit_nano_patch7_28", num_classes=0)
    assert m(x).shape == (2, m.num_features)
    feats = m.forward_features(x)
    assert feats.shape == (2, 1 + 16, 96)
    assert torch.equal(m.forward_head(feats, pre_logits=True), feats[:, 0])
    m.reset_classifier(5, global_pool="avg")
    assert m.get_classifier().out_features == 5 and m(x).shape == (2, 5)
    assert torch.allclose(m.forward_head(feats, pre_logits=True), feats[:, 1:].mean(1))
    m.reset_classifier(0, global_pool="")
    assert m(x).shape == (2, 17, 96)
    with pytest.raises(AssertionError, match="class token"):  # timm's own check
        timm.create_model("diffvit_nano_patch7_28", class_token=False)
    m = timm.create_model("diffvit_nano_patch7_28", class_token=False, global_pool="avg")
    assert m(x).shape == (2, 10)
    # img_size, drop_path_rate, pretrained_cfg
    m = timm.create_model("diffvit_tiny_patch16_224", img_size=64, drop_path_rate=0.2)
    assert m.pos_embed.shape == (1, 1 + 16, 192)
    assert m.blocks[-1].drop_path1.drop_prob == pytest.approx(0.2)
    assert isinstance(m.blocks[0].drop_path1, torch.nn.Identity)  # timm skips a zero-rate DropPath
    cfg = timm.data.resolve_data_config({}, model=timm.create_model("diffvit_nano_patch7_28"))
    assert cfg["input_size"] == (1, 28, 28) and cfg["mean"] == (0.1307,)
    assert timm.create_model("softvit_base_patch16_224", img_size=32).pretrained_cfg["num_classes"] == 1000
    # gradient checkpointing gives the same result
    m = timm.create_model("diffvit_nano_patch7_28").eval()
    ref = m(x)
    m.set_grad_checkpointing(True)
    assert torch.allclose(m(x), ref, atol=1e-6)


def test_safetensors_reload_through_timm(tmp_path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    m = timm.create_model("diffvit_nano_patch7_28", num_classes=4).eval()
    with torch.no_grad():  # move lambdas away from their init so a fresh model would differ
        for b in m.blocks:
            b.attn.lambda_q1.add_(0.3)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    torch.manual_seed(1)
    # num_classes goes into the overlay too: timm drops a classifier whose size differs from the cfg's.
    r = timm.create_model("diffvit_nano_patch7_28", num_classes=4, pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(path), num_classes=4)).eval()
    x = torch.randn(3, 1, 28, 28)
    assert torch.equal(m(x), r(x))
    # a different resolution resamples the position embeddings
    big = timm.create_model("diffvit_nano_patch7_28", num_classes=4, img_size=56, pretrained=True,
                            pretrained_cfg_overlay=dict(file=str(path), num_classes=4))
    assert big.pos_embed.shape == (1, 1 + 64, 96)
    assert torch.equal(big.pos_embed[:, 0], m.pos_embed[:, 0])


def test_import_registers_without_lightning() -> None:
    code = (
        "import sys, timm, diffzoo.models; m = timm.create_model('diffvit_small_patch16_224', img_size=32); "
        "assert 'lightning' not in sys.modules and 'lightning.pytorch' not in sys.modules, 'lightning imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_configs_are_consistent() -> None:
    assert set(VIT_CONFIGS) == {n.split("_", 1)[1] for n in ALL}
    with pytest.raises(ValueError, match="not a diffzoo ViT"):
        matched_name("vit_small_patch16_224")


def test_timm_vit_options_apply_to_the_differential_attention() -> None:
    torch.manual_seed(0)
    dyn = timm.create_model("diffvit_nano_patch7_28", dynamic_img_size=True).eval()
    assert dyn(torch.randn(1, 1, 35, 42)).shape == (1, 10)  # 5 x 6 patches, position embedding resampled
    torch.manual_seed(0)
    plain = timm.create_model("diffvit_nano_patch7_28")
    torch.manual_seed(0)
    fixed = timm.create_model("diffvit_nano_patch7_28", fix_init=True)  # rescales attn.proj per depth
    ratio = plain.blocks[3].attn.out_proj.weight / fixed.blocks[3].attn.out_proj.weight
    torch.testing.assert_close(ratio, torch.full_like(ratio, 8 ** 0.5))
    with pytest.raises(ValueError, match="qk_norm"):
        timm.create_model("diffvit_nano_patch7_28", qk_norm=True)
    with pytest.raises(ValueError, match="head_dim is derived"):
        timm.create_model("diffvit_nano_patch7_28", head_dim=8)
    with pytest.raises(ValueError, match="lambda_init=0.8 applies to differential V1 only, not to attn='softmax'"):
        timm.create_model("softvit_nano_patch7_28", lambda_init=0.8)
    with pytest.raises(ValueError, match="softmax baseline is timm's own"):
        timm.create_model("softvit_nano_patch7_28", backend="sdpa")
    v2 = timm.create_model("diffvit_nano_patch7_28", attn="diff_v2").eval()
    assert type(v2.blocks[0].attn).__name__ == "TimmDiffAttentionV2" and v2(torch.randn(2, 1, 28, 28)).shape == (2, 10)
