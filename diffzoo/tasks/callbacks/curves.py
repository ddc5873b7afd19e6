"""Curves of a run: TensorBoard beside the CSV log, and ``curves.png`` (loss, validation metrics, lambda by
depth) when ``fit`` ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from .summary import scalar_metrics


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
        self.path: Path | None = None

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
        self.epochs.append((trainer.global_step, scalar_metrics(trainer.callback_metrics)))

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


def plotted_metrics(epochs: list[tuple[int, dict[str, float]]]) -> list[str]:
    """The validation metrics of the middle panel: not the loss (left panel) and not the sample counts
    ``val/evaluated`` / ``val/skipped``, whose scale would flatten the metrics."""
    counts = ("/evaluated", "/skipped")
    return sorted({k for _, m in epochs for k in m
                   if k.startswith("val/") and not k.endswith("loss") and not k.endswith(counts)})


def draw_curves(
    path: Path,
    steps: list[tuple[int, float]],
    epochs: list[tuple[int, dict[str, float]]],
    lambdas_start: list[float],
    lambdas_end: list[float],
) -> Path:
    """Loss (per step and per epoch), the other validation metrics per epoch and, when given, lambda by depth."""
    import matplotlib.pyplot as plt

    metric_keys = plotted_metrics(epochs)
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
