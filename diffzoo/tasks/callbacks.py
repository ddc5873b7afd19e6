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
import functools
import json
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Checkpoint, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from ..checkpoint_io import CheckpointReadError, load_torch_file
from .export import export_module
from .resume import ResumableLoader, replays_on_resume

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


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` reading checkpoints with ``torch.load(weights_only=True)`` only.

    ``weights_only=False`` requests are not honoured: diffzoo's checkpoints hold tensors and plain values,
    and a file that needs more is refused (:mod:`diffzoo.checkpoint_io`) instead of being unpickled.
    """

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
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
        return f"diffzoo.tasks.load_exported({path!r})"

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


class TrainingInterrupted(SystemExit):
    """Ends ``fit`` after :class:`InterruptCheckpoint` saved its checkpoint; the exit status is 128 + the signal."""


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class InterruptCheckpoint(Checkpoint):
    """On Ctrl-C (SIGINT) or SIGTERM: finish the optimizer step in progress, save a resumable checkpoint,
    print the command that resumes from it, and exit with status 128 + the signal number.

    The checkpoint is written at a point the uninterrupted run passes through unchanged: after an optimizer
    step that completes no accumulation window early, is not the last batch of its epoch and is not followed
    by validation; otherwise at the end of the epoch (after validation). The training loader's position, the
    RNG states and the optimizer, scheduler and loop states are saved, so the resumed run trains on the same
    batches with the same random draws as if it had not stopped (see :class:`~diffzoo.tasks.resume.ResumableLoader`
    for the one case with DataLoader workers where augmentations may differ). A second Ctrl-C aborts at once,
    without a checkpoint. The checkpoint is deleted when a run resumed from it finishes.

    Args:
        resume_command: the command line that started the run, without ``--ckpt_path``; printed with
            ``--ckpt_path PATH`` appended. None prints the checkpoint path only.
        filename: the checkpoint's file name, in the checkpoint folder (or ``<log_dir>/checkpoints``).
    """

    def __init__(self, resume_command: list[str] | None = None, filename: str = "interrupted.ckpt") -> None:
        self.resume_command = resume_command
        self.filename = filename
        self.received: int | None = None
        self.path: str | None = None
        self._stop_at: str | None = None  # "batch" or "epoch": where the saved stop is carried out
        self._previous_handlers: dict[int, Any] = {}
        self._patched: Any | None = None
        self._loader: Any = None
        self._verbose = True

    # -- signals -------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now, without a checkpoint
        self.received = signum
        if self._verbose:
            print(f"\n{signal.Signals(signum).name} received: stopping after the current optimizer step and saving "
                  "a resumable checkpoint (Ctrl-C again aborts without one)", file=sys.stderr, flush=True)

    def _install(self) -> None:
        if self._previous_handlers or sys.platform == "win32":
            return
        try:
            for sig in _STOP_SIGNALS:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: signals cannot be caught here
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous_handlers = {}

    # -- the training loader ---------------------------------------------------------------------------------
    def _wrap_train_loader(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        original = getattr(source, "train_dataloader", None)
        if original is None or getattr(original, "_resumable", False):
            return

        @functools.wraps(original)
        def train_dataloader() -> Any:
            loader = original()
            if not isinstance(loader, DataLoader):
                return loader
            from lightning.pytorch.trainer.connectors.data_connector import _process_dataloader
            from lightning.pytorch.trainer.states import RunningStage, TrainerFn

            # what Lightning would do to the loader (distributed sampler, worker seeding), done before wrapping
            loader = _process_dataloader(trainer, TrainerFn.FITTING, RunningStage.TRAINING, loader)
            if trainer.world_size > 1 and not isinstance(loader.sampler, DistributedSampler) \
                    and not isinstance(loader.dataset, IterableDataset):
                return loader
            self._loader = ResumableLoader(loader, functools.partial(_position, trainer))
            return self._loader

        train_dataloader._resumable = True  # type: ignore[attr-defined]
        source.train_dataloader = train_dataloader
        self._patched = source

    def _unwrap_train_loader(self) -> None:
        if self._patched is not None:
            self._patched.__dict__.pop("train_dataloader", None)
            self._patched = None

    # -- hooks -----------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.received, self.path, self._stop_at = None, None, None
        self._verbose = trainer.is_global_zero
        self._wrap_train_loader(trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()  # after Lightning's own SIGTERM handler, which would end the run without a checkpoint
        fit_loop = trainer.fit_loop
        if self._loader is not None and any(getattr(fit_loop, "_combined_loader_states_to_load", None) or ()):
            # The loader was made (for ``estimated_stepping_batches``) before the loop states were restored, so
            # Lightning did not hand it its saved position: do it now and start the epoch's iterator again
            # (only for a position inside an epoch: every new iterator takes a seed from the global RNG).
            fit_loop._load_combined_loader_states()
            iter(fit_loop._data_fetcher)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handlers()
        self._unwrap_train_loader()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()
        self._unwrap_train_loader()

    def _requested(self, trainer: pl.Trainer) -> bool:
        requested = self.received is not None
        if trainer.world_size > 1:  # every rank stops at the same step
            requested = bool(trainer.strategy.reduce_boolean_decision(requested, all=False))
        return requested

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._stop_at is not None or not self._requested(trainer) or not _mid_epoch_stop_ok(trainer, batch_idx):
            return
        self._save(trainer)
        self._stop_at = "batch"  # stop once this step's metrics are logged, before the next batch trains

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._stop_at == "batch":
            self._stop(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stop_at is None and self._requested(trainer):
            self._save(trainer)
            self._stop_at = "epoch"

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stop_at == "epoch":
            self._stop(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the run finished: a stop checkpoint of it (saved just before the end, or one it resumed from) is stale
        path = os.path.join(self._dirpath(trainer), self.filename)
        if trainer.is_global_zero and os.path.isfile(path):
            os.remove(path)
        if self._stop_at is not None and self._verbose:
            print("training had reached its end when the stop request came: nothing to resume", flush=True)

    # -- saving and stopping ------------------------------------------------------------------------------
    def _dirpath(self, trainer: pl.Trainer) -> str:
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
        return str(dirpath) if dirpath else os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")

    def _save(self, trainer: pl.Trainer) -> None:
        self.path = os.path.join(self._dirpath(trainer), self.filename)
        trainer.save_checkpoint(self.path)

    def _stop(self, trainer: pl.Trainer) -> None:
        signum = self.received if self.received is not None else int(signal.SIGTERM)
        if self._verbose:
            print(self.message(trainer, signum), flush=True)
        raise TrainingInterrupted(128 + signum)

    def message(self, trainer: pl.Trainer, signum: int) -> str:
        """What is printed when the run stops: where the checkpoint is and how to resume."""
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        where = (f"epoch {trainer.current_epoch} (after {batches} of its batches)" if self._stop_at == "batch"
                 else f"the end of epoch {trainer.current_epoch - 1}")
        lines = [f"Stopped by {signal.Signals(signum).name} at step {trainer.global_step}, {where}; "
                 f"resumable checkpoint: {self.path}"]
        if self.resume_command:
            lines.append("Resume with: " + shlex.join([*self.resume_command, "--ckpt_path", str(self.path)]))
        else:
            lines.append(f"Resume with Trainer.fit(..., ckpt_path={str(self.path)!r})")
        loader = self._loader
        if loader is None and self._stop_at == "batch":
            lines.append("Note: the training data has no resumable position; the resumed epoch starts its data over.")
        elif loader is not None and self._stop_at == "batch" and replays_on_resume(loader.loader):
            lines.append(f"Note: resuming reads the {batches} batches already trained in this epoch again "
                         "(iterable data set or DataLoader workers), without training on them.")
        if loader is not None and loader.num_workers > 0:
            lines.append(f"Note: with DataLoader workers (num_workers={loader.num_workers}) the data order is exact, "
                         "but random augmentations computed in the workers may differ from an uninterrupted run.")
        return "\n".join(lines)


def _position(trainer: pl.Trainer) -> tuple[int, int]:
    """(epoch being iterated, batches trained in it)."""
    return (trainer.fit_loop.epoch_progress.current.processed,
            trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def _mid_epoch_stop_ok(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether the run can stop after this batch and resume as if it had not: an optimizer step just
    completed, the epoch has batches left, and no validation is due now."""
    loop = trainer.fit_loop.epoch_loop
    if loop.batch_progress.is_last_batch or batch_idx + 1 >= trainer.num_training_batches:
        return False
    if (batch_idx + 1) % trainer.accumulate_grad_batches:
        return False  # gradients of this accumulation window are not in any checkpoint
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return False  # training ends here anyway
    every = trainer.val_check_batch
    if every is not None and math.isfinite(every) and every > 0:
        if (batch_idx + 1) % int(every) == 0 or (loop.total_batch_idx + 1) % int(every) == 0:
            return False
    return True


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

    def __init__(self, path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.path = path
        self.written: Path | None = None

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
