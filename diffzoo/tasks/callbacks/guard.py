"""Divergence: a run whose loss (or gradient norm) is not finite stops, records where, and exports nothing."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import torch

from .checkpoints import SafeCheckpointReading

DIVERGENCE_FILE = "divergence.json"


class TrainingDiverged(RuntimeError):
    """The training loss (or gradient norm) became NaN or infinite; the run stops and exports nothing."""


def stop_diverged(trainer: pl.Trainer, what: str, value: float, batch: int | None = None,
                  lr: float | None = None) -> None:
    """Record a divergence in ``<log dir>/divergence.json`` (step, epoch, what, value) and raise
    :class:`TrainingDiverged`; the record lets a sweep tell a diverged run from a crashed one."""
    out = Path(trainer.log_dir or trainer.default_root_dir)
    if trainer.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        record = {"step": trainer.global_step, "epoch": trainer.current_epoch, "what": what, "value": str(value)}
        (out / DIVERGENCE_FILE).write_text(json.dumps(record))
    where = f"epoch {trainer.current_epoch}" + ("" if batch is None else f", batch {batch}")
    rate = "" if lr is None else f" (learning rate {lr:.3g})"
    raise TrainingDiverged(
        f"the {what} is {value} at step {trainer.global_step} ({where}){rate}; training "
        "stopped and nothing was exported. Lower the learning rate or use fp32/bf16, and restart (or resume from "
        "an earlier checkpoint)"
    )


class TrainingGuard(pl.Callback):
    """Stops a run whose training loss became NaN or infinite, before it can end in a result that looks fine.

    Before each backward pass, a NaN or infinite training loss raises :class:`TrainingDiverged` naming the
    step (and writes ``divergence.json`` into the log folder), before the optimizer can write non-finite
    weights; ``fit`` then ends without ``on_fit_end``, so nothing is exported and the recipes exit non-zero.

    The diffzoo tasks attach it themselves (:class:`GuardedTraining`).
    """

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        bad = not bool(torch.isfinite(loss.detach()).all())
        if trainer.world_size > 1:  # every rank stops together
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            return
        value = loss.detach().float().flatten()[0].item() if loss.numel() else float("nan")
        lrs = [g["lr"] for opt in trainer.optimizers for g in opt.param_groups][:1]
        stop_diverged(trainer, "training loss", value, trainer.fit_loop.epoch_loop.batch_idx, lrs[0] if lrs else None)


class GuardedTraining:
    """LightningModule mixin attaching a :class:`TrainingGuard` and a
    :class:`~diffzoo.tasks.callbacks.checkpoints.SafeCheckpointReading` to every Trainer that runs the module."""

    def configure_callbacks(self) -> list[pl.Callback]:
        return [TrainingGuard(), SafeCheckpointReading()]
