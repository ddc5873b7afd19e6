"""Named attention variants of the study, in one place: the softmax baseline, differential V1 and V2,
and the ablations. Every study recipe accepts these names (``--model.attn NAME``).

=================== ===========================================================================
name                layer settings
=================== ===========================================================================
``softmax``         softmax attention with the baseline's ``H`` heads of width ``d``
``softmax_wide``    softmax attention with ``H/2`` heads of width ``2d`` (same projections): separates
                    "fewer, wider heads" from "differential"
``diff``            differential attention V1 (the paper): ``H/2`` heads of two q/k pairs, per-head
                    RMSNorm and ``(1 - lambda_init)`` scale, ``lambda_init`` by depth
``diff_nonorm``     V1 without the per-head RMSNorm and without the ``(1 - lambda_init)`` scale
``diff_const``      V1 with a constant ``lambda_init = 0.8`` instead of the depth schedule
``diff_v2``         differential attention V2 (``2H`` query heads, a lambda per token and head)
``diff_v2_matched`` V2 with the feed-forward narrowed until the model has the softmax baseline's
                    parameter count (V2's extra query heads and lambda projection otherwise add
                    ``D^2 + D H + H`` parameters per block, ~8 % of a block with a 4x MLP)
=================== ===========================================================================

A variant is applied in two steps: the model is built with ``attn`` (and, for ``softmax_wide`` and
``diff_v2_matched``, changed head count / feed-forward width, see :mod:`diffzoo.models.variants`), then
:func:`apply_variant` sets the per-layer options on the built differential layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .diff_attention import DiffAttention
from .matched import count_parameters

__all__ = ["VARIANTS", "Variant", "apply_variant", "get_variant", "matched_width", "variant_names"]


@dataclass(frozen=True)
class Variant:
    """Layer settings of one named attention variant."""

    name: str
    attn: str  # the layer kind built: "softmax", "diff" or "diff_v2"
    description: str
    lambda_init: float | None = None  # constant lambda_init of V1 layers; None = the depth schedule
    sub_norm: bool = True  # V1's per-head RMSNorm and (1 - lambda_init) scale
    head_scale: float = 1.0  # multiplies the baseline's head count (head width scales inversely)
    match_params: bool = False  # narrow the feed-forward to the softmax model's parameter count

    @property
    def differential(self) -> bool:
        return self.attn != "softmax"


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("softmax", "softmax", "softmax attention, H heads of width d"),
    Variant("softmax_wide", "softmax", "softmax attention, H/2 heads of width 2d", head_scale=0.5),
    Variant("diff", "diff", "differential V1 (per-head norm, lambda_init by depth)"),
    Variant("diff_nonorm", "diff", "V1 without the per-head norm and the (1 - lambda_init) scale", sub_norm=False),
    Variant("diff_const", "diff", "V1 with constant lambda_init 0.8", lambda_init=0.8),
    Variant("diff_v2", "diff_v2", "differential V2 (lambda per token and head)"),
    Variant("diff_v2_matched", "diff_v2", "V2 with a narrower feed-forward, parameter-matched to softmax",
            match_params=True),
)}


def variant_names() -> list[str]:
    return list(VARIANTS)


def get_variant(name: str | Variant) -> Variant:
    """The :class:`Variant` called ``name``; a one-line error lists the known names."""
    if isinstance(name, Variant):
        return name
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; choose one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


def apply_variant(model: nn.Module, variant: str | Variant) -> int:
    """Set ``variant``'s per-layer options on every :class:`DiffAttention` of a built ``model``
    (constant ``lambda_init``; no per-head norm). Returns the number of layers changed."""
    v = get_variant(variant)
    changed = 0
    for module in model.modules():
        if not isinstance(module, DiffAttention):
            continue
        if v.lambda_init is not None:
            module.lambda_init = float(v.lambda_init)
        if not v.sub_norm:
            module.sub_norm = nn.Identity()
        changed += int(v.lambda_init is not None or not v.sub_norm)
    return changed


def matched_width(build: Callable[[int], nn.Module], width: int, target: int, step: int = 8) -> int:
    """The feed-forward width ``w`` whose model ``build(w)`` has the parameter count closest to ``target``.

    Parameters grow linearly with the width, so two builds give the slope; ``width`` is the starting
    width (e.g. the baseline's), ``step`` the distance of the second build.
    """
    p0 = count_parameters(build(width))
    p1 = count_parameters(build(width - step))
    slope = (p0 - p1) / step
    if slope <= 0:
        raise ValueError(f"the parameter count does not grow with the feed-forward width (slope {slope})")
    best = width - round((p0 - target) / slope)
    if best < 1:
        raise ValueError(f"no feed-forward width matches {target:,} parameters (would need {best})")
    return best
