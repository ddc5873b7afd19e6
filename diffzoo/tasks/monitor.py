"""Training health for the study: the gradient norm as a logged curve, and divergence detection.

Any recipe gets it from the command line (``recipes.sweep`` adds it to every run)::

    python -m recipes.vit_imagenet --trainer.callbacks+=diffzoo.tasks.monitor.GradNormMonitor
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

__all__ = ["DIVERGENCE_FILE", "GradNormMonitor", "grad_norm"]

DIVERGENCE_FILE = "divergence.json"


def grad_norm(parameters: Any) -> float:
    """Global L2 norm of the gradients of ``parameters`` (parameters without a gradient are skipped)."""
    norms = [p.grad.detach().float().norm() for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class GradNormMonitor(pl.Callback):
    """Logs ``train/grad_norm`` (before clipping) every ``every_n_steps`` optimizer steps and stops a run
    whose training loss or gradient norm is not finite, writing ``divergence.json`` (step, loss, grad
    norm) into the run's log folder.

    Args:
        every_n_steps: logging period in optimizer steps.
    """

    def __init__(self, every_n_steps: int = 10) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps} must be >= 1")
        self.every_n_steps = every_n_steps
        self.last_norm = float("nan")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        step = trainer.global_step
        if step % self.every_n_steps and math.isfinite(self.last_norm):
            return  # unless the previous norm was not finite: then every step is checked
        self.last_norm = grad_norm(pl_module.parameters())
        pl_module.log("train/grad_norm", self.last_norm, on_step=True, on_epoch=False)
        if not math.isfinite(self.last_norm):
            self._diverged(trainer, "gradient norm", self.last_norm)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
            self._diverged(trainer, "training loss", float(loss.detach().float().mean()))

    def _diverged(self, trainer: pl.Trainer, what: str, value: float) -> None:
        trainer.should_stop = True
        out = Path(trainer.log_dir or trainer.default_root_dir)
        if trainer.is_global_zero and not (out / DIVERGENCE_FILE).exists():
            out.mkdir(parents=True, exist_ok=True)
            record = {"step": trainer.global_step, "epoch": trainer.current_epoch, "what": what, "value": str(value)}
            (out / DIVERGENCE_FILE).write_text(json.dumps(record))
            print(f"diverged: {what} is {value} at step {trainer.global_step}; training stopped", flush=True)
