"""Callbacks shared by the recipes: the run summary, progress lines for logs, predictions files, curves.

* :class:`BestAndLastCheckpoint` keeps the best checkpoint by a metric and an up-to-date ``last.ckpt``.
* :class:`RunSummary` exports the weights and writes ``summary.json`` at the end of ``fit`` and says what the
  headline number is ("10-class validation top-1 on 1,000 MNIST digits").
* :class:`ProgressLines` prints one line per epoch (and every N steps) when stdout is not a terminal.
* :class:`PredictionsCSV` writes what ``predict_step`` returns to ``predictions.csv``.
* :class:`RunCurves` logs to TensorBoard beside the CSV and draws ``curves.png`` when ``fit`` ends.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from .export import export_module


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
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


class BestAndLastCheckpoint(ModelCheckpoint):
    """A :class:`~lightning.pytorch.callbacks.ModelCheckpoint` whose ``last.ckpt`` is rewritten at every
    checkpointing point. Lightning 2.6 rewrites ``last.ckpt`` only when a top-k checkpoint was saved at the
    same step, so with ``save_top_k=1`` and a monitored metric that stopped improving, ``last.ckpt`` would
    keep the best epoch's weights and a resume would restart from there. It also writes nothing under
    ``fast_dev_run`` (Lightning 2.6 still saves ``last.ckpt`` when such a run ends)."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)

    def _refresh_last(self, trainer: pl.Trainer) -> None:
        # _should_skip_saving_checkpoint is true when this step was already saved (then last.ckpt was too)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)


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
        self, pl_module: pl.LightningModule, out: Path, state_dict: Optional[dict[str, torch.Tensor]] = None
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
        return f"diffzoo.tasks.load_exported({path!r})"

    def extra_fields(self, pl_module: pl.LightningModule) -> dict[str, Any]:
        """More ``summary.json`` entries of this kind of run."""
        return {}

    def headline(self, value: Optional[float], description: Optional[str]) -> str:
        """The first printed line: the monitored metric's value and what it measures."""
        shown = f"{100 * value:.2f} %" if value is not None else "not measured"
        return f"{self.monitor}: {shown}" + (f"  ({description})" if description else "")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fast_dev_run:
            if trainer.is_global_zero:
                print("fast_dev_run: a smoke test of the loops; nothing was saved (no checkpoint, weights, "
                      "summary.json or metrics file)", flush=True)
            return
        out = Path(trainer.log_dir or trainer.default_root_dir)  # a collective call: every rank makes it
        # The full weights, also a collective call: under FSDP every rank holds a shard and the strategy
        # gathers them (to rank 0, on the CPU); under DDP or one device it is the module's own state dict.
        state = trainer.strategy.lightning_module_state_dict() if self.export else None
        if not trainer.is_global_zero:
            return
        metrics = _scalars(trainer.callback_metrics)
        ckpt = trainer.checkpoint_callback
        describe = getattr(pl_module, "describe_metric", None)
        description = describe(self.monitor, getattr(trainer, "datamodule", None)) if describe else None
        summary: dict[str, Any] = {
            "model": pl_module.hparams.get("model"),
            **self.extra_fields(pl_module),
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "monitor": self.monitor,
            "monitor_description": description,
            "metrics": metrics,
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


class ProgressLines(pl.Callback):
    """Print one line per training epoch (and every ``every_n_steps`` optimizer steps) with the key metrics,
    e.g. ``epoch 3/15  step 248  train/loss 0.412  val/loss 0.388  val/top1 0.881  41 s``; and one line at
    the end of ``validate`` / ``test``.

    Args:
        when: ``"auto"``: only when stdout is not a terminal or the progress bar is off (logs, pipes, jobs);
            ``"always"``; ``"never"``.
        every_n_steps: also print a line every this many optimizer steps (0: per epoch only).
    """

    def __init__(self, when: str = "auto", every_n_steps: int = 0) -> None:
        if when not in ("auto", "always", "never"):
            raise ValueError(f"progress.when={when!r}; use 'auto', 'always' or 'never'")
        if every_n_steps < 0:
            raise ValueError(f"progress.every_n_steps={every_n_steps} must be 0 (per epoch) or positive")
        self.when = when
        self.every_n_steps = every_n_steps
        self.active = False
        self._start = time.monotonic()
        self._last_step = -1

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        quiet_terminal = sys.stdout.isatty() and trainer.progress_bar_callback is not None
        self.active = trainer.is_global_zero and (self.when == "always" or (self.when == "auto" and not quiet_terminal))
        self._start = time.monotonic()

    @staticmethod
    def _format(metrics: dict[str, float], prefixes: Sequence[str]) -> str:
        parts = []
        for key, value in sorted(metrics.items()):
            skip = key.endswith(("_step", "/lr")) or f"{key}_epoch" in metrics  # "train/loss" == "train/loss_epoch"
            if skip or not key.startswith(tuple(prefixes)):
                continue
            parts.append(f"{key.removesuffix('_epoch')} {value:.4g}")
        return "  ".join(parts)

    def _print(self, head: str, trainer: pl.Trainer, prefixes: Sequence[str]) -> None:
        body = self._format(_scalars(trainer.callback_metrics), prefixes)
        print(f"{head}  {body}  {time.monotonic() - self._start:.0f} s".replace("    ", "  "), flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if self.active and self.every_n_steps and step % self.every_n_steps == 0 and step != self._last_step:
            self._last_step = step
            loss = trainer.callback_metrics.get("train/loss_step")
            shown = f"  train/loss {float(loss):.4g}" if loss is not None else ""
            print(f"step {step}{shown}  {time.monotonic() - self._start:.0f} s", flush=True)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.active:
            total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
            self._print(f"epoch {trainer.current_epoch + 1}{total}  step {trainer.global_step}", trainer,
                        ("train/", "val/"))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.active and trainer.state.fn == "validate":
            self._print("validate", trainer, ("val/",))

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.active:
            self._print("test", trainer, ("test/",))


class PredictionsCSV(BasePredictionWriter):
    """Write what ``predict_step`` returns to ``<run folder>/predictions.csv``: one row per sample, a
    ``row`` column (order of the predict loader) and one column per returned key (``prediction``,
    ``probability``, ``label``, ...). Under several processes each writes ``predictions.rank<N>.csv``.

    Args:
        path: file to write instead of the run folder's ``predictions.csv``.
    """

    def __init__(self, path: Optional[str] = None) -> None:
        super().__init__(write_interval="epoch")
        self.path = path
        self.written: Optional[Path] = None

    def write_on_epoch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Sequence[Any], batch_indices: Any
    ) -> None:
        batches = predictions
        if batches and isinstance(batches[0], list):  # several predict loaders: one list each
            batches = [b for loader in batches for b in loader]
        columns: dict[str, list] = {}
        for batch in batches:
            for key, value in batch.items():
                values = value.detach().cpu().tolist() if isinstance(value, torch.Tensor) else list(value)
                columns.setdefault(key, []).extend(values)
        rows = max((len(v) for v in columns.values()), default=0)
        path = Path(self.path) if self.path else Path(trainer.log_dir or trainer.default_root_dir) / "predictions.csv"
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["row", *columns])
            for i in range(rows):
                writer.writerow([i, *(_cell(v[i]) for v in columns.values())])
        self.written = path
        print(f"predictions: {path} ({rows} rows; columns: {', '.join(['row', *columns])})", flush=True)


