"""Checkpoints: read safely when a run resumes, and written as the best one plus an up-to-date ``last.ckpt``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ...weights.io import CheckpointReadError, load_torch_file


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` reading checkpoints with ``torch.load(weights_only=True)`` only.

    ``weights_only=False`` requests are not honoured: diffzoo's checkpoints hold tensors and plain values,
    and a file that needs more is refused (:mod:`diffzoo.weights.io`) instead of being unpickled.
    """

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        ckpt = load_torch_file(path, map_location=map_location or "cpu", what="--ckpt_path")
        if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
            raise CheckpointReadError(f"--ckpt_path {path} is not a Lightning checkpoint (no 'state_dict'); pass a "
                                      ".ckpt written during training (checkpoints/last.ckpt)")
        return ckpt


class SafeCheckpointReading(pl.Callback):
    """Reads the checkpoint a run resumes from safely: Lightning's default checkpoint reader is replaced by
    :class:`SafeCheckpointIO` before it restores ``ckpt_path``. A checkpoint holding pickled objects other
    than tensors and plain values, a remote, an empty or a non-checkpoint file is refused with a one-line
    error, and nothing from it runs. (A custom ``CheckpointIO`` plugin given to the Trainer is left in place.)

    The diffzoo tasks attach it themselves (:class:`~diffzoo.tasks.callbacks.guard.GuardedTraining`).
    """

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = SafeCheckpointIO()


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
