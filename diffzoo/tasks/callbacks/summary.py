"""The end of ``fit``: refuse to export weights that were not trained, export them, write ``summary.json``
and print what the headline number measures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from ...weights.export import export_module


def refuse_empty_budget(trainer: pl.Trainer) -> None:
    """Raise ``ValueError`` before training when the trainer's budget is zero (``max_epochs`` or
    ``max_steps`` 0): such a fit would end at once and export the initial weights as a result."""
    for flag, value in (("max_epochs", trainer.max_epochs), ("max_steps", trainer.max_steps)):
        if value == 0:
            raise ValueError(f"--trainer.{flag} 0 trains nothing, so there are no weights to export; give a "
                             f"positive --trainer.{flag} (or use the validate subcommand to score a model)")


def require_trained(trainer: pl.Trainer) -> None:
    """Raise ``ValueError`` when ``fit`` ran no training batch or no optimizer step (and restored none from a
    checkpoint), so no untrained weights are exported as a result."""
    if trainer.num_training_batches == 0:
        raise ValueError(
            "the training data gave 0 batches (fewer samples per device than the batch size, with the last "
            "incomplete batch dropped); nothing was exported: lower the batch size or use more training data"
        )
    if trainer.global_step == 0:
        raise ValueError(
            "fit ended after 0 training steps (check --trainer.max_epochs, --trainer.max_steps, "
            "--trainer.max_time and --trainer.limit_train_batches); nothing was exported"
        )


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The one-element values of ``metrics`` (Lightning's callback metrics) as floats."""
    return {k: float(v) for k, v in metrics.items() if getattr(v, "numel", lambda: 1)() == 1}


def _flush_loggers(trainer: pl.Trainer) -> None:
    """Write buffered rows (the CSV logger keeps up to ``flush_logs_every_n_steps`` in memory)."""
    for logger in trainer.loggers:
        logger.save()


def metric_files(trainer: pl.Trainer) -> list[str]:
    """The metrics files the run's loggers have written (only files that exist)."""
    files = []
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            path = Path(logger.log_dir) / "metrics.csv"
        elif type(logger).__name__ == "TensorBoardLogger":
            path = Path(logger.log_dir)
        else:
            continue
        if path.exists():
            files.append(str(path))
    return files


class RunSummary(pl.Callback):
    """At the end of ``fit``: export safetensors weights, write ``summary.json``, print what the headline
    metric measures and where things are. A ``fast_dev_run`` writes nothing and says so.

    The exported weights come from ``trainer.strategy.lightning_module_state_dict()``, which every rank
    calls: under FSDP it gathers the sharded parameters into a full state dict, so the file holds the whole
    model (not rank 0's shard); under DDP and on one device it is the module's own state dict.

    Args:
        export: write ``model.safetensors`` (and ``model_ema.safetensors`` when the task keeps an EMA).
        monitor: metric reported as the headline result.
    """

    def __init__(self, export: bool = True, monitor: str = "val/top1") -> None:
        self.export = export
        self.monitor = monitor
        self.summary: dict[str, Any] = {}

    def export_weights(
        self, pl_module: pl.LightningModule, out: Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> dict[str, str]:
        """Write the trained weights under ``out``; returns ``{summary key: path}``. ``state_dict`` is the
        task's full state dict as the strategy gathered it (see :meth:`on_fit_end`)."""
        paths = {"safetensors": str(export_module(pl_module, out / "model.safetensors", state_dict=state_dict))}
        if getattr(pl_module, "ema", None) is not None:
            paths["safetensors_ema"] = str(
                export_module(pl_module, out / "model_ema.safetensors", use_ema=True, state_dict=state_dict)
            )
        return paths

    def reload_hint(self, pl_module: pl.LightningModule, path: str) -> str:
        """The call that rebuilds the model from the exported weights."""
        return f"diffzoo.weights.load_exported({path!r})"

    def extra_fields(self, pl_module: pl.LightningModule) -> dict[str, Any]:
        """More ``summary.json`` entries of this kind of run."""
        return {}

    def headline(self, value: float | None, description: str | None) -> str:
        """The first printed line: the monitored metric's value and what it measures."""
        shown = f"{100 * value:.2f} %" if value is not None else "not measured"
        return f"{self.monitor}: {shown}" + (f"  ({description})" if description else "")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.fast_dev_run:
            refuse_empty_budget(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fast_dev_run:
            if trainer.is_global_zero:
                print("fast_dev_run: a smoke test of the loops; nothing was saved (no checkpoint, weights, "
                      "summary.json or metrics file)", flush=True)
            return
        out = Path(trainer.log_dir or trainer.default_root_dir)  # a collective call: every rank makes it
        require_trained(trainer)
        # The full weights, also a collective call: under FSDP every rank holds a shard and the strategy
        # gathers them (to rank 0, on the CPU); under DDP or one device it is the module's own state dict.
        state = trainer.strategy.lightning_module_state_dict() if self.export else None
        if not trainer.is_global_zero:
            return
        metrics = scalar_metrics(trainer.callback_metrics)
        ckpt = trainer.checkpoint_callback
        describe = getattr(pl_module, "describe_metric", None)
        description = describe(self.monitor, getattr(trainer, "datamodule", None)) if describe else None
        summary: dict[str, Any] = {
            "model": pl_module.hparams.get("model"),
            "parameters": sum(p.numel() for p in getattr(pl_module, "model", pl_module).parameters()),
            **self.extra_fields(pl_module),
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "monitor": self.monitor,
            "monitor_description": description,
            "metrics": metrics,
            # what a CPU result depends on besides the code: the seed and the number of torch threads
            "seed": int(os.environ["PL_GLOBAL_SEED"]) if os.environ.get("PL_GLOBAL_SEED", "").isdigit() else None,
            "torch_threads": torch.get_num_threads(),
            "last_checkpoint": getattr(ckpt, "last_model_path", None) or None,
            "best_checkpoint": getattr(ckpt, "best_model_path", None) or None,
            "log_dir": str(out),
        }
        if self.export and hasattr(pl_module, "model"):
            summary.update(self.export_weights(pl_module, out, state))
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.summary = summary
        _flush_loggers(trainer)
        lines = [self.headline(metrics.get(self.monitor), description)]
        lines.append(f"run: seed {summary['seed']}, {summary['torch_threads']} torch threads (on a CPU another thread "
                     "count gives another number)")
        if summary["best_checkpoint"] and summary["best_checkpoint"] != summary["last_checkpoint"]:
            lines.append(f"best checkpoint: {summary['best_checkpoint']}")
        if summary["last_checkpoint"]:
            lines.append(f"checkpoint: {summary['last_checkpoint']}")
        if "safetensors" in summary:
            lines.append(f"weights: {summary['safetensors']}")
            lines.append(f"reload: {self.reload_hint(pl_module, summary['safetensors'])}")
        lines.append(f"summary: {out / 'summary.json'}")
        lines += [f"metrics log: {path}" for path in metric_files(trainer)]
        print("\n".join(lines), flush=True)