def _cell(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def layer_lambdas(module: torch.nn.Module) -> list[float]:
    """The scalar lambda of every differential-attention layer, in depth order (empty for softmax models)."""
    with torch.no_grad():
        return [float(m.lambda_full()) for m in module.modules() if callable(getattr(m, "lambda_full", None))]


class RunCurves(pl.Callback):
    """Log to TensorBoard beside the CSV (``<run folder>/tensorboard``, when the ``tensorboard`` package is
    installed) and, when ``fit`` ends, draw ``<run folder>/curves.png``: training and validation loss,
    the other validation metrics, and lambda by depth (start and end of training) for differential models.
    Without matplotlib the plot is skipped with a line saying so.

    Args:
        tensorboard: add the TensorBoard logger.
        plot: draw ``curves.png``.
    """

    def __init__(self, tensorboard: bool = True, plot: bool = True) -> None:
        self.tensorboard = tensorboard
        self.plot = plot
        self.steps: list[tuple[int, float]] = []
        self.epochs: list[tuple[int, dict[str, float]]] = []
        self.lambdas_start: list[float] = []
        self.path: Optional[Path] = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self.tensorboard or trainer.fast_dev_run or not trainer.loggers:
            return
        if any(type(lg).__name__ == "TensorBoardLogger" for lg in trainer.loggers):
            return
        log_dir = trainer.log_dir  # a collective call: every rank makes it
        try:
            import tensorboard  # noqa: F401
            from lightning.pytorch.loggers import TensorBoardLogger
        except ImportError:
            if trainer.is_global_zero:
                print("TensorBoard logging skipped: the tensorboard package is not installed "
                      "(pip install tensorboard)", flush=True)
            return
        trainer.loggers = [*trainer.loggers, TensorBoardLogger(save_dir=log_dir, name="", version="tensorboard")]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps, self.epochs = [], []
        self.lambdas_start = layer_lambdas(pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        loss = trainer.callback_metrics.get("train/loss_step")
        if loss is not None:
            self.steps.append((trainer.global_step, float(loss)))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epochs.append((trainer.global_step, _scalars(trainer.callback_metrics)))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.plot or trainer.fast_dev_run:
            return
        out = Path(trainer.log_dir or trainer.default_root_dir)  # collective
        if not trainer.is_global_zero:
            return
        try:
            import matplotlib
        except ImportError:
            print("plots skipped: matplotlib is not installed (pip install matplotlib)", flush=True)
            return
        matplotlib.use("Agg")
        self.path = draw_curves(out / "curves.png", self.steps, self.epochs, self.lambdas_start,
                                layer_lambdas(pl_module))
        print(f"curves: {self.path}", flush=True)


def draw_curves(
    path: Path,
    steps: list[tuple[int, float]],
    epochs: list[tuple[int, dict[str, float]]],
    lambdas_start: list[float],
    lambdas_end: list[float],
) -> Path:
    """Loss (per step and per epoch), the other validation metrics per epoch and, when given, lambda by depth."""
    import matplotlib.pyplot as plt

    metric_keys = sorted({k for _, m in epochs for k in m if k.startswith("val/") and not k.endswith("loss")})
    panels = 1 + bool(metric_keys) + bool(lambdas_end)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.3), dpi=90, squeeze=False)
    ax = axes[0, 0]
    if steps:
        ax.plot([s for s, _ in steps], [v for _, v in steps], color="0.6", lw=0.8, label="train (step)")
    for key, style in (("train/loss_epoch", "o-"), ("val/loss", "s-")):
        pts = [(s, m[key]) for s, m in epochs if key in m]
        if pts:
            ax.plot([s for s, _ in pts], [v for _, v in pts], style, label=key.removesuffix("_epoch"))
    ax.set(xlabel="optimizer step", ylabel="loss", title="loss")
    ax.legend(fontsize=7)
    col = 1
    if metric_keys:
        ax = axes[0, col]
        col += 1
        for key in metric_keys:
            pts = [(s, m[key]) for s, m in epochs if key in m]
            ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", label=key)
        ax.set(xlabel="optimizer step", title="validation metrics")
        ax.legend(fontsize=7)
    if lambdas_end:
        ax = axes[0, col]
        if lambdas_start:
            ax.plot(range(len(lambdas_start)), lambdas_start, "o--", color="0.6", label="start")
        ax.plot(range(len(lambdas_end)), lambdas_end, "o-", label="end")
        ax.set(xlabel="layer", ylabel="λ", title="lambda by depth")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
