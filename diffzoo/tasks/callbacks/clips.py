"""``test_clips.csv``: every test clip's prediction with what the clip is (its voice, its SNR)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

TEST_CLIPS_FILE = "test_clips.csv"
TEST_CLIPS_COLUMNS = ("index", "voice", "snr_db", "label", "pred", "correct")


class TestClipsCSV(pl.Callback):
    """At the end of a test epoch, write ``<run folder>/test_clips.csv``: one row per scored test clip with
    the columns :data:`TEST_CLIPS_COLUMNS`: ``index`` (the clip's index in the test data set), ``voice`` and
    ``snr_db`` (from the data set's ``clip_info(index)``; empty when the clip has none, e.g. silence), ``label``,
    ``pred`` (class indices) and ``correct`` (1 or 0).

    It needs a task whose ``test_step`` returns ``{"prediction", "label"}`` per batch (the speech task does;
    for other tasks nothing is written) and a test data set with ``clip_info``. Rows are matched to clips by
    the order of the test loader's sampler, so nothing is written (and a warning says why) when the data set
    skipped unusable clips or the test ran on several processes; ``--trainer.limit_test_batches`` gives the
    first clips only.

    Args:
        path: file to write instead of the run folder's ``test_clips.csv``.
    """

    __test__ = False  # not a pytest test class despite its name

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.written: Path | None = None
        self._preds: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._preds, self._labels = [], []

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        if isinstance(outputs, dict) and "prediction" in outputs and "label" in outputs and dataloader_idx == 0:
            self._preds.append(outputs["prediction"].detach().cpu().reshape(-1))
            self._labels.append(outputs["label"].detach().cpu().reshape(-1))

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._preds:
            return
        loaders = trainer.test_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        dataset = getattr(loader, "dataset", None)
        why = None
        if trainer.world_size > 1:
            why = "the test ran on several processes"
        elif dataset is None or not hasattr(dataset, "clip_info"):
            why = "the test data set does not describe its clips (no clip_info)"
        elif int(getattr(dataset, "num_bad", 0) or 0):
            why = "the test data set skipped unusable clips, so rows cannot be matched to clips"
        if why:
            rank_zero_warn(f"{TEST_CLIPS_FILE} not written: {why}")
            return
        preds, labels = torch.cat(self._preds).tolist(), torch.cat(self._labels).tolist()
        order = list(iter(loader.sampler)) if getattr(loader, "sampler", None) is not None else range(len(dataset))
        indices = [int(i) for i in order][: len(preds)]
        known = getattr(dataset, "labels", None)  # the synthesised set's labels, to check the matching
        if len(indices) != len(preds) or (known is not None and any(known[i] != y for i, y in zip(indices, labels))):
            rank_zero_warn(f"{TEST_CLIPS_FILE} not written: the {len(preds)} predictions do not match the test "
                           "loader's clips")
            return
        path = Path(self.path) if self.path else Path(trainer.log_dir or trainer.default_root_dir) / TEST_CLIPS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(TEST_CLIPS_COLUMNS)
            for i, pred, label in zip(indices, preds, labels):
                info = dataset.clip_info(i)
                snr = info.get("snr_db")
                writer.writerow([i, info.get("voice") or "", "" if snr is None else f"{snr:.4f}", int(label),
                                 int(pred), int(pred == label)])
        self.written = path
        print(f"test clips: {path} ({len(preds)} rows; columns: {', '.join(TEST_CLIPS_COLUMNS)})", flush=True)
