"""The ViTs are timm's ViT: weights copy from timm's vit_*, and checkpoints of the earlier diffzoo ViT still load."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

import diffzoo.models  # noqa: F401  (registers the models)
from diffzoo.layers import Block
from diffzoo.models.vit import checkpoint_filter_fn, vit_init_


class LegacyVisionTransformer(nn.Module):
    """The ViT diffzoo shipped before it moved onto timm's class (its layout and forward, trimmed to
    what a checkpoint records): patch embedding, class token, position embedding, diffzoo Blocks with
    separate q/k/v/out projections, final LayerNorm, linear head on the class token."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, num_classes: int, embed_dim: int, depth: int,
                 num_heads: int, mlp_ratio: float, attn: str) -> None:
        super().__init__()
        self.patch_embed = timm.layers.PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                                  embed_dim=embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, attn=attn, mlp_ratio=mlp_ratio, depth=i, qkv_bias=True, norm_eps=1e-6)
            for i in range(depth)
        ])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)
        vit_init_(self, self.pos_embed, self.cls_token)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


NANO = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0)


def _legacy(attn: str) -> LegacyVisionTransformer:
    torch.manual_seed(0)
    old = LegacyVisionTransformer(**NANO, attn=attn).eval()
    with torch.no_grad():  # trained-looking weights: lambdas and norms away from their init
        for name, p in old.named_parameters():
            if "lambda" in name or "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return old


@pytest.mark.parametrize("attn, name", [("diff", "diffvit_nano_patch7_28"), ("softmax", "softvit_nano_patch7_28")])
def test_legacy_checkpoints_load_with_identical_outputs(attn: str, name: str, tmp_path) -> None:
    from safetensors.torch import save_file

    old = _legacy(attn)
    sd = old.state_dict()
    if attn == "softmax":
        assert "blocks.0.attn.q_proj.weight" in sd  # the layout timm's fused qkv replaces
    x = torch.randn(3, 1, 28, 28)
    expected = old(x)

    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    new = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()
    torch.testing.assert_close(new(x), expected, rtol=1e-5, atol=1e-6)

    # a Lightning checkpoint of ImageClassificationTask: weights under "model.", an EMA copy beside them
    lightning = {"state_dict": {**{f"model.{k}": v for k, v in sd.items()}, **{f"ema.module.{k}": v for k, v in sd.items()}}}
    fresh = timm.create_model(name).eval()
    fresh.load_state_dict(checkpoint_filter_fn(lightning, fresh), strict=True)
    torch.testing.assert_close(fresh(x), expected, rtol=1e-5, atol=1e-6)


def test_legacy_softmax_checkpoint_with_a_missing_projection_is_refused() -> None:
    sd = _legacy("softmax").state_dict()
    del sd["blocks.1.attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"blocks\.1\.attn.*k_proj"):
        checkpoint_filter_fn(sd, timm.create_model("softvit_nano_patch7_28"))


def test_softvit_is_timm_vit_by_weight_copy() -> None:
    torch.manual_seed(0)
    theirs = timm.create_model("vit_small_patch16_224", img_size=32).eval()
    ours = timm.create_model("softvit_small_patch16_224", img_size=32).eval()
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(ours(x), theirs(x))


def test_diffvit_parameters_match_softvit_within_half_a_percent() -> None:
    with torch.device("meta"):
        for size in ("nano_patch7_28", "tiny_patch4_32", "small_patch16_224", "base_patch16_224"):
            diff, soft = timm.create_model(f"diffvit_{size}"), timm.create_model(f"softvit_{size}")
            n_diff, n_soft = (sum(p.numel() for p in m.parameters()) for m in (diff, soft))
            assert 0 < (n_diff - n_soft) / n_soft < 0.005, size
