"""``predictions.csv``: what ``predict_step`` returns, one row per sample."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter


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
