"""Accuracy that never credits a broken prediction: a row of scores holding a NaN or an infinity is wrong.

``argmax`` and ``topk`` rank NaN above every number, so without this a model whose outputs are NaN would
be credited with every sample whose label happens to be the index the NaN lands on. The training metric
built on these (a ``torchmetrics`` accuracy) is :class:`diffzoo.tasks.metrics.FiniteMulticlassAccuracy`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["finite_rows", "wrong_where_nonfinite"]


def finite_rows(scores: Tensor) -> Tensor:
    """``(B,)`` True where every score of the row (the last dimension) is finite."""
    return torch.isfinite(scores).all(dim=-1)


def wrong_where_nonfinite(logits: Tensor, target: Tensor) -> Tensor:
    """``logits`` ``(B, C)`` with every non-finite row replaced by one whose true class ranks last."""
    ok = finite_rows(logits)
    if bool(ok.all()):
        return logits
    safe = torch.where(ok[:, None], logits, torch.zeros_like(logits))
    bad = (~ok).nonzero().flatten()
    safe[bad, target[bad].long()] = -1.0
    return safe
