"""Build the causal LM or a registered ViT as one of the named attention specs of
:mod:`diffzoo.layers.spec` (``softmax``, ``softmax_wide``, ``diff``, ``diff_nonorm``, ``diff_const``,
``diff_v2``, ``diff_v2_matched``).

    from diffzoo.models.variants import build_lm, build_vit

    lm = build_lm("diff_v2_matched", LMConfig(dim=64, depth=2, baseline_heads=4, vocab_size=128))
    vit = build_vit("softmax_wide", "nano_patch7_28", img_size=64, patch_size=8)

Both are the families' own constructors with ``attn`` set: ``CausalLM(config.replace(attn=name))`` and
``timm.create_model(f"diffvit_{size}", attn=name, ...)``. The model is built as the attention spec (nothing is
changed on it afterwards); ``diff_v2_matched`` narrows the feed-forward (the LM's SwiGLU width, the ViT's
``mlp_ratio``) until the whole model has the parameter count of the ``softmax`` model of the same shape
(within one feed-forward unit per block).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..layers.spec import AttnSpec, get_spec
from .lm import CausalLM, LMConfig

__all__ = ["build_lm", "build_vit", "lm_config", "vit_create_args"]


def lm_config(variant: str | AttnSpec, config: LMConfig) -> LMConfig:
    """``config`` (the softmax baseline's shape) with ``attn`` set to ``variant``."""
    return config.replace(attn=get_spec(variant).name)


def build_lm(variant: str | AttnSpec, config: LMConfig) -> CausalLM:
    """A :class:`CausalLM` of ``config``'s shape as ``variant``."""
    return CausalLM(lm_config(variant, config))


def vit_create_args(variant: str | AttnSpec, size: str = "nano_patch7_28", **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """``(timm name, create_model kwargs)`` for ``variant`` of the registered ``diffvit_/softvit_<size>``
    models; ``kwargs`` are the task's own arguments (``img_size``, ``patch_size``, ``num_classes`` ...).
    The kwargs carry the attention spec's name as ``attn``, so the pair rebuilds the same model."""
    import diffzoo.models  # noqa: F401  (registers the ViTs)

    from .vit import VIT_CONFIGS

    spec = get_spec(variant)
    if size not in VIT_CONFIGS:
        raise ValueError(f"unknown ViT size {size!r}; choose one of {', '.join(VIT_CONFIGS)}")
    return f"{'diffvit' if spec.differential else 'softvit'}_{size}", {**kwargs, "attn": spec.name}


def build_vit(variant: str | AttnSpec, size: str = "nano_patch7_28", **kwargs: Any) -> nn.Module:
    """``timm.create_model`` of ``variant`` at ``size`` with ``kwargs``."""
    import timm

    name, args = vit_create_args(variant, size, **kwargs)
    return timm.create_model(name, **args)
