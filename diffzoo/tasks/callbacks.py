"""Callbacks shared by the recipes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..checkpoint_io import CheckpointReadError, load_torch_file
from .export import export_module


DIVERGENCE_FILE = "divergence.json"


class TrainingDiverged(RuntimeError):
    """The training loss (or gradient norm) became NaN or infinite; the run stops and exports nothing."""


def stop_diverged(trainer: pl.Trainer, what: str, value: float, batch: Optional[int] = None,
                  lr: Optional[float] = None) -> None:
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


def require_trained(trainer: pl.Trainer) -> None:
    """Raise ``ValueError`` when ``fit`` ran no training batch, so no untrained weights are exported as a result."""
    if trainer.num_training_batches == 0:
        raise ValueError(
            "the training data gave 0 batches (fewer samples per device than the batch size, with the last "
            "incomplete batch dropped); nothing was exported: lower the batch size or use more training data"
        )


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` reading checkpoints with ``torch.load(weights_only=True)`` only.

    ``weights_only=False`` requests are not honoured: diffzoo's checkpoints hold tensors and plain values,
    and a file that needs more is refused (:mod:`diffzoo.checkpoint_io`) instead of being unpickled.
    """

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Optional[bool] = None) -> dict[str, Any]:
        ckpt = load_torch_file(path, map_location=map_location or "cpu", what="--ckpt_path")
        if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
            raise CheckpointReadError(f"--ckpt_path {path} is not a Lightning checkpoint (no 'state_dict'); pass a "
                                      ".ckpt written during training (checkpoints/last.ckpt)")
        return ckpt


class TrainingGuard(pl.Callback):
    """Stops runs that would end in a wrong result that looks fine, and reads resume checkpoints safely.

    * Before each backward pass, a NaN or infinite training loss raises :class:`TrainingDiverged` naming
      the step (and writes ``divergence.json`` into the log folder), before the optimizer can write non-finite weights; ``fit`` then ends without
      ``on_fit_end``, so nothing is exported and the recipes exit non-zero.
    * Lightning's default checkpoint reader is replaced by :class:`SafeCheckpointIO` before it restores
      ``ckpt_path``: a checkpoint holding pickled objects other than tensors and plain values, a remote,
      an empty or a non-checkpoint file is refused with a one-line error, and nothing from it runs.
      (A custom ``CheckpointIO`` plugin given to the Trainer is left in place.)

    The diffzoo tasks attach it themselves (``configure_callbacks``).
    """

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = SafeCheckpointIO()

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
    """LightningModule mixin attaching a :class:`TrainingGuard` to every Trainer that runs the module."""

    def configure_callbacks(self) -> list[pl.Callback]:
        return [TrainingGuard()]


class RunSummary(pl.Callback):
    """At the end of ``fit``: export safetensors weights, write ``summary.json``, print where things are.

    Args:
        export: write ``model.safetensors`` (and ``model_ema.safetensors`` when the task keeps an EMA).
        monitor: metric reported as the headline result.
    """

    def __init__(self, export: bool = True, monitor: str = "val/top1") -> None:
        self.export = export
        self.monitor = monitor
        self.summary: dict[str, Any] = {}

    def export_weights(self, pl_module: pl.LightningModule, out: Path) -> dict[str, str]:
        """Write the trained weights under ``out``; returns ``{summary key: path}``."""
        paths = {"safetensors": str(export_module(pl_module, out / "model.safetensors"))}
        if getattr(pl_module, "ema", None) is not None:
            paths["safetensors_ema"] = str(export_module(pl_module, out / "model_ema.safetensors", use_ema=True))
        return paths

    def reload_hint(self, pl_module: pl.LightningModule, path: str) -> str:
        """The call that rebuilds the model from the exported weights."""
        return f"diffzoo.tasks.load_exported({path!r})"

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        out = Path(trainer.log_dir or trainer.default_root_dir)  # a collective call: every rank makes it
        require_trained(trainer)
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
        ckpt = trainer.checkpoint_callback
        summary: dict[str, Any] = {
            "model": pl_module.hparams.get("model"),
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "metrics": metrics,
            "last_checkpoint": getattr(ckpt, "last_model_path", None) or None,
            "best_checkpoint": getattr(ckpt, "best_model_path", None) or None,
            "log_dir": str(out),
        }
        if self.export and hasattr(pl_module, "model"):
            summary.update(self.export_weights(pl_module, out))
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.summary = summary
        value: Optional[float] = metrics.get(self.monitor)
        lines = [
            f"{self.monitor}: {100 * value:.2f} %" if value is not None else f"{self.monitor}: not measured",
            f"checkpoint: {summary['last_checkpoint']}",
        ]
        if "safetensors" in summary:
            lines.append(f"weights: {summary['safetensors']}")
            lines.append(f"reload: {self.reload_hint(pl_module, summary['safetensors'])}")
        lines.append(f"metrics log: {os.path.join(out, 'metrics.csv')}")
        print("\n".join(lines), flush=True)
