"""Differential Vision Transformers and their matched softmax baselines, registered with timm.

The architecture is timm's/DeiT's ViT (Dosovitskiy et al., arXiv 2010.11929; Touvron et al., arXiv
2012.12877) with every block built from :class:`diffzoo.layers.Block`, so the attention is either the
differential attention of Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258) or the
standard softmax attention it is compared with. The differential math lives only in
:mod:`diffzoo.layers`.

After ``import diffzoo`` the models are in timm's registry::

    import diffzoo, timm
    model = timm.create_model("diffvit_small_patch16_224", num_classes=100, drop_path_rate=0.1)
    baseline = timm.create_model("softvit_small_patch16_224", num_classes=100, drop_path_rate=0.1)

Names: ``diffvit_*`` (differential) and ``softvit_*`` (softmax baseline with identical dimensions;
parameter counts agree within 0.5 %). ``diffvit_*`` avoids timm's existing ``vit_d*`` names.

Weights saved as safetensors (or a Lightning checkpoint) reload through timm::

    timm.create_model("diffvit_nano_patch7_28", pretrained=True, num_classes=10,
                      pretrained_cfg_overlay=dict(file="outputs/.../model.safetensors", num_classes=10))
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, Optional, Union

import torch
from torch import Tensor, nn

from timm.layers import PatchEmbed, resample_abs_pos_embed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from ..layers import Block

__all__ = ["VisionTransformer", "checkpoint_filter_fn", "VIT_CONFIGS"]

GlobalPool = Literal["token", "avg", ""]


def vit_init_(model: nn.Module, pos_embed: Optional[nn.Parameter], cls_token: Optional[nn.Parameter]) -> None:
    """timm's ViT init in place: truncated normal (std 0.02) for every linear and the position
    embedding, zero biases, a near-zero class token. Other parameters keep their own init."""
    if pos_embed is not None:
        trunc_normal_(pos_embed, std=0.02)
    if cls_token is not None:
        nn.init.normal_(cls_token, std=1e-6)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class VisionTransformer(nn.Module):
    """A pre-norm ViT whose blocks use differential (``attn="diff"``) or softmax attention.

    Args:
        img_size: input resolution (square int or ``(H, W)``).
        patch_size: patch side in pixels.
        in_chans: input channels.
        num_classes: classifier outputs; 0 for no classifier (``forward`` returns pooled features).
        global_pool: ``"token"`` (class token), ``"avg"`` (mean of patch tokens) or ``""`` (no pooling).
        embed_dim: model width ``D``.
        depth: number of blocks.
        num_heads: heads of the *softmax baseline*; ``attn="diff"`` converts them (``2H -> H``
            differential heads of the same width), see :func:`diffzoo.layers.diff_heads_for_baseline`.
        attn: ``"diff"``, ``"softmax"`` or ``"diff_v2"``.
        head_dim: differential query/key width; required for an odd ``num_heads`` (ViT-Ti: 3 heads).
        mlp_ratio: feed-forward hidden width relative to ``embed_dim``.
        act_layer: activation of the feed-forward (GELU as in ViT; CLIP towers may use QuickGELU).
        qkv_bias: bias on the q/k/v projections (on in ViT, like timm).
        lambda_init: constant ``lambda_init``; None uses the paper's depth schedule.
        class_token: prepend a learnable class token.
        drop_rate: dropout before the classifier.
        pos_drop_rate: dropout after adding position embeddings.
        proj_drop_rate: dropout after attention and MLP projections.
        attn_drop_rate: dropout on the attention maps.
        drop_path_rate: stochastic depth, increased linearly over the blocks up to this value.
        layer_scale_init: initial LayerScale value, or None for none.
        norm_eps: LayerNorm epsilon.
        backend: attention kernel backend (None follows :mod:`diffzoo.kernels`' selection).
    """

    def __init__(
        self,
        img_size: Union[int, tuple[int, int]] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: GlobalPool = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        attn: Literal["diff", "softmax", "diff_v2"] = "diff",
        head_dim: Optional[int] = None,
        mlp_ratio: float = 4.0,
        act_layer: Callable[[], nn.Module] = nn.GELU,
        qkv_bias: bool = True,
        lambda_init: Optional[float] = None,
        class_token: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        layer_scale_init: Optional[float] = None,
        norm_eps: float = 1e-6,
        backend: Optional[str] = None,
    ) -> None:
        super().__init__()
        if global_pool not in ("token", "avg", ""):
            raise ValueError(f"global_pool={global_pool!r}; expected 'token', 'avg' or ''")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.attn_kind = attn
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_prefix_tokens, embed_dim))
        self.pos_drop = nn.Dropout(pos_drop_rate)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(*[
            Block(
                embed_dim, num_heads, attn=attn, head_dim=head_dim if attn == "diff" else None,
                mlp_ratio=mlp_ratio, act_layer=act_layer, depth=i, lambda_init=lambda_init, qkv_bias=qkv_bias,
                attn_drop=attn_drop_rate, proj_drop=proj_drop_rate, drop_path=dpr[i],
                layer_scale_init=layer_scale_init, norm_eps=norm_eps, backend=backend,
            )
            for i in range(depth)
        ])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    # -- initialisation ------------------------------------------------------------------------
    def init_weights(self) -> None:
        """timm's default ViT init: truncated normal (std 0.02) for linears and position embeddings.

        Differential-attention parameters (lambda vectors, per-head norms) keep the initialisation of
        :mod:`diffzoo.layers`.
        """
        vit_init_(self, self.pos_embed, self.cls_token)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names timm's optimizer factory excludes from weight decay."""
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups for timm's layer-wise learning-rate decay."""
        return dict(stem=r"^cls_token|pos_embed|patch_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in the backward pass to save memory."""
        self.grad_checkpointing = enable

    # -- classifier ----------------------------------------------------------------------------
    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[GlobalPool] = None) -> None:
        """Replace the classifier by a fresh one with ``num_classes`` outputs (0 removes it)."""
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise ValueError(f"global_pool={global_pool!r}; expected 'token', 'avg' or ''")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a class token")
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # -- forward -------------------------------------------------------------------------------
    def _pos_embed(self, x: Tensor) -> Tensor:
        """``(B, N, D)`` patch tokens -> ``(B, prefix + N, D)`` with class token and positions."""
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` images -> ``(B, prefix + N, D)`` normalised tokens."""
        x = self._pos_embed(self.patch_embed(x))  # (B, 1 + N, D)
        if self.grad_checkpointing and torch.is_grad_enabled():
            for blk in self.blocks:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def pool(self, x: Tensor) -> Tensor:
        """``(B, prefix + N, D)`` -> ``(B, D)`` (or unchanged when ``global_pool=""``)."""
        if self.global_pool == "token":
            return x[:, 0]
        if self.global_pool == "avg":
            return x[:, self.num_prefix_tokens:].mean(dim=1)
        return x

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """``(B, prefix + N, D)`` tokens -> ``(B, num_classes)`` logits (or pooled ``(B, D)`` features)."""
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` images -> ``(B, num_classes)`` logits."""
        return self.forward_head(self.forward_features(x))


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: VisionTransformer) -> dict[str, Tensor]:
    """Adapt a saved state dict to ``model``: unwrap Lightning checkpoints, resample position embeddings.

    Accepts a plain ``state_dict`` (safetensors or ``torch.save``), a dict with ``"state_dict"`` /
    ``"model"``, or a Lightning checkpoint of :class:`diffzoo.tasks.ImageClassificationTask` (keys under
    ``model.``; the ``ema.`` copy is dropped).
    """
    state_dict = state_dict.get("state_dict", state_dict.get("model", state_dict))
    if any(k.startswith("model.") for k in state_dict):
        state_dict = {k[len("model."):]: v for k, v in state_dict.items() if k.startswith("model.")}
    out = {}
    for k, v in state_dict.items():
        if k == "pos_embed" and v.shape != model.pos_embed.shape:
            old = int(math.sqrt(v.shape[1] - model.num_prefix_tokens))
            v = resample_abs_pos_embed(
                v, new_size=list(model.patch_embed.grid_size), old_size=[old, old],
                num_prefix_tokens=model.num_prefix_tokens,
            )
        out[k] = v
    return out


def _cfg(**kwargs: Any) -> dict[str, Any]:
    """timm pretrained config: preprocessing of ImageNet-1k models (DeiT's mean/std, bicubic)."""
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        **kwargs,
    }


_MNIST = dict(num_classes=10, input_size=(1, 28, 28), crop_pct=1.0, interpolation="bilinear", mean=(0.1307,), std=(0.3081,))
_CIFAR = dict(num_classes=10, input_size=(3, 32, 32), crop_pct=1.0, interpolation="bilinear",
              mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))

