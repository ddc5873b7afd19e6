"""Training health for the study: the gradient norm as a logged curve, and divergence records.

Any recipe gets it from the command line (``recipes.sweep`` adds it to every run)::

    python -m recipes.vit_imagenet --trainer.callbacks+=diffzoo.tasks.monitor.GradNormMonitor
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch

from .callbacks.guard import DIVERGENCE_FILE, stop_diverged

__all__ = ["DIVERGENCE_FILE", "GradNormMonitor", "grad_norm"]


def grad_norm(parameters: Any) -> float:
    """Global L2 norm of the gradients of ``parameters`` (parameters without a gradient are skipped)."""
    norms = [p.grad.detach().float().norm() for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class GradNormMonitor(pl.Callback):
    """Logs ``train/grad_norm`` (before clipping) every ``every_n_steps`` optimizer steps. A gradient norm
    that is not finite stops the run like a non-finite loss does (:func:`diffzoo.tasks.callbacks.stop_diverged`:
    ``divergence.json`` in the log folder, :class:`~diffzoo.tasks.callbacks.TrainingDiverged` raised); the loss
    itself is watched by the tasks' :class:`~diffzoo.tasks.callbacks.TrainingGuard`.

    Args:
        every_n_steps: logging period in optimizer steps.
    """

    def __init__(self, every_n_steps: int = 10) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps} must be >= 1")
        self.every_n_steps = every_n_steps

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        norm = grad_norm(pl_module.parameters())
        pl_module.log("train/grad_norm", norm, on_step=True, on_epoch=False)
        if not math.isfinite(norm):
            stop_diverged(trainer, "gradient norm", norm)
