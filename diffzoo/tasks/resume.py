"""Exact resume: checkpoints that carry the random-number states, so a resumed run continues as if it
had never stopped (same augmentations, same dropout masks, same data order), also from the middle of an
epoch, and a CSV logger that continues the metrics file of the run it resumes."""

from __future__ import annotations

import csv
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from torch.utils.data import IterableDataset


def rng_state() -> dict[str, Any]:
    """The torch (CPU and, once initialised, CUDA), numpy and Python global RNG states, as plain tensors
    and tuples so Lightning's ``weights_only`` checkpoint loading accepts them."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RestoresRNG:
    """LightningModule mixin: ``on_save_checkpoint`` stores the global RNG states (:func:`rng_state`) and
    ``on_load_checkpoint`` restores them. List it before ``LightningModule`` in the bases."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("rng_states")
        if states:
            set_rng_state(states)


def replays_on_resume(loader: Any) -> bool:
    """Whether resuming ``loader`` mid-epoch reads the already-trained batches again (an iterable data set,
    or DataLoader workers) instead of skipping their indices."""
    return (getattr(loader, "batch_sampler", None) is None or isinstance(getattr(loader, "dataset", None), IterableDataset)
            or getattr(loader, "num_workers", 0) > 0)


class ResumableLoader:
    """A training loader whose position inside an epoch is saved with a checkpoint, so a run resumed from a
    checkpoint taken in the middle of an epoch trains on exactly the batches the uninterrupted run would have.

    It remembers the global RNG states from just before the epoch's iterator was made and just before each
    batch was drawn. On resume it restores the first, skips the batches already trained, draws the next batch
    from the RNG state it was originally drawn with and then continues from the state saved in the checkpoint.
    A map-style data set read in the main process skips by sampler indices alone (nothing is loaded); an
    iterable data set or DataLoader workers read the skipped batches again. Random augmentations computed in
    worker processes then match only if the workers start afresh with the epoch (``persistent_workers=False``,
    or the first epoch), as after any resume with workers.

    Args:
        loader: the training DataLoader (or any re-iterable of batches).
        position: returns ``(epoch, batches trained in that epoch)``; called when an epoch's iterator is made
            and when a checkpoint is written.
    """

    _KEEP = 4  # RNG snapshots kept for the most recent batches (Lightning prefetches one)

    def __init__(self, loader: Any, position: Callable[[], tuple[int, int]]) -> None:
        self.loader = loader
        self.position = position
        self._epoch: int | None = None
        self._epoch_rng: dict[str, Any] | None = None
        self._before: dict[int, dict[str, Any]] = {}
        self._pending: dict[str, Any] | None = None

    # What Lightning and samplers look up on a DataLoader.
    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self.loader, "batch_sampler", None)

    @property
    def num_workers(self) -> int:
        return int(getattr(self.loader, "num_workers", 0))

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """The position of the epoch in progress (empty when no epoch is in progress)."""
        epoch, done = self.position()
        if self._epoch_rng is None or epoch != self._epoch:
            return {}
        return {"epoch": epoch, "batches": done, "epoch_rng": self._epoch_rng,
                "next_rng": self._before.get(done), "rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at the saved position the next time the same epoch is iterated."""
        self._pending = dict(state_dict) if state_dict else None

    def __iter__(self) -> Iterator[Any]:
        # Nothing happens before the first batch is asked for: Lightning also calls ``iter`` only to check
        # that the loader is iterable, and each DataLoader iterator takes a seed from the global RNG.
        yield from self._iterate()

    def _iterate(self) -> Iterator[Any]:
        epoch, _ = self.position()
        pending, self._pending = self._pending, None
        if pending is not None and pending["epoch"] != epoch:
            pending = None  # saved at the end of its epoch: the next one starts from its beginning
        if pending is not None:
            set_rng_state(pending["epoch_rng"])  # samplers and worker seeds drawn as originally
            # Epoch hooks set these only after the resumed iterator is made (or not at all mid-epoch).
            iterable = self.dataset if isinstance(self.dataset, IterableDataset) else None
            for obj in {id(o): o for o in (self.sampler, getattr(self.batch_sampler, "sampler", None), iterable)}.values():
                if callable(getattr(obj, "set_epoch", None)):
                    obj.set_epoch(epoch)
        self._epoch, self._epoch_rng, self._before = epoch, rng_state(), {}
        skip = pending["batches"] if pending is not None else 0
        it = iter(self.loader)
        if skip and not replays_on_resume(self.loader) and hasattr(it, "_sampler_iter"):
            for _ in range(skip):  # consume the batches' indices without loading them
                if next(it._sampler_iter, None) is None:
                    break
            skipped = skip
        else:
            skipped = 0
        return self._batches(it, skipped, skip, pending)

    def _batches(self, it: Iterator[Any], index: int, skip: int, pending: dict[str, Any] | None) -> Iterator[Any]:
        while True:
            drawn_ahead = False
            if pending is not None and index == skip:
                # Drawn before the checkpoint (the loader was read ahead): repeat that draw, then go on from the
                # checkpoint's RNG state. Drawn after it: draw it from the checkpoint's state.
                drawn_ahead = pending.get("next_rng") is not None
                set_rng_state(pending["next_rng"] if drawn_ahead else pending["rng"])
            self._before[index] = rng_state()
            self._before.pop(index - self._KEEP, None)
            try:
                batch = next(it)
            except StopIteration:
                return
            if index < skip:  # read again only to advance the iterator
                index += 1
                continue
            if pending is not None:
                if drawn_ahead:
                    set_rng_state(pending["rng"])
                pending = None
            yield batch
            index += 1


class _AppendingWriter(ExperimentWriter):
    """Keeps an existing ``metrics.csv`` and its columns; new rows are appended."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = list(csv.DictReader(f).fieldnames or [])


class AppendingCSVLogger(CSVLogger):
    """A :class:`~lightning.pytorch.loggers.CSVLogger` that continues an existing ``metrics.csv`` (rows and
    columns kept) instead of deleting it, so a resumed run keeps its whole metrics history in one file."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