# Architecture of every registered size; the ``diffvit_`` and ``softvit_`` models differ only in ``attn``.
VIT_CONFIGS: dict[str, dict[str, Any]] = {
    # The embedded default (28x28 grey digits): 16 patches + class token, about 0.3 M parameters,
    # small enough to train in a few minutes on 2 CPU cores.
    "nano_patch7_28": dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=96, depth=4,
                           num_heads=4, mlp_ratio=2.0),
    # CIFAR-sized inputs with ViT-Ti dimensions (3 baseline heads -> 3 half-width differential heads).
    "tiny_patch4_32": dict(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=12, num_heads=3,
                           head_dim=32),
    "tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, head_dim=32),
    "small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}

_PRETRAINED = {
    "nano_patch7_28": _cfg(**_MNIST),
    "tiny_patch4_32": _cfg(**_CIFAR),
    "tiny_patch16_224": _cfg(),
    "small_patch16_224": _cfg(),
    "base_patch16_224": _cfg(),
}

default_cfgs = generate_default_cfgs(
    {f"{prefix}_{size}": cfg for size, cfg in _PRETRAINED.items() for prefix in ("diffvit", "softvit")}
)


def _create(variant: str, pretrained: bool, **kwargs: Any) -> VisionTransformer:
    prefix, size = variant.split("_", 1)
    arch = dict(VIT_CONFIGS[size], attn="diff" if prefix == "diffvit" else "softmax")
    if arch["attn"] == "softmax":
        arch.pop("head_dim", None)
    arch.update(kwargs)
    return build_model_with_cfg(
        VisionTransformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn, **arch
    )


