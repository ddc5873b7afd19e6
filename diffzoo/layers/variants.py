"""The study's named attention variants and the feed-forward matching of ``diff_v2_matched``.

The names and their settings are defined once, in :mod:`diffzoo.layers.spec` (:class:`AttnSpec`); this
module keeps the names the study code has used (``Variant``, ``VARIANTS``, ``get_variant``,
``variant_names``). A variant is never applied to a built model: pass its name (or spec) as ``attn`` to
any model family and the model is built as that variant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import nn

from .matched import count_parameters
from .spec import VARIANTS, AttnSpec, get_spec, spec_names

__all__ = ["VARIANTS", "Variant", "get_variant", "matched_mlp_ratio", "matched_width", "variant_names"]

Variant = AttnSpec
get_variant = get_spec
variant_names = spec_names


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


def matched_mlp_ratio(build: Callable[[AttnSpec, float], nn.Module], spec: AttnSpec, dim: int, mlp_ratio: float) -> float:
    """The ``mlp_ratio`` at which ``build(spec, ratio)`` has the parameter count of ``build(softmax, mlp_ratio)``.

    ``build(spec, ratio)`` builds the model family of width ``dim`` (feed-forward ``int(dim * ratio)``) with
    the attention ``spec``; it is called with ``spec`` less its ``match_params`` (and with the ``softmax``
    spec for the target), so a family calls this from its constructor without recursing.
    """
    target = count_parameters(build(get_spec("softmax"), mlp_ratio))
    unmatched = dataclasses.replace(spec, match_params=False)
    # Blocks size the MLP as int(dim * mlp_ratio); the half unit keeps float rounding from losing one.
    width = matched_width(lambda w: build(unmatched, (w + 0.5) / dim), round(mlp_ratio * dim), target)
    return (width + 0.5) / dim
