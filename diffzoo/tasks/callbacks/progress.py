"""Progress lines for logs: one line per epoch (and every N steps) when stdout is not a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl

from .summary import scalar_metrics


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
        body = self._format(scalar_metrics(trainer.callback_metrics), prefixes)
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