# -- differential ---------------------------------------------------------------------------------
@register_model
def diffvit_nano_patch7_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT for 28x28 single-channel digits (D=96, 4 blocks, 2 differential heads of width 24)."""
    return _create("diffvit_nano_patch7_28", pretrained, **kwargs)


@register_model
def diffvit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-Ti for 32x32 images (D=192, 12 blocks, 3 differential heads of width 32)."""
    return _create("diffvit_tiny_patch4_32", pretrained, **kwargs)


@register_model
def diffvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-Ti/16 (D=192, 12 blocks, 3 differential heads of width 32)."""
    return _create("diffvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def diffvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-S/16 (D=384, 12 blocks, 3 differential heads of width 64)."""
    return _create("diffvit_small_patch16_224", pretrained, **kwargs)


@register_model
def diffvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-B/16 (D=768, 12 blocks, 6 differential heads of width 64)."""
    return _create("diffvit_base_patch16_224", pretrained, **kwargs)


# -- softmax baselines ----------------------------------------------------------------------------
@register_model
def softvit_nano_patch7_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax baseline of :func:`diffvit_nano_patch7_28` (4 heads of width 24)."""
    return _create("softvit_nano_patch7_28", pretrained, **kwargs)


@register_model
def softvit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax baseline of :func:`diffvit_tiny_patch4_32` (3 heads of width 64)."""
    return _create("softvit_tiny_patch4_32", pretrained, **kwargs)


@register_model
def softvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-Ti/16 (DeiT-Ti dimensions), baseline of :func:`diffvit_tiny_patch16_224`."""
    return _create("softvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def softvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-S/16 (DeiT-S dimensions), baseline of :func:`diffvit_small_patch16_224`."""
    return _create("softvit_small_patch16_224", pretrained, **kwargs)


@register_model
def softvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-B/16 (DeiT-B dimensions), baseline of :func:`diffvit_base_patch16_224`."""
    return _create("softvit_base_patch16_224", pretrained, **kwargs)


def model_names(prefix: Optional[str] = None) -> list[str]:
    """Registered diffzoo ViT names, optionally only ``"diffvit"`` or ``"softvit"``."""
    prefixes = (prefix,) if prefix else ("diffvit", "softvit")
    return [f"{p}_{size}" for p in prefixes for size in VIT_CONFIGS]


def matched_name(name: str) -> str:
    """The matched partner of a registered name: ``diffvit_x`` <-> ``softvit_x``."""
    prefix, size = name.split("_", 1)
    if size not in VIT_CONFIGS or prefix not in ("diffvit", "softvit"):
        raise ValueError(f"{name!r} is not a diffzoo ViT; expected one of {model_names()}")
    return f"{'softvit' if prefix == 'diffvit' else 'diffvit'}_{size}"

