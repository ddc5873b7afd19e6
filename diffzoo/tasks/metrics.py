"""Training-time accuracy (``torchmetrics``) that never credits a broken prediction, see
:mod:`diffzoo.evaluation.metrics`."""

from __future__ import annotations

from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from ..evaluation.metrics import wrong_where_nonfinite

__all__ = ["FiniteMulticlassAccuracy"]


class FiniteMulticlassAccuracy(MulticlassAccuracy):
    """``torchmetrics`` ``MulticlassAccuracy`` on logits that counts a row with a NaN or inf as a miss."""

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.is_floating_point() and preds.dim() == 2:
            preds = wrong_where_nonfinite(preds, target)
        super().update(preds, target)
