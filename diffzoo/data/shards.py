"""Image-classification webdataset shards (``.tar`` files of ``<key>.jpg`` + ``<key>.cls``).

Shards are split by node (rank) and by DataLoader worker; every rank yields the same number of samples
per epoch (shards are cycled if needed), so DDP never waits on a rank that ran out. A corrupt shard or an
undecodable sample is logged, counted in :attr:`ShardImageDataset.num_bad`, and skipped.
"""

from __future__ import annotations

import io
import logging
import multiprocessing as mp
import os
import random
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

log = logging.getLogger("diffzoo.data")

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")


def expand_urls(urls: Union[str, Sequence[str]]) -> list[str]:
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
        urls: Union[str, Sequence[str]],
        transform: Optional[Callable] = None,
        samples_per_epoch: Optional[int] = None,
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
        self._num_bad = mp.Value("i", 0)

    @property
    def num_bad(self) -> int:
        """Corrupt shards and undecodable samples met so far."""
        return int(self._num_bad.value)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.samples_per_epoch is None:
            raise TypeError("a single-pass shard data set has no length")
        rank, world = _rank_world()
        return self.samples_per_epoch // world

    def _handler(self, exn: Exception) -> bool:
        with self._num_bad.get_lock():
            self._num_bad.value += 1
        log.warning("skipping corrupt shard data: %s", exn)
        return True  # continue with the next sample / shard

    def _target(self, sample: dict) -> Any:
        """The sample's target: its ``cls`` as an int (subclasses read other fields)."""
        if "cls" not in sample:
            raise ValueError("no cls")
        raw = sample["cls"]
        return int(raw.decode().strip()) if isinstance(raw, bytes) else int(raw)

    def _decode(self, sample: dict) -> Optional[tuple]:
        """``(transform(image), target)``, or None (logged and counted) for an undecodable sample."""
        key = next((k for k in IMAGE_KEYS if k in sample), None)
        try:
            if key is None:
                raise ValueError(f"no image ({'/'.join(IMAGE_KEYS)})")
            target = self._target(sample)
            with Image.open(io.BytesIO(sample[key])) as img:
                img.load()
                img = img.convert(self.mode)
        except Exception as e:  # noqa: BLE001 - any undecodable sample is skipped and counted
            self._handler(ValueError(f"{sample.get('__url__', '?')}: sample {sample.get('__key__')}: {e}"))
            return None
        return (self.transform(img) if self.transform is not None else img), target

    def _pass(self, shards: list[str]) -> Iterator[tuple]:
        import webdataset as wds

        for sample in wds.tarfile_samples([{"url": u} for u in shards], handler=self._handler):
            item = self._decode(sample)
            if item is not None:
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
            got = 0
            for item in self._pass(shards):
                got += 1
                yield item
            if got == 0:
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
