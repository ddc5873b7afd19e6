"""Image-classification webdataset shards (``.tar`` files of ``<key>.jpg`` + ``<key>.cls``).

Shards are split by node (rank) and by DataLoader worker; every rank yields the same number of samples
per epoch (shards are cycled if needed), so DDP never waits on a rank that ran out. A corrupt shard, an
undecodable sample or a sample the transform fails on is logged and skipped, and counted once in
:attr:`ShardImageDataset.num_bad` however often the shard is read again; a shard found corrupt is not read
again by any DataLoader worker.
"""

from __future__ import annotations

import ctypes
import io
import logging
import multiprocessing as mp
import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

log = logging.getLogger("diffzoo.data")

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """Expand brace patterns (``train-{000..099}.tar``) and ``::``-separated lists into shard paths.

    Local shards must exist: a missing file raises ``FileNotFoundError`` before training starts.
    """
    import braceexpand

    items = [urls] if isinstance(urls, str) else list(urls)
    out = [u for item in items for part in str(item).split("::") for u in braceexpand.braceexpand(part)]
    if not out:
        raise ValueError("no shards given")
    missing = [u for u in out if "://" not in u and not u.startswith("pipe:") and not os.path.isfile(u)]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(out)} shard(s) not found, e.g. {missing[0]}")
    return out


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardImageDataset(IterableDataset):
    """Samples ``(transform(image), label)`` from webdataset shards, split by node and worker.

    Args:
        urls: shard paths or a brace pattern.
        transform: applied to the PIL image.
        samples_per_epoch: total samples of one epoch over all ranks; None for one pass over the shards
            (validation: each rank reads its shards once, no cycling).
        shuffle: shuffle shard order (seeded by ``seed`` and the epoch) and samples (a buffer).
        shuffle_buffer: size of the sample shuffle buffer.
        seed: base seed; call :meth:`set_epoch` each epoch to vary the order reproducibly.
        mode: PIL mode of the decoded images.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        transform: Callable | None = None,
        samples_per_epoch: int | None = None,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        mode: str = "RGB",
    ) -> None:
        super().__init__()
        self.urls = expand_urls(urls)
        self.transform = transform
        self.samples_per_epoch = samples_per_epoch
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.mode = mode
        self.epoch = 0
        self._shard_index = {u: i for i, u in enumerate(self.urls)}
        # Shared with the DataLoader workers: which shards are corrupt, and per shard the most unusable
        # samples met in one pass (a pass reads a shard in its fixed order, so this counts each once).
        self._corrupt = mp.RawArray(ctypes.c_uint8, len(self.urls))
        self._bad_samples = mp.Array(ctypes.c_int32, len(self.urls))

    @property
    def num_bad(self) -> int:
        """Corrupt shards plus unusable samples met so far, each counted once."""
        corrupt = int(np.count_nonzero(np.frombuffer(self._corrupt, dtype=np.uint8)))
        return corrupt + int(np.frombuffer(self._bad_samples.get_obj(), dtype=np.int32).sum())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.samples_per_epoch is None:
            raise TypeError("a single-pass shard data set has no length")
        rank, world = _rank_world()
        return self.samples_per_epoch // world

    def _shard_failed(self, shard: int, exn: Exception) -> None:
        """Mark ``shard`` corrupt (logged the first time): no pass reads it again."""
        if not self._corrupt[shard]:
            self._corrupt[shard] = 1
            log.warning("skipping corrupt shard %s: %s: %s", self.urls[shard], type(exn).__name__, exn)

    def _sample_failed(self, shard: int, nth: int, sample: dict, exn: Exception) -> None:
        """The ``nth`` unusable sample of this pass over ``shard``: counted and logged unless met before."""
        with self._bad_samples.get_lock():
            new = nth > self._bad_samples[shard]
            if new:
                self._bad_samples[shard] = nth
        if new:
            log.warning(
                "skipping sample %s of shard %s: %s: %s",
                sample.get("__key__"), self.urls[shard], type(exn).__name__, exn,
            )

    def _target(self, sample: dict) -> Any:
        """The sample's target: its ``cls`` as an int (subclasses read other fields)."""
        if "cls" not in sample:
            raise ValueError("no cls")
        raw = sample["cls"]
        return int(raw.decode().strip()) if isinstance(raw, bytes) else int(raw)

    def _decode(self, sample: dict) -> tuple:
        """``(transform(image), target)``; raises for an undecodable sample or a failing transform."""
        key = next((k for k in IMAGE_KEYS if k in sample), None)
        if key is None:
            raise ValueError(f"no image ({'/'.join(IMAGE_KEYS)})")
        target = self._target(sample)
        with Image.open(io.BytesIO(sample[key])) as img:
            img.load()
            img = img.convert(self.mode)
        return (self.transform(img) if self.transform is not None else img), target

    def _pass(self, shards: list[str]) -> Iterator[tuple]:
        """One pass over ``shards`` in order, skipping the shards known to be corrupt."""
        import webdataset as wds

        for url in shards:
            shard = self._shard_index[url]
            if self._corrupt[shard]:
                continue

            def failed(exn: Exception, shard: int = shard) -> bool:
                self._shard_failed(shard, exn)
                return True  # go on with what can still be read of this pass

            nth_bad = 0
            for sample in wds.tarfile_samples([{"url": url}], handler=failed):
                try:
                    item = self._decode(sample)
                except Exception as e:  # noqa: BLE001 - one unusable sample must not end a run
                    if self._corrupt[shard]:  # the fragment a broken tar leaves: part of the shard's failure
                        continue
                    nth_bad += 1
                    self._sample_failed(shard, nth_bad, sample, e)
                    continue
                yield item

    def __iter__(self) -> Iterator[tuple]:
        rank, world = _rank_world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rng = random.Random(hash((self.seed, self.epoch, rank, worker)))
        if self.samples_per_epoch is None:  # validation: one pass over this rank's and worker's shards
            import webdataset as wds

            yield from self._pass(list(wds.split_by_worker(wds.split_by_node(self.urls))))
            return
        quota = self.samples_per_epoch // world // workers + (worker < (self.samples_per_epoch // world) % workers)
        stream = self._cycle(rank * workers + worker, world * workers)
        if self.shuffle and self.shuffle_buffer > 1:
            stream = _shuffled(stream, self.shuffle_buffer, rng)
        for produced, item in enumerate(stream):
            if produced >= quota:
                return
            yield item

    def _cycle(self, slot: int, n_slots: int) -> Iterator[tuple]:
        """This slot's shards, reshuffled on every pass, endlessly.

        Not ``wds.split_by_node`` / ``split_by_worker``: those slice one fixed list once, while training
        needs a new seeded order every pass, and shards shared between slots when there are fewer shards
        than ranks x workers (where the webdataset splitters would leave some slots with nothing)."""
        round_ = 0
        while True:
            order = list(self.urls)
            if self.shuffle:
                random.Random(hash((self.seed, self.epoch, round_))).shuffle(order)
            # Disjoint slices per (rank, worker) when there are enough shards; else shards are shared.
            shards = order[slot::n_slots] if len(order) >= n_slots else [order[slot % len(order)]]
            known_corrupt = [u for u in shards if self._corrupt[self._shard_index[u]]]
            got = 0
            for item in self._pass(shards):
                got += 1
                yield item
            if np.frombuffer(self._corrupt, dtype=np.uint8).all():
                raise RuntimeError(
                    f"no readable sample: all {len(self.urls)} shard(s) are corrupt (e.g. {self.urls[0]}); "
                    "check the shard files (see the log for each error)"
                )
            newly_corrupt = any(self._corrupt[self._shard_index[u]] for u in shards if u not in known_corrupt)
            if got == 0 and len(known_corrupt) < len(shards) and not newly_corrupt:
                raise RuntimeError(f"no readable sample in shard(s) {', '.join(shards)}")
            round_ += 1


def _shuffled(items: Iterator[tuple], size: int, rng: random.Random) -> Iterator[tuple]:
    """Approximate shuffle through a buffer of ``size`` items."""
    buffer: list[tuple] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        item, buffer[j] = buffer[j], item
        yield item
    rng.shuffle(buffer)
    yield from buffer
