"""Which attention a model runs: one typed, frozen :class:`AttnSpec`, fixed when the model is built.

Every family (the ViTs, the CLIP towers, the speech encoders, the causal LM), every recipe
(``--model.attn NAME``), the converters and the exported weights name attention by the same names:

=================== ===========================================================================
name                what is built
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

A spec holds five settings: the layer ``kind`` (``softmax``, ``diff``, ``diff_v2``), the lambda-init
rule (``lambda_init``: None for the paper's depth schedule, else a constant), ``sub_norm`` (V1's per-head
RMSNorm and scale), the head layout (``head_scale`` multiplies the baseline's head count) and parameter
matching (``match_params``: the family narrows its feed-forward to the softmax model's parameter count).
Layers take the first three when they are built (:func:`diffzoo.layers.build_attention`); the families
apply the last two to the baseline shape they are given, so a model's config always holds the
*baseline's* shape plus the attention spec's name, and the same config rebuilds the same model.

    from diffzoo.layers import get_spec

    spec = get_spec("diff_const")             # AttnSpec(name='diff_const', kind='diff', lambda_init=0.8, ...)
    spec.lambda_init_at(depth=3)              # 0.8
    get_spec("diff").with_lambda_init(0.5)    # the V1 spec with a constant 0.5 (a converted model's)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ABLATION_VARIANTS", "LAYER_KINDS", "MAIN_VARIANTS", "VARIANTS", "AttnKind", "AttnSpec", "get_spec", "lambda_init_schedule", "spec_names"]

AttnKind = Literal["softmax", "diff", "diff_v2"]
LAYER_KINDS: tuple[str, ...] = ("softmax", "diff", "diff_v2")


def lambda_init_schedule(depth: int) -> float:
    """The paper's ``lambda_init = 0.8 - 0.6 exp(-0.3 * depth)`` for the 0-based block index ``depth``."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0 (0-based block index), got {depth}")
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


@dataclass(frozen=True)
class AttnSpec:
    """The attention of a model: kind, lambda-init rule, sub-norm, head layout and parameter matching.

    Args:
        name: the name a recipe's ``--model.attn`` and the exported metadata use.
        kind: the layer built: ``"softmax"``, ``"diff"`` (V1) or ``"diff_v2"``.
        description: one line for listings.
        lambda_init: constant ``lambda_init`` of V1 layers; None = the depth schedule
            ``0.8 - 0.6 exp(-0.3 depth)``.
        sub_norm: V1's per-head RMSNorm and ``(1 - lambda_init)`` scale (False: neither; the layer then
            has no ``sub_norm.weight``).
        head_scale: multiplies the baseline's head counts (head width scales inversely).
        match_params: narrow the feed-forward until the model has the softmax model's parameter count.
    """

    name: str
    kind: str
    description: str = ""
    lambda_init: float | None = None
    sub_norm: bool = True
    head_scale: float = 1.0
    match_params: bool = False

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"attention kind {self.kind!r}; expected one of {', '.join(LAYER_KINDS)}")
        if self.lambda_init is not None:
            if self.kind != "diff":
                raise ValueError(
                    f"lambda_init={self.lambda_init!r} applies to differential V1 only, not to attn={self.name!r}"
                    + (" (V2 predicts lambda per token and head)" if self.kind == "diff_v2" else "")
                )
            if not math.isfinite(float(self.lambda_init)):
                raise ValueError(f"lambda_init={self.lambda_init!r} must be a finite number (the paper uses 0.2 to 0.8)")
        if not self.sub_norm and self.kind != "diff":
            raise ValueError(f"sub_norm=False applies to differential V1 only, not to attn={self.name!r}")
        if not self.head_scale > 0:
            raise ValueError(f"head_scale={self.head_scale} must be positive")

    @property
    def differential(self) -> bool:
        """True for the differential kinds (V1 and V2)."""
        return self.kind != "softmax"

    @property
    def attn(self) -> str:
        """The layer kind (the name earlier versions gave this field)."""
        return self.kind

    def lambda_init_at(self, depth: int) -> float:
        """``lambda_init`` of a V1 layer in the block of 0-based index ``depth``."""
        return lambda_init_schedule(depth) if self.lambda_init is None else float(self.lambda_init)

    def scale_heads(self, heads: int, what: str = "num_heads") -> int:
        """The head count this spec runs for a baseline of ``heads`` heads (``head_scale`` applied)."""
        scaled = heads * self.head_scale
        if scaled != int(scaled) or scaled < 1:
            raise ValueError(
                f"attn={self.name!r} needs {what}={heads} divisible by {1 / self.head_scale:g} "
                f"(it runs {self.head_scale:g} x the baseline's heads)"
            )
        return int(scaled)

    def with_lambda_init(self, lambda_init: float | None) -> AttnSpec:
        """This spec with a constant ``lambda_init`` (None: unchanged). The name stays, so a model built
        from it records ``lambda_init`` beside the name (converted models fix one this way)."""
        if lambda_init is None:
            return self
        return dataclasses.replace(self, lambda_init=float(lambda_init))

    def to_dict(self) -> dict[str, Any]:
        """The attention spec as JSON-ready fields (exported metadata); :func:`get_spec` reads it back."""
        return dataclasses.asdict(self)


