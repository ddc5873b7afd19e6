"""Callbacks shared by the recipes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl

from .export import export_module


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
