"""Ctrl-C / SIGTERM: a resumable checkpoint at a point the uninterrupted run passes through, and the command
that resumes it."""

from __future__ import annotations

import functools
import math
import os
import shlex
import signal
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from ..resume import ResumableLoader, replays_on_resume


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
