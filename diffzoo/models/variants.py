"""Build the causal LM or a registered ViT as one of the named attention variants of
:mod:`diffzoo.layers.variants` (``softmax``, ``softmax_wide``, ``diff``, ``diff_nonorm``, ``diff_const``,
``diff_v2``, ``diff_v2_matched``).

    from diffzoo.models.variants import build_lm, build_vit

    lm = build_lm("diff_v2_matched", LMConfig(dim=64, depth=2, baseline_heads=4, vocab_size=128))
    vit = build_vit("softmax_wide", "nano_patch7_28", img_size=64, patch_size=8)

``diff_v2_matched`` keeps V2's attention and narrows the feed-forward (the LM's SwiGLU
``intermediate_size``, the ViT's ``mlp_ratio``) until the whole model has the parameter count of the
``softmax`` model of the same shape (within one feed-forward unit per block).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..layers.variants import Variant, apply_variant, get_variant, matched_width
from .lm import CausalLM, LMConfig

__all__ = ["build_lm", "build_vit", "lm_config", "vit_create_args"]


def lm_config(variant: str | Variant, config: LMConfig) -> LMConfig:
    """``config`` (the softmax baseline's shape) changed to build ``variant``."""
    v = get_variant(variant)
    changes: dict[str, Any] = {"attn": v.attn}
    if v.head_scale != 1.0:
        heads, kv = int(config.baseline_heads * v.head_scale), int(config.baseline_kv_heads * v.head_scale)
        if heads < 1 or kv < 1 or config.baseline_heads * v.head_scale != heads:
            raise ValueError(
                f"variant {v.name!r} needs baseline_heads={config.baseline_heads} divisible by {1 / v.head_scale:g}"
            )
        changes.update(baseline_heads=heads, baseline_kv_heads=kv)
    if v.lambda_init is not None:
        changes["lambda_init"] = v.lambda_init
    if v.match_params:
        target = sum(p.numel() for p in CausalLM(config.replace(attn="softmax")).parameters())
        cfg = config.replace(**changes)
        changes["intermediate_size"] = matched_width(
            lambda w: CausalLM(cfg.replace(intermediate_size=w)), cfg.intermediate_size, target)
    return config.replace(**changes)


def build_lm(variant: str | Variant, config: LMConfig) -> CausalLM:
    """A :class:`CausalLM` of ``config``'s shape as ``variant``."""
    model = CausalLM(lm_config(variant, config))
    apply_variant(model, variant)
    return model


def _base_heads(size: str, **kwargs: Any) -> tuple[int, int]:
    """``(num_heads, embed_dim)`` of the softmax ViT of ``size`` (read from a built model)."""
    import timm

    model = timm.create_model(f"softvit_{size}", **kwargs)  # timm's ViT with timm's Attention
    return int(model.blocks[0].attn.num_heads), int(model.embed_dim)


def vit_create_args(variant: str | Variant, size: str = "nano_patch7_28", **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """``(timm name, create_model kwargs)`` for ``variant`` of the registered ``diffvit_/softvit_<size>``
    models; ``kwargs`` are the task's own arguments (``img_size``, ``patch_size``, ``num_classes`` ...)."""
    import timm

    import diffzoo.models  # noqa: F401  (registers the ViTs)

    v = get_variant(variant)
    name = f"{'softvit' if v.attn == 'softmax' else 'diffvit'}_{size}"
    args = dict(kwargs)
    if v.attn == "diff_v2":
        args["attn"] = "diff_v2"
    if v.head_scale != 1.0:
        heads, _ = _base_heads(size, **kwargs)
        if heads * v.head_scale != int(heads * v.head_scale):
            raise ValueError(f"variant {v.name!r} needs the {heads} heads of {size!r} divisible by {1 / v.head_scale:g}")
        args["num_heads"] = int(heads * v.head_scale)
    if v.lambda_init is not None:
        args["lambda_init"] = v.lambda_init
    if v.match_params:
        from ..layers import count_parameters

        target = count_parameters(timm.create_model(f"softvit_{size}", **kwargs))
        _, dim = _base_heads(size, **kwargs)
        ratio = float(args.get("mlp_ratio", timm.create_model(name, **args).blocks[0].mlp.fc1.out_features / dim))
        # Block sizes the MLP as int(dim * mlp_ratio); the half unit keeps float rounding from losing one.
        width = matched_width(lambda w: timm.create_model(name, **{**args, "mlp_ratio": (w + 0.5) / dim}),
                              round(ratio * dim), target)
        args["mlp_ratio"] = (width + 0.5) / dim
    return name, args


def build_vit(variant: str | Variant, size: str = "nano_patch7_28", **kwargs: Any) -> nn.Module:
    """``timm.create_model`` of ``variant`` at ``size`` with ``kwargs``, variant options applied."""
    import timm

    name, args = vit_create_args(variant, size, **kwargs)
    model = timm.create_model(name, **args)
    apply_variant(model, variant)
    return model
