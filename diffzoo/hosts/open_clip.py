"""diffzoo inside open_clip: ``nn.MultiheadAttention``'s call over diffzoo's layers, what open_clip's
``ResidualAttentionBlock`` calls (:func:`diffzoo.weights.convert.convert_open_clip` swaps these in), and the wrap of
open_clip's tower builders that lets its factory build diffzoo towers (:func:`install_tower_builders`). The
DiffCLIP towers themselves are in :mod:`diffzoo.models.clip`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..layers import DiffAttention, DiffAttentionV2, diff_heads_for_baseline

__all__ = ["OpenClipDiffAttention", "OpenClipDiffAttentionV2", "install_tower_builders"]


class _MhaCall:
    """``nn.MultiheadAttention``'s call ``(query, key, value, key_padding_mask, need_weights, attn_mask)``
    over a diffzoo attention layer: what open_clip's ``ResidualAttentionBlock`` calls.

    Self-attention only (``key`` and ``value`` must be ``query``). Masks follow PyTorch's convention
    (bool True = masked out, or additive float; ``(L, S)`` or ``(B * num_heads, L, S)`` with the same
    mask for every head). Returns ``(output, None)``.
    """

    def __init__(self, dim: int, num_heads: int, *, batch_first: bool = True, **kwargs: Any) -> None:
        self._build(dim, num_heads, **kwargs)
        self.batch_first = batch_first
        self.source_heads = num_heads

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, None]:
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError(f"{type(self).__name__} converts self-attention only; key and value must be the query")
        x = query if self.batch_first else query.transpose(0, 1)
        mask = None
        if attn_mask is not None:
            mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(x.dtype)
            if mask.dim() == 3:
                per_head = mask.reshape(x.shape[0], self.source_heads, *mask.shape[1:])
                if not bool((per_head == per_head[:, :1]).all()):
                    raise ValueError("attn_mask differs between heads; differential heads need one mask per sample")
                mask = per_head[:, :1]
        causal = bool(is_causal and attn_mask is None)
        out = super().forward(x, key_padding_mask=key_padding_mask, attn_mask=mask, causal=causal)
        return (out if self.batch_first else out.transpose(0, 1)), None


class OpenClipDiffAttentionV2(_MhaCall, DiffAttentionV2):
    """:class:`DiffAttentionV2` behind ``nn.MultiheadAttention``'s call (``num_heads`` = the source's)."""

    def _build(self, dim: int, num_heads: int, **kwargs: Any) -> None:
        DiffAttentionV2.__init__(self, dim, num_heads, **kwargs)


class OpenClipDiffAttention(_MhaCall, DiffAttention):
    """:class:`DiffAttention` (V1) behind ``nn.MultiheadAttention``'s call, in the paper's head layout
    for an even source head count and half-width heads for an odd one."""

    def _build(self, dim: int, num_heads: int, **kwargs: Any) -> None:
        head_dim = None if num_heads % 2 == 0 else dim // (2 * num_heads)
        h, hkv, d = diff_heads_for_baseline(dim, num_heads, head_dim=head_dim)
        DiffAttention.__init__(self, dim, h, hkv, d, **kwargs)


# -- open_clip's factory --------------------------------------------------------------------------
def _wants_diffzoo(cfg: Any) -> bool:
    return isinstance(cfg, dict) and "diffzoo" in cfg


def _wrap(original: Callable, builder: Callable) -> Callable:
    @functools.wraps(original)
    def build(embed_dim, cfg, quick_gelu=False, cast_dtype=None):
        if _wants_diffzoo(cfg):
            return builder(embed_dim, cfg, quick_gelu, cast_dtype)
        return original(embed_dim, cfg, quick_gelu, cast_dtype)

    build._diffzoo_hook = True  # type: ignore[attr-defined]
    return build


def install_tower_builders(vision: Callable, text: Callable) -> None:
    """Wrap ``open_clip.model._build_vision_tower`` / ``_build_text_tower`` once (idempotent; the wrappers are
    marked ``_diffzoo_hook``), the functions open_clip's ``CLIP`` / ``CustomTextCLIP`` build their towers with:
    a tower config (dict) with a ``"diffzoo"`` entry goes to ``vision(embed_dim, cfg, quick_gelu, cast_dtype)``
    / ``text(...)``, every other config to open_clip's function unchanged."""
    import open_clip.model as oc_model

    for name, builder in (("_build_vision_tower", vision), ("_build_text_tower", text)):
        current = getattr(oc_model, name)
        if not getattr(current, "_diffzoo_hook", False):
            setattr(oc_model, name, _wrap(current, builder))