VARIANTS: dict[str, AttnSpec] = {s.name: s for s in (
    AttnSpec("softmax", "softmax", "softmax attention, H heads of width d"),
    AttnSpec("softmax_wide", "softmax", "softmax attention, H/2 heads of width 2d", head_scale=0.5),
    AttnSpec("diff", "diff", "differential V1 (per-head norm, lambda_init by depth)"),
    AttnSpec("diff_nonorm", "diff", "V1 without the per-head norm and the (1 - lambda_init) scale", sub_norm=False),
    AttnSpec("diff_const", "diff", "V1 with constant lambda_init 0.8", lambda_init=0.8),
    AttnSpec("diff_v2", "diff_v2", "differential V2 (lambda per token and head)"),
    AttnSpec("diff_v2_matched", "diff_v2", "V2 with a narrower feed-forward, parameter-matched to softmax",
             match_params=True),
)}




def _plain(s: AttnSpec) -> bool:
    return s.head_scale == 1.0 and s.sub_norm and s.lambda_init is None


# How the study groups them (derived, so that each name is written once, above): the three it compares on
# every task are the plain layer of each kind at the softmax parameter count (softmax, V1, V2 matched); the
# ablations change one thing of softmax or V1 (head layout, per-head norm, lambda_init).
MAIN_VARIANTS: tuple[str, ...] = tuple(n for n, s in VARIANTS.items()
                                       if _plain(s) and (s.kind != "diff_v2" or s.match_params))
ABLATION_VARIANTS: tuple[str, ...] = tuple(n for n, s in VARIANTS.items() if not _plain(s))


def spec_names() -> list[str]:
    """The names every recipe's ``--model.attn`` accepts, in the study's order."""
    return list(VARIANTS)


def get_spec(attn: str | AttnSpec | dict[str, Any], lambda_init: float | None = None) -> AttnSpec:
    """The :class:`AttnSpec` named ``attn`` (or ``attn`` itself, or one read from :meth:`AttnSpec.to_dict`),
    with a constant ``lambda_init`` when one is given. Unknown names raise a one-line error listing the
    known ones."""
    if isinstance(attn, AttnSpec):
        spec = attn
    elif isinstance(attn, dict):
        try:
            spec = AttnSpec(**attn)
        except TypeError as e:
            raise ValueError(f"not an attention spec: {attn!r} ({e})") from None
    elif isinstance(attn, str) and attn in VARIANTS:
        spec = VARIANTS[attn]
    else:
        raise ValueError(f"unknown attention variant {attn!r}; choose one of {', '.join(VARIANTS)}")
    return spec.with_lambda_init(lambda_init)
