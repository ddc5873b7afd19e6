"""Skipping unusable samples: each one counted once, substituted in training, left out of evaluation.

A map-style data set built on :class:`SkipsBadItems` reads an item in two stages: :meth:`~SkipsBadItems.read`
(decoding; a failure marks the source unusable, so it is never read again) and
:meth:`~SkipsBadItems.finish` (the transform; a failure skips this one read only, since random augmentation
may succeed next time). Each failed item is logged and counted once, whatever the number of reads, and the
marks live in shared memory so that every DataLoader worker sees and updates the same ones.

What a skipped item becomes depends on ``substitute``:

* ``True`` (training): the next usable item takes its place, so batches stay full;
* ``False`` (evaluation): ``__getitem__`` returns None and :class:`EvalDataLoader` leaves it out, so no
  sample is scored twice and the number evaluated is the number of usable samples.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, default_collate

log = logging.getLogger("diffzoo.data")

# Give up after this many unusable items in a row: the data is broken, not a few files.
MAX_CONSECUTIVE_BAD = 64

# States of an item in SkipsBadItems' shared marks; a larger value wins.
_OK, _FAILED, _UNREADABLE = 0, 1, 2


class SkipsBadItems(Dataset):
    """A map-style data set that skips unusable items and counts each of them once, across workers.

    Subclasses implement :meth:`read`, and may override :meth:`finish` and :meth:`describe`, then call
    :meth:`init_skipping` once their length is known.

    Class attributes:
        read_errors: exceptions of :meth:`read` that mark an item unusable (others propagate).
        bad_noun: how the error for a run of unusable items names them (``"unreadable images"``).
    """

    read_errors: tuple[type[BaseException], ...] = (OSError, ValueError)
    bad_noun = "unusable items"

    def init_skipping(self, size: int, substitute: bool) -> None:
        """Allocate the shared marks of ``size`` items; ``substitute`` as in the module docstring."""
        self.substitute = substitute
        self._marks = mp.RawArray(ctypes.c_uint8, max(int(size), 1))  # shared with DataLoader workers
        self._streak = 0  # unusable items in a row met by this process (evaluation)

    @property
    def num_bad(self) -> int:
        """Distinct items skipped so far (unreadable, or failed in the transform), each counted once."""
        return int(np.count_nonzero(np.frombuffer(self._marks, dtype=np.uint8)))

    def read(self, index: int) -> Any:
        """Load item ``index`` (raises one of :attr:`read_errors` for an unusable source)."""
        raise NotImplementedError

    def finish(self, index: int, raw: Any) -> Any:
        """Turn what :meth:`read` returned into the item (transform, target); any exception skips it."""
        return raw

    def describe(self, index: int) -> str:
        """The item as the log names it."""
        return f"item {index}"

    def _mark(self, index: int, state: int, error: BaseException) -> None:
        if self._marks[index] == _OK:
            what = "unreadable" if state == _UNREADABLE else "transform failed on"
            log.warning("skipping %s %s: %s: %s", what, self.describe(index), type(error).__name__, error)
        self._marks[index] = max(self._marks[index], state)

    def __getitem__(self, index: int) -> Any:
        tries = MAX_CONSECUTIVE_BAD if self.substitute else 1
        error: BaseException | None = None
        for attempt in range(tries):
            i = (index + attempt) % len(self)
            if self._marks[i] == _UNREADABLE:  # found unreadable before: not read again
                continue
            try:
                raw = self.read(i)
            except self.read_errors as e:
                self._mark(i, _UNREADABLE, e)
                error = e
                continue
            try:
                item = self.finish(i, raw)
            except Exception as e:  # noqa: BLE001 - a transform failing on one sample must not end a run
                self._mark(i, _FAILED, e)
                error = e
                continue
            self._streak = 0
            return item
        self._streak += 1
        if not self.substitute and self._streak < MAX_CONSECUTIVE_BAD:
            return None
        last = f" (last error: {type(error).__name__}: {error})" if error is not None else ""
        raise RuntimeError(
            f"{MAX_CONSECUTIVE_BAD} {self.bad_noun} in a row from {self.describe(index)}{last}; "
            "the data set looks corrupt"
        )


class SkipNone:
    """Collate function that drops None items (skipped samples); a batch with nothing left becomes None."""

    def __init__(self, collate: Callable[[list], Any] | None = None) -> None:
        self.collate = collate if collate is not None else default_collate

    def __call__(self, batch: list) -> Any:
        kept = [item for item in batch if item is not None]
        return self.collate(kept) if kept else None


class EvalDataLoader(DataLoader):
    """A DataLoader for evaluation over a data set built with ``substitute=False``.

    Skipped samples (None) are left out of their batch and a batch made only of skipped samples is not
    yielded at all, so every sample is scored at most once. ``len()`` is an upper bound.
    """

    def __init__(self, dataset: Dataset, *args: Any, collate_fn: Callable[[list], Any] | None = None, **kwargs: Any) -> None:
        if not isinstance(collate_fn, SkipNone):
            collate_fn = SkipNone(collate_fn)
        super().__init__(dataset, *args, collate_fn=collate_fn, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        for batch in super().__iter__():
            if batch is not None:
                yield batch
