"""Differential Vision Transformers and their matched softmax baselines, registered with timm.

Every model is timm's own :class:`timm.models.vision_transformer.VisionTransformer` (Dosovitskiy et al.,
arXiv 2010.11929; Touvron et al., arXiv 2012.12877). The differential models pass diffzoo's attention
into it through timm's ``attn_layer=`` argument: :class:`TimmDiffAttention` is
:class:`diffzoo.layers.DiffAttention` (Ye et al., "Differential Transformer", ICLR 2025, arXiv
2410.05258) behind timm's attention constructor and ``forward``, and :class:`TimmDiffAttentionV2` does
the same for :class:`diffzoo.layers.DiffAttentionV2`. The softmax baselines are timm's ViT with timm's
own ``Attention``, i.e. timm's ``vit_*`` at the same size. So timm's whole ViT API applies to both:
``forward_features`` / ``forward_head``, ``forward_intermediates``, ``features_only=True``,
``prune_intermediate_layers``, ``dynamic_img_size``, ``global_pool`` (``token``, ``avg``, ``map``, ...),
``set_grad_checkpointing``, FX feature extraction, TorchScript and timm's checkpoint key names.

After ``import diffzoo`` the models are in timm's registry::

    import diffzoo, timm
    model = timm.create_model("diffvit_small_patch16_224", num_classes=100, drop_path_rate=0.1)
    baseline = timm.create_model("softvit_small_patch16_224", num_classes=100, drop_path_rate=0.1)

Names: ``diffvit_*`` (differential) and ``softvit_*`` (softmax baseline with identical dimensions;
parameter counts agree within 0.5 %). ``diffvit_*`` avoids timm's existing ``vit_d*`` names. Extra
keyword arguments of the registered builders: ``attn`` (an attention spec or its name: ``"diff"``,
``"diff_v2"``, ``"softmax"`` or a study variant such as ``"diff_nonorm"``, see :mod:`diffzoo.layers.spec`;
the name's prefix only gives the default), ``lambda_init`` (a constant instead of the attention spec's rule) and
``backend`` (diffzoo kernel backend); every other keyword goes to timm's ``VisionTransformer``.

Head layout: ``num_heads`` is always the *softmax baseline's* head count. Differential V1 turns an even
count ``2H`` into ``H`` differential heads of the same width (``dim / 2H`` per query/key branch, value
width ``dim / H``), so every projection has the baseline's shape; an odd count keeps its heads and halves
their width (timm's ``DiffAttention`` convention), see :func:`diffzoo.layers.diff_heads_for_baseline`.

Weights saved as safetensors (or a Lightning checkpoint) reload through timm, also those written by
earlier diffzoo versions whose softmax layers had separate q/k/v projections (:func:`checkpoint_filter_fn`)::

    timm.create_model("diffvit_nano_patch7_28", pretrained=True, num_classes=10,
                      pretrained_cfg_overlay=dict(file="outputs/.../model.safetensors", num_classes=10))
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer import checkpoint_filter_fn as _timm_checkpoint_filter_fn
from torch import Tensor, nn

from ..hosts.timm import (
    TimmDiffAttention,
    TimmDiffAttentionV2,
    attention_layer,
    building_model,
    diff_head_layout,
)
from ..layers.spec import AttnSpec, get_spec
from ..layers.variants import matched_mlp_ratio

__all__ = [
    "TimmDiffAttention",
    "TimmDiffAttentionV2",
    "VIT_CONFIGS",
    "VisionTransformer",
    "attention_layer",
    "checkpoint_filter_fn",
    "diff_head_layout",
    "vision_transformer",
]


def vit_init_(model: nn.Module, pos_embed: nn.Parameter | None, cls_token: nn.Parameter | None) -> None:
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


def vision_transformer(
    attn: str | AttnSpec = "diff", *, lambda_init: float | None = None, backend: str | None = None, **kwargs: Any
) -> VisionTransformer:
    """timm's ``VisionTransformer`` with the attention of the attention spec ``attn``.

    Args:
        attn: an attention spec or its name (:mod:`diffzoo.layers.spec`): ``"diff"`` (V1), ``"diff_v2"``,
            ``"softmax"`` (timm's ``Attention``: timm's ViT as is) or a study variant. The attention spec's head
            layout scales ``num_heads``; a parameter-matched spec narrows ``mlp_ratio`` until the model has
            the softmax ViT's parameter count. The attention spec is kept as ``model.attn_spec``.
        lambda_init: constant ``lambda_init`` of V1 layers (replaces the attention spec's rule).
        backend: diffzoo kernel backend of the differential layers.
        kwargs: timm ``VisionTransformer`` arguments (``num_heads`` and ``mlp_ratio`` are the softmax
            baseline's).
    """
    spec = get_spec(attn, lambda_init)
    if spec.kind == "softmax" and backend is not None:
        raise ValueError(
            "backend configures differential attention; the softmax baseline is timm's own Attention "
            "(drop it, or use attn='diff')"
        )
    if spec.head_scale != 1.0:
        kwargs["num_heads"] = spec.scale_heads(int(kwargs.get("num_heads", 12)))
    if spec.match_params:
        kwargs["mlp_ratio"] = matched_mlp_ratio(
            lambda s, r: vision_transformer(s, **{**kwargs, "mlp_ratio": r}), spec, int(kwargs.get("embed_dim", 768)),
            float(kwargs.get("mlp_ratio", 4.0)))
    with building_model(spec, backend):
        model = VisionTransformer(attn_layer=attention_layer(spec), **kwargs)
    model.attn_spec = spec
    return model


# -- checkpoints ----------------------------------------------------------------------------------
_OLD_SOFTMAX = re.compile(r"^(.*\.attn)\.(q_proj|k_proj|v_proj|out_proj)\.(weight|bias)$")


def _fuse_old_softmax_attention(state_dict: dict[str, Tensor], own: set[str]) -> dict[str, Tensor]:
    """Earlier diffzoo softmax layers kept q/k/v/out projections apart; timm fuses q/k/v into ``qkv``."""
    out: dict[str, Tensor] = {}
    parts: dict[tuple[str, str], dict[str, Tensor]] = {}
    for key, value in state_dict.items():
        m = _OLD_SOFTMAX.match(key)
        if m is None or f"{m.group(1)}.qkv.weight" not in own:
            out[key] = value
            continue
        prefix, proj, kind = m.groups()
        if proj == "out_proj":
            out[f"{prefix}.proj.{kind}"] = value
        else:
            parts.setdefault((prefix, kind), {})[proj] = value
    for (prefix, kind), qkv in parts.items():
        missing = {"q_proj", "k_proj", "v_proj"} - set(qkv)
        if missing:
            raise ValueError(f"the checkpoint has {sorted(qkv)} of {prefix} but not {sorted(missing)}")
        out[f"{prefix}.qkv.{kind}"] = torch.cat([qkv["q_proj"], qkv["k_proj"], qkv["v_proj"]], dim=0)
    return out


def checkpoint_filter_fn(state_dict: dict[str, Any], model: VisionTransformer) -> dict[str, Tensor]:
    """Adapt a saved state dict to ``model``.

    Accepts a plain ``state_dict`` (safetensors or ``torch.save``), a dict with ``"state_dict"`` /
    ``"model"``, or a Lightning checkpoint of :class:`diffzoo.tasks.ImageClassificationTask` (keys under
    ``model.``; the ``ema.`` copy is dropped). Softmax layers saved by earlier diffzoo versions
    (``attn.{q,k,v,out}_proj``) become timm's ``attn.qkv`` / ``attn.proj``; then timm's own filter
    resamples position and patch embeddings and converts timm-known foreign layouts.
    """
    state_dict = state_dict.get("state_dict", state_dict.get("model", state_dict))
    if any(k.startswith("model.") for k in state_dict):
        state_dict = {k[len("model."):]: v for k, v in state_dict.items() if k.startswith("model.")}
    state_dict = _fuse_old_softmax_attention(dict(state_dict), set(model.state_dict()))
    return _timm_checkpoint_filter_fn(state_dict, model)


# -- registry ---------------------------------------------------------------------------------------
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

# Architecture of every registered size (timm ``VisionTransformer`` arguments); ``diffvit_`` and
# ``softvit_`` differ only in the attention layer.
VIT_CONFIGS: dict[str, dict[str, Any]] = {
    # The embedded default (28x28 grey digits): 16 patches + class token, about 0.3 M parameters,
    # small enough to train in a few minutes on 2 CPU cores.
    "nano_patch7_28": dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=96, depth=4,
                           num_heads=4, mlp_ratio=2.0),
    # CIFAR-sized inputs with ViT-Ti dimensions (3 baseline heads -> 3 half-width differential heads).
    "tiny_patch4_32": dict(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=12, num_heads=3),
    "tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
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

# Argument names of earlier diffzoo ViTs, mapped onto timm's.
_RENAMED = {"layer_scale_init": "init_values"}


def _create(variant: str, pretrained: bool, **kwargs: Any) -> VisionTransformer:
    prefix, size = variant.split("_", 1)
    kwargs.setdefault("attn", "diff" if prefix == "diffvit" else "softmax")
    if "head_dim" in kwargs:
        raise ValueError(
            "head_dim is derived from num_heads (the softmax baseline's heads); pass num_heads and embed_dim instead"
        )
    for old, new in _RENAMED.items():
        if old in kwargs:
            kwargs[new] = kwargs.pop(old)
    if "norm_eps" in kwargs:
        kwargs["norm_layer"] = partial(LayerNorm, eps=kwargs.pop("norm_eps"))
    out_indices = kwargs.pop("out_indices", 3)
    arch = {**VIT_CONFIGS[size], **kwargs}
    # features_only=True wraps the model as timm's vit_* are wrapped: FeatureGetterNet over forward_intermediates
    return build_model_with_cfg(
        vision_transformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **arch,
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
    """Softmax ViT-Ti/16 (timm's ``vit_tiny_patch16_224``), baseline of :func:`diffvit_tiny_patch16_224`."""
    return _create("softvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def softvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-S/16 (timm's ``vit_small_patch16_224``), baseline of :func:`diffvit_small_patch16_224`."""
    return _create("softvit_small_patch16_224", pretrained, **kwargs)


@register_model
def softvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-B/16 (timm's ``vit_base_patch16_224``), baseline of :func:`diffvit_base_patch16_224`."""
    return _create("softvit_base_patch16_224", pretrained, **kwargs)


def model_names(prefix: str | None = None) -> list[str]:
    """Registered diffzoo ViT names, optionally only ``"diffvit"`` or ``"softvit"``."""
    prefixes = (prefix,) if prefix else ("diffvit", "softvit")
    return [f"{p}_{size}" for p in prefixes for size in VIT_CONFIGS]


def matched_name(name: str) -> str:
    """The matched partner of a registered name: ``diffvit_x`` <-> ``softvit_x``."""
    prefix, size = name.split("_", 1)
    if size not in VIT_CONFIGS or prefix not in ("diffvit", "softvit"):
        raise ValueError(f"{name!r} is not a diffzoo ViT; expected one of {model_names()}")
    return f"{'softvit' if prefix == 'diffvit' else 'diffvit'}_{size}"
