"""Matched-parameter pairs of softmax and differential attention."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .attention import Attention
from .block import diff_heads_for_baseline
from .diff_attention import DiffAttention

# A differential model and its baseline count as matched when their parameters differ by at most this.
MATCH_TOLERANCE = 0.005


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (each shared tensor counted once)."""
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def relative_difference(a: int, b: int) -> float:
    """``|a - b| / max(a, b)``."""
    return abs(a - b) / max(a, b, 1)


def check_matched(baseline: nn.Module, differential: nn.Module, tolerance: float = MATCH_TOLERANCE) -> float:
    """Raise ``ValueError`` unless the two modules' parameter counts agree within ``tolerance``."""
    nb, nd = count_parameters(baseline), count_parameters(differential)
    rel = relative_difference(nb, nd)
    if rel > tolerance:
        raise ValueError(
            f"not parameter-matched: baseline {nb:,} vs differential {nd:,} ({100 * rel:.2f}% > {100 * tolerance:.2f}%)"
        )
    return rel


@dataclass
class MatchedPair:
    """A softmax baseline and a differential attention with the same projections."""

    baseline: Attention
    differential: DiffAttention
    baseline_params: int
    differential_params: int

    @property
    def relative_difference(self) -> float:
        return relative_difference(self.baseline_params, self.differential_params)

    def report(self) -> str:
        return (
            f"softmax {self.baseline_params:,} params | differential {self.differential_params:,} params | "
            f"difference {100 * self.relative_difference:.3f}%"
        )


def matched_attention_pair(
    dim: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    *,
    depth: int = 0,
    lambda_init: float | None = None,
    **kwargs,
) -> MatchedPair:
    """Build a softmax :class:`Attention` with ``num_heads`` heads and its matched :class:`DiffAttention`.

    Extra ``kwargs`` (biases, causal, rope, dropout, backend) go to both. Raises ``ValueError`` if the
    parameter counts differ by more than 0.5 %.
    """
    h, hkv, d = diff_heads_for_baseline(dim, num_heads, num_kv_heads, head_dim)
    base = Attention(dim, num_heads, num_kv_heads, **kwargs)
    diff = DiffAttention(dim, h, hkv, d, depth=depth, lambda_init=lambda_init, **kwargs)
    check_matched(base, diff)
    return MatchedPair(base, diff, count_parameters(base), count_parameters(diff))
