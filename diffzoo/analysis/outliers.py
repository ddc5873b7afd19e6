"""Activation outliers: the largest attention logits and hidden states against their median.

Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258), Section 3.7 / Table 5 report the
top activation magnitudes of attention logits and hidden states next to their median (docs/design.md,
"Activation outliers"). For a set of values ``x`` (one layer, one forward call) and ``k = 10``::

    m            = |x| over the set, sorted decreasingly: m_(1) >= m_(2) >= ...
    top1         = m_(1)
    topk_mean    = (m_(1) + ... + m_(k)) / k
    median       = the lower median of m (torch.median)
    top1_ratio   = top1 / median,     topk_ratio = topk_mean / median

The sets: attention logits ``q k^T * scale`` of every query head (both branches of a differential
layer, pooled), before the mask, over the (query, key) pairs the mask allows; hidden states: every
element of each block's output ``(B, N, D)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from timm.models.vision_transformer import Block as TimmBlock
from torch import Tensor, nn

from ..kernels._masks import prepare_mask
from ..layers import AttentionBase, Block, DiffAttention
from .lowbit import attention_logits
from .maps import LayerSelection, _wrap_attend, attention_layers

__all__ = ["OutlierRecord", "OutlierStats", "logit_outliers", "outlier_stats", "record_outliers"]


@dataclass(frozen=True)
class OutlierStats:
    """Magnitude statistics of one tensor (see the module docstring); plain floats."""

    top1: float
    topk_mean: float
    median: float
    top1_ratio: float
    topk_ratio: float
    k: int
    count: int


def outlier_stats(x: Tensor, k: int = 10, mask: Tensor | None = None) -> OutlierStats:
    """Top-1 and top-``k``-mean magnitude of ``x`` against its median magnitude.

    Args:
        x: any shape; ``mask`` (bool, broadcastable to ``x``) keeps only some entries.
        k: how many of the largest magnitudes to average (fewer if ``x`` has fewer entries).
    """
    m = x.detach().float().abs()
    m = m[mask.expand_as(m)] if mask is not None else m.flatten()
    if m.numel() == 0:
        raise ValueError("no values to measure (empty tensor or mask)")
    top = torch.topk(m, min(k, m.numel())).values
    median = float(m.median())
    top1, topk = float(top[0]), float(top.mean())
    ratio = (lambda v: v / median if median > 0 else float("inf"))
    return OutlierStats(top1, topk, median, ratio(top1), ratio(topk), int(top.numel()), int(m.numel()))


def logit_outliers(
    module: AttentionBase, q: Tensor, k: Tensor, masks: dict, top_k: int = 10
) -> OutlierStats:
    """:func:`outlier_stats` of a layer's logits for the kernel inputs ``q, k`` and ``masks`` of one call."""
    differential = isinstance(module, DiffAttention)
    s = attention_logits(q, k, differential)  # (B, Hq, Nq, Nk)
    Nq, Nk = s.shape[-2:]
    m = prepare_mask(masks.get("attn_mask"), masks.get("key_padding_mask"), bool(masks.get("causal")), Nq, Nk, s.device)
    allowed = m.allowed()
    if allowed is None:
        return outlier_stats(s, top_k)
    if differential and allowed.shape[1] > 1:  # a per-head mask covers the H pairs of 2H logit heads
        allowed = allowed.repeat_interleave(2, dim=1)
    return outlier_stats(s, top_k, allowed)


class OutlierRecord:
    """What :func:`record_outliers` collected, per module name and call.

    Attributes:
        logits: attention-layer name -> one :class:`OutlierStats` per call.
        hidden: block name -> one :class:`OutlierStats` per call.
    """

    def __init__(self) -> None:
        self.logits: dict[str, list[OutlierStats]] = {}
        self.hidden: dict[str, list[OutlierStats]] = {}

    def table(self, kind: str = "logits", stat: str = "top1_ratio") -> list[float]:
        """``stat`` per layer (insertion = depth order), averaged over the calls (e.g. several batches)."""
        if kind not in ("logits", "hidden"):
            raise ValueError(f"kind={kind!r}; expected 'logits' or 'hidden'")
        rows = getattr(self, kind)
        return [sum(getattr(s, stat) for s in calls) / len(calls) for calls in rows.values()]

    def names(self, kind: str = "logits") -> list[str]:
        return list(getattr(self, kind))


@contextlib.contextmanager
def record_outliers(
    model: nn.Module,
    k: int = 10,
    layers: LayerSelection = None,
    hidden: None | Sequence[str] | Callable[[str, nn.Module], bool] = None,
) -> Iterator[OutlierRecord]:
    """Measure logit and hidden-state outliers while the model runs; its outputs are unchanged.

    Each selected attention layer gets an attend hook (``register_attend_hook``) that sees ``q`` and ``k``;
    each block gets a forward hook on its output. Both are removed on exit, also after an exception.

    Args:
        model: any module built from diffzoo attention layers.
        k: top-k of the ``topk`` statistics.
        layers: which attention layers (see :data:`~diffzoo.analysis.maps.LayerSelection`).
        hidden: module names, or a predicate ``(name, module)``, whose outputs are the hidden states;
            default every :class:`diffzoo.layers.Block` and timm ViT ``Block``.

    Yields:
        an :class:`OutlierRecord`, filled as the model runs.
    """
    record = OutlierRecord()

    def make(index: int, name: str, module: AttentionBase, inner: Callable) -> Callable:
        def _attend(x, q, kk, v, masks, return_attn, backend):
            with torch.no_grad():
                record.logits.setdefault(name, []).append(logit_outliers(module, q, kk, masks, k))
            return inner(x, q, kk, v, masks, return_attn, backend)

        return _attend

    if hidden is None:
        pick = lambda n, m: isinstance(m, (Block, TimmBlock))  # noqa: E731
    elif callable(hidden):
        pick = hidden
    else:
        wanted = set(hidden)
        pick = lambda n, m: n in wanted  # noqa: E731
    targets = [(n, m) for n, m in model.named_modules() if pick(n, m)]
    if hidden is not None and not callable(hidden) and len(targets) != len(set(hidden)):
        missing = sorted(set(hidden) - {n for n, _ in targets})
        raise ValueError(f"no module named {missing} in {type(model).__name__}")

    def hook_for(name: str):
        def hook(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            with torch.no_grad():
                record.hidden.setdefault(name, []).append(outlier_stats(out, k))

        return hook

    handles = []
    try:
        for name, module in targets:
            handles.append(module.register_forward_hook(hook_for(name)))
        with _wrap_attend(attention_layers(model, layers), make):
            yield record
    finally:
        for h in handles:
            h.remove()
